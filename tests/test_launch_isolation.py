"""A launched job shares nothing with the Lifeboat process that started it: it runs as the
Unix user the deployment names for its project (LAUNCH_RUN_AS), so /proc of the worker,
the worker's var/, another project's checkpoints and the worker's own files are closed
to it; without such a user a local launch is refused, unless the deployment says it is
one person on one machine (LAUNCH_LOCAL_SAME_USER). A real job tries each door and
reports what it got; the same job as the worker's own user gets through, which is what
this boundary is for. A restore test's checks of the project's own code hold the same
boundary."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.launch import verified_checkpoint
from webapp.domain.models import LaunchProfile, Resume
from webapp.domain.recovery import resume as resumes
from workers.launch import follow_resume, launch_resume

pytestmark = pytest.mark.django_db(transaction=True)

JOB_USER = "lifeboat-testjob"

# Each door: a name, and a command whose success means the door was open.
PROBE = r"""
echo "uid=$(id -un)"
try() { if eval "$2" >/dev/null 2>&1; then echo "$1=open"; else echo "$1=closed"; fi; }
try proc-environ 'cat /proc/$WORKER_PID/environ'
try proc-fds 'ls /proc/$WORKER_PID/fd'
try var-list 'ls $WORKER_VAR'
try var-settings 'cat $WORKER_VAR/lifeboat.env'
try other-project 'cat $OTHER_CHECKPOINT/model.pt'
try other-launch 'cat $WORKER_VAR/launch/resume-0/output.log'
"""


@pytest.fixture(scope="module")
def job_user():
    """A Unix user for jobs, made here when the tests run as root (CI does)."""
    if os.geteuid() != 0:
        pytest.fail("these tests switch users: run them as root (CI does)")
    try:
        pwd.getpwnam(JOB_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", JOB_USER],
            check=True,
        )
    return pwd.getpwnam(JOB_USER)


@pytest.fixture
def doors(tmp_path, settings, monkeypatch):
    """What the worker holds: a secret in its environment, its var/ (made as `make run`
    leaves it: the folder 0755, the settings file 0600), another resume's output, and
    another project's checkpoint folder."""
    monkeypatch.setenv("SECRET_KEY", "worker-secret-key-do-not-leak")
    var = Path(tempfile.mkdtemp(prefix="lifeboat-var-"))
    var.chmod(0o755)
    (var / "lifeboat.env").write_text("SECRET_KEY=worker-secret-key-do-not-leak\n")
    (var / "lifeboat.env").chmod(0o600)
    (var / "launch" / "resume-0").mkdir(parents=True)
    (var / "launch" / "resume-0" / "output.log").write_text("another job's output\n")
    other = Path(tempfile.mkdtemp(prefix="lifeboat-other-project-"))
    (other / "model.pt").write_bytes(b"someone else's weights")
    settings.VAR_DIR = var
    yield {"var": var, "other": other}
    shutil.rmtree(var, ignore_errors=True)
    shutil.rmtree(other, ignore_errors=True)


def launch_probe(project, doors, owner) -> dict[str, str]:
    """Resume a checkpoint with a profile whose job tries every door; the job's report."""
    work = Path(tempfile.mkdtemp(prefix="lifeboat-job-"))
    os.chown(work, owner.pw_uid, owner.pw_gid)
    checkpoint = verified_checkpoint(project, "probe", work / "ckpt")
    project.allowed_roots = [str(work / "ckpt")]
    project.save()
    (work / "probe.sh").write_text(PROBE)
    os.chmod(work / "probe.sh", 0o755)  # noqa: S103 (the job's own script, readable by it)
    profile = LaunchProfile.objects.create(
        project=project, name=f"probe-{time.monotonic_ns()}", kind="local",
        command_template=f"bash {work / 'probe.sh'}",
        options={"workdir": str(work), "env": {
            "WORKER_PID": str(os.getpid()), "WORKER_VAR": str(doors["var"]),
            "OTHER_CHECKPOINT": str(doors["other"]),
        }},
    )  # fmt: skip
    resume = resumes.request(checkpoint, profile, actor="test")
    launch_resume(resume.pk)
    deadline = time.monotonic() + 60
    while Resume.objects.get(pk=resume.pk).status not in resumes.FINAL:
        assert time.monotonic() < deadline, Resume.objects.get(pk=resume.pk).error
        follow_resume(resume.pk)
        time.sleep(0.2)
    done = Resume.objects.get(pk=resume.pk)
    assert done.status == "succeeded", (done.error, done.output)
    shutil.rmtree(work, ignore_errors=True)
    return dict(line.split("=", 1) for line in done.output.splitlines() if "=" in line)


def test_a_job_run_as_the_projects_user_reaches_nothing_of_the_worker(
    project, doors, job_user, settings
):
    settings.LAUNCH_RUN_AS = [f"{project.slug}={JOB_USER}"]
    settings.LAUNCH_LOCAL_SAME_USER = False
    report = launch_probe(project, doors, job_user)
    assert report.pop("uid") == JOB_USER
    assert report == {
        "proc-environ": "closed",
        "proc-fds": "closed",
        "var-list": "closed",
        "var-settings": "closed",
        "other-project": "closed",
        "other-launch": "closed",
    }


def test_the_same_job_as_the_workers_own_user_gets_through(project, doors, settings):
    """What the boundary is for: the probe is not blind."""
    settings.LAUNCH_RUN_AS = []
    settings.LAUNCH_LOCAL_SAME_USER = True
    report = launch_probe(project, doors, pwd.getpwuid(os.geteuid()))
    assert report["uid"] == pwd.getpwuid(os.geteuid()).pw_name
    assert report["proc-environ"] == report["var-settings"] == report["other-project"] == "open"


def test_without_a_job_user_a_local_launch_is_refused_and_says_what_to_set(
    project, tmp_path, settings
):
    settings.LAUNCH_RUN_AS = []
    settings.LAUNCH_LOCAL_SAME_USER = False
    settings.VAR_DIR = tmp_path / "var"
    checkpoint = verified_checkpoint(project, "refused", tmp_path / "ckpt")
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.save()
    profile = LaunchProfile.objects.create(
        project=project, name="p", kind="local", command_template="touch ran",
        options={"workdir": str(tmp_path)},
    )  # fmt: skip
    resume = resumes.request(checkpoint, profile, actor="test")
    assert launch_resume(resume.pk) == "failed"
    resume.refresh_from_db()
    assert "set LAUNCH_RUN_AS" in resume.error
    assert not (tmp_path / "ran").exists()


def test_a_job_user_that_is_root_or_missing_is_refused(project, settings):
    from webapp.domain.launch import run_as

    settings.LAUNCH_RUN_AS = ["*=root"]
    with pytest.raises(run_as.RunAsRefused, match="may not name root"):
        run_as.for_project(project.slug)
    settings.LAUNCH_RUN_AS = ["*=no-such-user-here"]
    with pytest.raises(run_as.RunAsRefused, match="not on this host"):
        run_as.for_project(project.slug)


@pytest.fixture
def digits_probed(request, project):
    checkpoint = request.getfixturevalue("digits")  # trained for real: tests/test_restore_levels
    project.restore_checks = {"forward": "tests.support.restore_probe:forward"}
    project.save()
    return checkpoint


def test_a_restore_check_of_the_projects_code_runs_as_its_job_user(
    digits_probed, project, s3, job_user, settings, queues
):
    from tests.support.restore_levels import restore, verified_with_replica

    settings.LAUNCH_RUN_AS = [f"*={JOB_USER}"]
    settings.LAUNCH_LOCAL_SAME_USER = False
    checkpoint = verified_with_replica(digits_probed, project, s3)
    outcome, validation = restore(checkpoint)
    assert outcome == "passed", validation.message
    assert "Forward: loads strictly into the model" in validation.message

    # The same check as the worker's own user reads the worker's environment.
    settings.LAUNCH_RUN_AS = []
    settings.LAUNCH_LOCAL_SAME_USER = True
    outcome, validation = restore(checkpoint)
    assert outcome == "failed"
    assert "could read the restore worker's environment" in validation.message

    # And with neither, the check does not run: the test says why, the checkpoint is
    # not blamed.
    settings.LAUNCH_LOCAL_SAME_USER = False
    outcome, validation = restore(checkpoint)
    assert validation.status == "error"
    assert "set LAUNCH_RUN_AS" in validation.message
