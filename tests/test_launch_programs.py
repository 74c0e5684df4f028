"""The programs a launch worker runs are the deployment's: Slurm's commands are found on
the worker's own PATH and run with a minimal environment of the worker's, the job's
variables reach the job only (on a pipe, never in sbatch's arguments), and a profile may
not set what chooses or changes a program (PATH, LD_*, PYTHON*, BASH_ENV, ...): refused
when it is saved, and at launch for a profile saved before. Real Slurm."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from tests.support.launch import verified_checkpoint
from webapp.dashboard.settings_views import LaunchProfileForm
from webapp.domain.launch import slurm
from webapp.domain.models import LaunchProfile
from webapp.domain.recovery import resume as resumes
from workers.launch import launch_resume

pytestmark = pytest.mark.django_db(transaction=True)


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize(
    "line", ["PATH=/opt/mine:/usr/bin", "LD_PRELOAD=/tmp/x.so", "PYTHONPATH=/tmp", "BASH_ENV=/x"]
)
def test_a_profile_may_not_set_what_chooses_or_loads_programs(project, line):
    form = LaunchProfileForm(
        {"name": "p", "kind": "slurm", "command_template": "true", "env": f"OK=1\n{line}"},
        instance=LaunchProfile(project=project),
    )
    assert not form.is_valid()
    assert "changes which program runs or how programs load" in str(form.errors["env"])
    name = line.split("=", 1)[0]
    profile = LaunchProfile(
        project=project, name="q", kind="slurm", command_template="true",
        options={"env": {name: "x"}},
    )  # fmt: skip
    with pytest.raises(ValidationError, match="how programs load"):
        profile.full_clean()


@pytest.mark.usefixtures("slurm_cluster")
def test_an_old_profile_with_its_own_path_runs_no_program_of_its_choosing(
    project,
    tmp_path,
    settings,
):
    settings.VAR_DIR = tmp_path / "var"
    marker = tmp_path / "the-admins-sbatch-ran"
    executable(tmp_path / "evil" / "sbatch", f"#!/bin/bash\ntouch {marker}\necho 1\n")
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.save()
    checkpoint = verified_checkpoint(project, "job", tmp_path / "ckpt" / "job")
    profile = LaunchProfile.objects.create(  # saved before the rule: no clean()
        project=project, name="old", kind="slurm", command_template="true",
        options={"workdir": str(tmp_path), "env": {"PATH": f"{tmp_path / 'evil'}:/usr/bin"}},
    )  # fmt: skip
    resume = resumes.request(checkpoint, profile, actor="test")
    assert launch_resume(resume.pk) == "failed"
    resume.refresh_from_db()
    assert "PATH changes which program runs" in resume.error
    assert not marker.exists()


@pytest.mark.usefixtures("slurm_cluster")
def test_sbatch_is_the_workers_own_and_gets_no_secret_and_the_job_gets_its_values_exactly(
    tmp_path,
    monkeypatch,
):
    # The worker's own PATH leads to a wrapper that notes its environment and arguments,
    # then runs the real sbatch: the program is chosen by the deployment's PATH.
    real = slurm.program("sbatch")
    record = tmp_path / "sbatch-saw"
    wrapper = executable(
        tmp_path / "bin" / "sbatch",
        f'#!/bin/bash\n{{ env; echo ARGS: "$@"; }} > {record}\nexec {real} "$@"\n',
    )
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("SECRET_KEY", "worker-secret-do-not-pass")
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", "s3-secret-do-not-pass")
    value = 'a,b "c" d\nsecond line'
    out = tmp_path / "job.env"
    job_id = slurm.submit(
        f"#!/bin/bash\nprintf '%s' \"$ODD\" > {out}\n",
        job_name="programs", output_path=str(tmp_path / "o.log"), workdir=str(tmp_path),
        env={"ODD": value, "LIFEBOAT_TOKEN": "lb_job_token_value"},
    )  # fmt: skip
    assert slurm.wait(job_id, timeout=60).state == "COMPLETED"
    deadline = time.monotonic() + 10
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert out.read_text() == value
    saw = record.read_text()
    assert "worker-secret-do-not-pass" not in saw and "s3-secret-do-not-pass" not in saw
    # The job's values are in neither sbatch's environment nor its arguments.
    assert "lb_job_token_value" not in saw and "second line" not in saw
    assert "--export-file=" in saw
