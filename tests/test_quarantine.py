"""Recovery that never loops (docs/restore.md, "Quarantine and restart loops"), with real
jobs: tests/quarantine_job.py launched by automatic resumes through the `local` profile,
reporting to a live Lifeboat with the real client. A checkpoint that jobs die right
after loading is quarantined, and the next resume falls back to the one before; a job
that fails the same way whatever it resumes from stops after the project's number of
attempts, with one alert; a restore test that cannot load a checkpoint quarantines it."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_resume import follow_until_done
from webapp.domain.health import alerts
from webapp.domain.models import Checkpoint, Event, LaunchProfile, Resume, Run
from webapp.domain.models.alerts import Flip
from workers.launch import launch_resume
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

JOB = ROOT / "tests" / "quarantine_job.py"


@pytest.fixture
def job(server, token, project, tmp_path, settings):
    """A run that saved steps 10 and 20 (both verified) and died; automatic resume on,
    with the `local` profile launching the job again from a checkpoint, failing right
    after loading the steps named by bad()."""
    settings.VAR_DIR = tmp_path / "var"
    settings.LAUNCH_LIFEBOAT_URL = server.url
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.max_restarts, project.quarantine_after, project.loop_after = 6, 2, 3
    project.save()
    env = {"LIFEBOAT_URL": server.url, "LIFEBOAT_TOKEN": token, "LIFEBOAT_RUN": "train",
           "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"), "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(JOB), "--fresh", str(tmp_path / "ckpt" / "train")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "the node was lost" in done.stderr, done.stderr
    for checkpoint in Checkpoint.objects.filter(run__key="train"):
        validate_checkpoint(checkpoint.pk)
    assert set(Checkpoint.objects.values_list("step", "status")) == {
        (10, "verified"), (20, "verified")
    }  # fmt: skip

    def profile(bad: str) -> None:
        template = (
            f"{shlex.quote(sys.executable)} {shlex.quote(str(JOB))} --step {{{{step}}}} --bad {bad}"
        )
        made = LaunchProfile.objects.create(
            project=project, name="again", kind="local", command_template=template,
            options={"workdir": str(ROOT), "env": {"LIFEBOAT_SPOOL_DIR": str(tmp_path / "s2")}},
        )  # fmt: skip
        project.auto_resume_profile = made
        project.save()

    return profile


def sweep_until_settled(rounds: int = 8) -> list[Resume]:
    """What the beat does: look at failed runs (quarantine, auto-resume), launch what was
    requested, follow it to its end; until nothing new is requested."""
    for _ in range(rounds):
        alerts.check_runs()
        requested = list(Resume.objects.filter(status="requested").order_by("pk"))
        if not requested:
            break
        for resume in requested:
            launch_resume(resume.pk)
            follow_until_done(resume.pk, timeout=120)
    return list(Resume.objects.select_related("checkpoint").order_by("pk"))


def test_a_checkpoint_jobs_die_on_is_quarantined_and_the_resume_falls_back(
    job, api, token, project, client, viewer, operator
):
    job(bad="20")  # step 20 loads, then every job dies at once; step 10 is fine
    attempts = sweep_until_settled()
    assert [(r.checkpoint.step, r.status) for r in attempts] == [
        (20, "failed"), (20, "failed"), (10, "succeeded")
    ]  # fmt: skip
    step_20 = Checkpoint.objects.get(step=20)
    assert step_20.status == "verified" and step_20.quarantined_at is not None
    reason = step_20.quarantine_reason
    assert reason.startswith("2 resumes from step 20 failed before any progress")
    assert "exit code 1" in reason and "loss is nan right after loading step 20" in reason
    assert Flip.objects.filter(kind="checkpoint.quarantined").count() == 1
    finished = Run.objects.get(key=f"train-resume-{attempts[-1].pk}")
    assert finished.status == "finished" and finished.resumed_from.step == 10

    # `latest` passes it over and says so; the API and the client agree.
    latest = api.get(token, "/runs/train/latest").json()
    assert latest["step"] == 10
    assert [(p["step"], p["quarantine_reason"][:9]) for p in latest["passed_over"]] == [
        (20, "2 resumes")
    ]  # fmt: skip
    refused = api.post(token, f"/checkpoints/{step_20.pk}/resume", {"profile": "again"})
    assert refused.status_code == 409 and "quarantined" in refused.json()["error"]

    # The checkpoint page says so, with the evidence; a viewer cannot release it.
    page_url = f"/p/{project.slug}/checkpoints/{step_20.pk}/"
    client.force_login(viewer)
    page = client.get(page_url).content.decode()
    assert "Quarantined" in page and "loss is nan right after loading step 20" in page
    assert "Release from quarantine" not in page
    assert client.post(f"{page_url}release/").status_code == 403
    # An operator releases it, audited; it is the latest again.
    client.force_login(operator)
    assert "Release from quarantine" in client.get(page_url).content.decode()
    answer = client.post(f"{page_url}release/", follow=True)
    assert "is released: resumes may start from it again" in answer.content.decode()
    assert api.get(token, "/runs/train/latest").json()["step"] == 20
    released = Event.objects.get(type="checkpoint.released")
    assert released.actor == "user:otto" and "2 resumes from step 20" in released.message


def test_a_job_that_always_fails_stops_after_n_attempts_with_one_alert(job, api, token):
    job(bad="all")
    attempts = sweep_until_settled()
    # Two from step 20 (then quarantined), one from step 10: three without progress.
    assert [(r.checkpoint.step, r.status) for r in attempts] == [
        (20, "failed"), (20, "failed"), (10, "failed")
    ]  # fmt: skip
    (loop,) = Flip.objects.filter(kind="run.restart_loop")
    assert "last 3 automatic resumes (from steps 20, 20, 10) each failed" in loop.message
    assert "same error" not in loop.message  # step 20's and step 10's texts differ
    skipped = Event.objects.filter(type="resume.skipped").latest("pk")
    assert "restart loop" in skipped.message
    # Later looks change nothing: no new attempt, no second alert; max_restarts (6) was
    # not spent, and step 10 was not quarantined on one failure.
    alerts.check_runs()
    assert Resume.objects.count() == 3 and Flip.objects.filter(kind="run.restart_loop").count() == 1
    assert Checkpoint.objects.get(step=10).quarantined_at is None
    # Releasing over the API (an operate token), as from a script; a repeat says so.
    step_20 = Checkpoint.objects.get(step=20)
    answer = api.post(token, f"/checkpoints/{step_20.pk}/release")
    assert answer.status_code == 200 and answer.json()["message"] == "released from quarantine"
    again = api.post(token, f"/checkpoints/{step_20.pk}/release")
    assert again.json()["message"] == "was not quarantined"
    assert Event.objects.get(type="checkpoint.released").actor.startswith("token:")
