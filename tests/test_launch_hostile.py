"""Launched jobs against hostile values (issue 18, items 3, 4 and 6): run keys and paths
full of shell syntax, in every placeholder and every position, never become code in a
real local process or a real Slurm job; templates that cannot be made safe are refused
when saved; a job's environment is built, not inherited, and its token can only ingest
and read its own project, until the resume ends; its output is redacted and shown to
operators only; automatic resumes are bounded per project."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.support.dashboard import as_user, make_checkpoint, make_run
from tests.support.events import event, saved
from tests.support.launch import verified_checkpoint
from tests.support.people import member
from webapp.domain.health import alerts
from webapp.domain.models import (
    ApiToken,
    Checkpoint,
    Event,
    LaunchProfile,
    Project,
    Resume,
    Run,
)
from webapp.domain.recovery import resume as resumes
from workers.launch import launch_resume

pytestmark = pytest.mark.django_db(transaction=True)

# Every placeholder, in every position: bare, in double quotes, concatenated, in an
# assignment. The job writes each argument NUL-terminated, so a newline in a value stays
# visible and a value split in two, or globbed, shows as the wrong list.
POSITIONS = (
    'printf \'%s\\0\' {{run_key}} "{{run_key}}" --x={{run_key}} "a {{run_key}} b" '
    'pre{{run_key}}post {{new_run_key}} {{checkpoint_path}} "{{checkpoint_dir}}" '
    "--s={{step}} {{checkpoint_id}} {{resume_id}} > args-{{resume_id}}.bin\n"
    'X={{run_key}}; printf \'%s\\0\' "$X" >> "args-{{resume_id}}.bin"\n'
)


def hostile_values(m: str) -> list[str]:
    """Run keys that try every way out; `m` is the marker file that no job may create
    (relative: the jobs run in the test's folder)."""
    return [
        f"x$(touch {m}-1)",
        f"x`touch {m}-2`y",
        f"q'\"; touch {m}-3; echo \"'",
        f"line\ntouch {m}-4\n",
        f"../.. && touch {m}-5 || touch {m}-6 & * ? [ab] {{a,b}} ~ $HOME ${{PATH}} \\ end",
    ]


def expected_args(resume, path: str, directory: str) -> list[str]:
    key = resume.run.key
    new_key = f"{key}-resume-{resume.pk}"[:200]
    return [
        key, key, f"--x={key}", f"a {key} b", f"pre{key}post", new_key, path, directory,
        f"--s={resume.checkpoint.step}", str(resume.checkpoint_id), str(resume.pk), key,
    ]  # fmt: skip


def follow_until_done(resume_id: int, timeout: float = 60) -> Resume:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resume = Resume.objects.select_related("checkpoint", "run", "profile", "project").get(
            pk=resume_id
        )
        if resume.status in ("succeeded", "failed", "cancelled"):
            return resume
        resumes.follow(resume)
        time.sleep(0.3)
    raise AssertionError(f"resume {resume_id} did not end: {resume.status}")


# --- 1. values never become code ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_hostile_values_in_every_placeholder_and_position_stay_data(
    kind, request, project, tmp_path, settings
):
    if kind == "slurm":
        request.getfixturevalue("slurm_cluster")
    settings.VAR_DIR = tmp_path / "var"
    marker = "pwned"
    (tmp_path / "a").write_text("a glob would find me")
    profile = LaunchProfile.objects.create(
        project=project, name="positions", kind=kind, command_template=POSITIONS,
        options={"workdir": str(tmp_path)},
    )  # fmt: skip
    started = []
    for index, value in enumerate(hostile_values(marker)):
        location = f"/data/{value}/dir $(touch {marker}-loc)"
        checkpoint = make_checkpoint(make_run(project, value), 100 + index)
        Checkpoint.objects.filter(pk=checkpoint.pk).update(location=location)
        checkpoint.refresh_from_db()
        resume = resumes.request(checkpoint, profile, actor="test")
        # Started directly: these paths are not on this machine (preparing would refuse).
        resume.status = "launching"
        resume.save()
        resumes.start(resume)
        started.append((resume, value, location))
    for resume, value, location in started:  # all at once: Slurm runs them side by side
        done = follow_until_done(resume.pk)
        assert not list(tmp_path.glob("pwned*")), value
        assert done.status == "succeeded", (done.error, done.output)
        args = (tmp_path / f"args-{resume.pk}.bin").read_bytes().decode().split("\0")[:-1]
        assert args == expected_args(done, location, location)
        assert value not in resume.command and "touch" not in resume.command
        assert done.token.revoked_at is not None


def test_a_run_key_reported_over_the_api_cannot_run_code_on_the_worker(
    api, token, project, tmp_path, settings
):
    """The repro of the issue: `x$(touch marker)` as a run key, a template with
    "{{run_key}}" inside double quotes, the whole path: ingest, request, prepare, launch."""
    settings.VAR_DIR = tmp_path / "var"
    marker = tmp_path / "marker"
    key = f"x$(touch {marker})"
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.save()
    checkpoint = verified_checkpoint(project, "placeholder", tmp_path / "ckpt" / "c")
    run = checkpoint.run
    Run.objects.filter(pk=run.pk).update(key=key)
    assert api.post_events(token, event("run.heartbeat", run=key, step=1)).status_code == 202
    LaunchProfile.objects.create(
        project=project, name="dq", kind="local",
        command_template='echo "resuming {{run_key}}" > said.txt',
        options={"workdir": str(tmp_path)},
    )  # fmt: skip
    answer = api.post(token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "dq"})
    assert answer.status_code == 202, answer.content
    launch_resume(answer.json()["id"])
    done = follow_until_done(answer.json()["id"])
    assert not marker.exists()
    assert done.status == "succeeded", (done.error, done.output)
    assert (tmp_path / "said.txt").read_text() == f"resuming {key}\n"
    assert answer.json()["command"] == 'echo "resuming ${LIFEBOAT_RUN_KEY}" > said.txt'


def test_the_settings_form_refuses_such_a_template_and_an_old_profile_does_not_launch(
    project, api, token
):
    admin = member(project, "ada", "admin")
    client = as_user(admin)
    response = client.post(
        "/p/alpha/settings/launch-profiles/",
        {"name": "quoted", "kind": "local", "command_template": "train --run '{{run_key}}'"},
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "{{run_key}} at line 1, column 14 is inside single quotes" in html
    assert "$LIFEBOAT_RUN_KEY" in html  # how to write it
    assert not LaunchProfile.objects.exists()
    ok = client.post(
        "/p/alpha/settings/launch-profiles/",
        {"name": "plain", "kind": "local", "command_template": "train --run {{run_key}}"},
    )
    assert ok.status_code == 302 and LaunchProfile.objects.filter(name="plain").exists()
    # A profile saved before the check (or straight into the database) is refused when
    # used, saying why, and marked on the settings page.
    LaunchProfile.objects.create(
        project=project, name="old", kind="local", command_template='bash -c "t {{run_key}}"'
    )
    assert (
        "Refused, it will not launch until rewritten"
        in client.get("/p/alpha/settings/launch-profiles/").content.decode()
    )
    assert api.post_events(token, saved(run="r", step=1)).status_code == 202
    checkpoint = Checkpoint.objects.get()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    answer = api.post(token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "old"})
    assert answer.status_code == 409
    assert (
        "launch profile old cannot be used until an admin rewrites its command"
        in (answer.json()["error"])
    )
    assert not Resume.objects.exists()


# --- 2. a clean environment, a token of its own -------------------------------------------


# Left as they are in the worker: what sbatch and the test process themselves need.
BASE = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ"}  # LAUNCH_BASE_ENV
KEEP = ("SLURM", "SBATCH", "MUNGE", "PYTEST", "DJANGO", "PYTHON", "TEST_", "LD_")
WORKER_SECRETS = {
    "S3_SECRET_ACCESS_KEY": "worker-s3-secret-0001",
    "SECRET_KEY": "worker-django-secret-0002",
    "LIFEBOAT_TEST_WORKER_ONLY": "worker-only-value-0003",
    "REDIS_URL": "redis://:worker-redis-pw-0004@127.0.0.1:6379/9",
}


@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_a_launched_job_sees_only_its_environment_and_its_token_is_narrow(
    kind, request, api, client, project, token, tmp_path, settings, monkeypatch
):
    if kind == "slurm":
        request.getfixturevalue("slurm_cluster")
    # The launch worker's environment (this process): its secrets, and every other
    # variable marked, so that any value of the worker's found in the job is seen.
    for name, value in os.environ.items():
        if name not in BASE and not name.startswith(KEEP):
            monkeypatch.setenv(name, f"{value}-worker-mark")
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    settings.VAR_DIR = tmp_path / "var"
    settings.LAUNCH_LIFEBOAT_URL = "http://lifeboat.example:8000"
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.save()
    checkpoint = verified_checkpoint(project, "job", tmp_path / "ckpt" / "job")
    LaunchProfile.objects.create(
        project=project, name="env", kind=kind, command_template="env -0 > env.bin",
        options={"workdir": str(tmp_path), "env": {"EXTRA": "from the profile"}},
    )  # fmt: skip
    answer = api.post(token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "env"})
    assert answer.status_code == 202, answer.content
    resume_id = answer.json()["id"]
    launch_resume(resume_id)
    deadline = time.monotonic() + 60
    while not (tmp_path / "env.bin").exists() or not (tmp_path / "env.bin").stat().st_size:
        assert time.monotonic() < deadline, Resume.objects.get(pk=resume_id).error
        time.sleep(0.2)
    time.sleep(0.3)
    raw = (tmp_path / "env.bin").read_text()
    env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
    for name, value in WORKER_SECRETS.items():
        assert value not in raw and name not in env, name
    assert "-worker-mark" not in raw
    resume = Resume.objects.get(pk=resume_id)
    if kind == "local":  # exactly: the base, the profile's, Lifeboat's, and bash's own
        allowed = BASE | {"EXTRA", "PWD", "SHLVL", "_", "OLDPWD"}
        assert {n for n in env if n not in allowed and not n.startswith("LIFEBOAT_")} == set()
    # (A Slurm job also gets SLURM_* and, with an --export list, the submitting user's
    # login environment that slurmd builds on the node: not the worker's.)
    assert env["EXTRA"] == "from the profile"
    assert env["LIFEBOAT_URL"] == "http://lifeboat.example:8000"
    assert env["LIFEBOAT_RUN"] == env["LIFEBOAT_NEW_RUN_KEY"] == f"job-resume-{resume_id}"
    assert env["LIFEBOAT_RUN_KEY"] == "job" and env["LIFEBOAT_STEP"] == "7"
    job_token = env["LIFEBOAT_TOKEN"]
    assert job_token not in (resume.command + json.dumps(list(Event.objects.values()), default=str))
    stored = ApiToken.objects.get(pk=resume.token_id)
    assert stored.scopes == ["ingest", "read"] and stored.project_id == project.pk
    assert stored.digest == ApiToken.digest_of(job_token)  # stored hashed, like the others

    # It ingests into its own project and reads it...
    child = f"job-resume-{resume_id}"
    assert api.post_events(job_token, event("run.started", run=child)).status_code == 202
    assert Run.objects.get(key=child).project_id == project.pk
    assert api.get(job_token, f"/runs/{child}").status_code == 200
    # ...sees nothing of another project's...
    other = Project.objects.create(name="Beta", slug="beta")
    Run.objects.create(project=other, key="secret-run")
    assert api.get(job_token, "/runs/secret-run").status_code == 404
    assert "secret-run" not in api.get(job_token, "/runs").content.decode()
    # ...and cannot operate: no validate, no resume, no cancel.
    refused = [
        api.post(job_token, f"/checkpoints/{checkpoint.pk}/validate"),
        api.post(job_token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "env"}),
        api.post(job_token, f"/resumes/{resume_id}/cancel"),
    ]
    assert [r.status_code for r in refused] == [403, 403, 403]
    # Once the resume has ended, the token is revoked.
    done = follow_until_done(resume_id)
    assert done.status == "succeeded", (done.error, done.output)
    assert ApiToken.objects.get(pk=stored.pk).revoked_at is not None
    assert api.post_events(job_token, event("run.finished", run=child)).status_code == 401


# --- 3. output tails: operators only, redacted ----------------------------------------------


SECRETS_PRINTED = [
    ("aws_secret_access_key=wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMIK7MDENG"),
    ("AWS key id AKIAIOSFODNN7EXAMPLE in a log line", "AKIAIOSFODNN7EXAMPLE"),
    ("password=hunter2hunter2", "hunter2hunter2"),
    ("--token=tok-abcdef123456", "tok-abcdef123456"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGciOiJIUzI1NiJ9"),
    ("db at postgres://lifeboat:db-pass-9876@db:5432/lifeboat", "db-pass-9876"),
]


def test_a_jobs_output_is_redacted_and_shown_to_operators_only(
    api, token, read_token, project, tmp_path, settings, monkeypatch
):
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", "worker-s3-secret-abcdef")
    settings.VAR_DIR = tmp_path / "var"
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.save()
    checkpoint = verified_checkpoint(project, "job", tmp_path / "ckpt" / "job")
    lines = [line for line, _ in SECRETS_PRINTED]
    script = tmp_path / "leaky.sh"
    script.write_text(
        "".join(f"echo {json.dumps(line)}\n" for line in lines)
        + 'echo "my token is $LIFEBOAT_TOKEN"\necho "env: LIFEBOAT_TOKEN=$LIFEBOAT_TOKEN"\n'
        + "echo worker-s3-secret-abcdef\nexit 3\n"
    )
    LaunchProfile.objects.create(
        project=project, name="leaky", kind="local",
        command_template=f"bash {script} {{{{run_key}}}}", options={"workdir": str(tmp_path)},
    )  # fmt: skip
    resume_id = api.post(token, f"/checkpoints/{checkpoint.pk}/resume", {"profile": "leaky"})
    resume_id = resume_id.json()["id"]
    launch_resume(resume_id)
    done = follow_until_done(resume_id)
    assert done.status == "failed"
    assert done.error == "the process exited with code 3"  # no output in the error
    job_secret = (settings.VAR_DIR / "launch" / f"resume-{resume_id}" / "output.log").read_text()
    job_secret = job_secret.split("my token is ")[1].split()[0]
    assert job_secret.startswith("lb_")
    leaked = [secret for _, secret in SECRETS_PRINTED] + [job_secret[3:], "worker-s3-secret"]

    def shows(text: str) -> list[str]:
        return [s for s in leaked if s in text]

    assert "[redacted]" in done.output and "aws_secret_access_key=[redacted]" in done.output
    assert shows(done.output) == []
    # The API: a read token gets no output, an operate token the redacted one.
    assert api.get(read_token, f"/resumes/{resume_id}").json()["output"] == ""
    shown = api.get(token, f"/resumes/{resume_id}").json()
    assert "my token is lb_[redacted]" in shown["output"] and shows(json.dumps(shown)) == []
    # The dashboard: a viewer sees the status and the error, not the output.
    viewer = as_user(member(project, "vera", "viewer"))
    operator = as_user(member(project, "otto", "operator"))
    for page in (f"/p/alpha/checkpoints/{checkpoint.pk}/", "/p/alpha/runs/job/"):
        seen = viewer.get(page).content.decode()
        assert "AWS key id" not in seen and "[redacted]" not in seen and shows(seen) == []
        assert shows(operator.get(page).content.decode()) == []
    assert (
        "AWS key id [redacted]"
        in operator.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    )
    # The event log holds no output either.
    assert shows(json.dumps(list(Event.objects.values("message", "data")), default=str)) == []


# --- 4. automatic resumes bounded per project -----------------------------------------------


def test_many_run_keys_failing_launch_a_bounded_number_of_jobs(
    api, token, project, queues, settings
):
    from tests.support.celery_workers import queued_tasks

    settings.AUTO_RESUME_MAX_ACTIVE = 2
    settings.AUTO_RESUME_MAX_PER_HOUR = 3
    profile = LaunchProfile.objects.create(
        project=project, name="auto", kind="local", command_template="echo {{checkpoint_id}}"
    )
    project.auto_resume_profile, project.max_restarts = profile, 5
    project.save()

    def fail(keys: list[str]) -> None:
        batch = []
        for key in keys:
            batch += [event("run.started", run=key), saved(run=key, step=10, t=1)]
            batch += [event("run.failed", run=key, t=2, exit_code=1, error="OOM")]
        assert api.post_events(token, {"events": batch}).status_code == 202
        Checkpoint.objects.filter(run__key__in=keys).update(status="verified")
        alerts.check_runs()

    fail([f"job-{i}" for i in range(6)])
    assert Resume.objects.filter(automatic=True).count() == 2  # at most 2 at once
    assert len(queued_tasks(queues, "launch")) == 2
    skipped = Event.objects.filter(type="resume.skipped").order_by("id")
    assert skipped.count() == 4
    assert all("AUTO_RESUME_MAX_ACTIVE=2" in e.message for e in skipped)
    assert all(e.message.startswith("Not resuming job-") for e in skipped)
    # Two end: two more may start, but only one fits in the hour.
    Resume.objects.filter(automatic=True).update(status="failed")
    fail([f"late-{i}" for i in range(3)])
    assert Resume.objects.filter(automatic=True).count() == 3
    late = Event.objects.filter(type="resume.skipped", message__contains="late-")
    assert late.count() == 2
    assert all("AUTO_RESUME_MAX_PER_HOUR=3" in e.message for e in late)


def test_the_migration_moves_old_output_tails_out_of_the_error_redacted(project):
    """Before 0010 a failed resume's error ended with the output tail, shown to viewers."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = (
        [("domain", "0009_outbound_webhook_secret")],
        [("domain", "0010_launch_resume_output_token")],
    )
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    run = old.get_model("domain", "Run").objects.create(project_id=project.pk, key="r")
    checkpoint = old.get_model("domain", "Checkpoint").objects.create(
        project_id=project.pk, run=run, step=1, location="/data/1"
    )
    made = old.get_model("domain", "Resume").objects.create(
        project_id=project.pk, run=run, checkpoint=checkpoint, status="failed",
        error="the process exited with code 1\nAKIAIOSFODNN7EXAMPLE\npassword=hunter2hunter2",
    )  # fmt: skip
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    # The model as it was at that migration (later ones added columns).
    resume = executor.loader.project_state(after).apps.get_model("domain", "Resume")
    resume = resume.objects.get(pk=made.pk)
    assert resume.error == "the process exited with code 1"
    assert resume.output == "[redacted]\npassword=[redacted]"
    # Leave the schema as the other tests expect it: every later migration applied.
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
