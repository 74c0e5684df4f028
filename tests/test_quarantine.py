"""Recovery that never loops (docs/restore.md, "Quarantine and restart loops"), with real
jobs: tests/support/jobs/quarantine_job.py launched by automatic resumes through the
`local` profile, reporting to a live Lifeboat with the real client. A checkpoint that jobs die right
after loading is quarantined, and the next resume falls back to the one before; a job
that fails the same way whatever it resumes from stops after the project's number of
attempts, with one alert; a Slurm job preempted by the scheduler's signal is resumed
without counting as a failure."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from django.urls import reverse

from tests.support.events import event
from tests.support.resume import follow_until_done
from tests.support.servers import ROOT, wait_for
from webapp.domain.health import alerts, analytics
from webapp.domain.launch import slurm
from webapp.domain.models import Checkpoint, Event, LaunchProfile, Resume, Run
from webapp.domain.models.alerts import Flip
from workers.launch import launch_resume
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

JOB = ROOT / "tests" / "support" / "jobs" / "quarantine_job.py"


@pytest.fixture
def launcher(server, project, tmp_path, settings):
    """Automatic resume through the `local` profile, launching tests/support/jobs/quarantine_job.py
    from a checkpoint: profile(bad) makes it fail right after loading the steps `bad`
    names (a step, "all", or "none")."""
    settings.VAR_DIR = tmp_path / "var"
    settings.LAUNCH_LIFEBOAT_URL = server.url
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.max_restarts, project.quarantine_after, project.loop_after = 6, 2, 3
    project.save()

    def profile(bad: str, name: str = "again", auto: bool = True):
        template = (
            f"{shlex.quote(sys.executable)} {shlex.quote(str(JOB))} --step {{{{step}}}} --bad {bad}"
        )
        made = LaunchProfile.objects.create(
            project=project, name=name, kind="local", command_template=template,
            options={"workdir": str(ROOT), "env": {"LIFEBOAT_SPOOL_DIR": str(tmp_path / "s2")}},
        )  # fmt: skip
        if auto:
            project.auto_resume_profile = made
            project.save()
        return made

    return profile


@pytest.fixture
def job(launcher, server, token, tmp_path):
    """A run `train` that saved steps 10 and 20 (both verified) and died; `launcher`'s
    profile(bad) to call."""
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
    return launcher


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
    run_page = client.get(reverse("dashboard:run", args=[project.slug, "train"])).content
    assert b"Quarantined" in run_page  # the step's badge in the run's list
    # An operator releases it, audited; it is the latest again.
    client.force_login(operator)
    assert "Release from quarantine" in client.get(page_url).content.decode()
    answer = client.post(f"{page_url}release/", follow=True)
    assert "is released: resumes may start from it again" in answer.content.decode()
    assert api.get(token, "/runs/train/latest").json()["step"] == 20
    released = Event.objects.get(type="checkpoint.released")
    assert released.actor == "user:otto" and "2 resumes from step 20" in released.message


def test_a_job_that_always_fails_stops_after_n_attempts_with_one_alert(
    job, api, token, client, operator, project
):
    job(bad="all")
    attempts = sweep_until_settled()
    # Two from step 20 (then quarantined), one from step 10: three without progress.
    assert [(r.checkpoint.step, r.status) for r in attempts] == [
        (20, "failed"), (20, "failed"), (10, "failed")
    ]  # fmt: skip
    (loop,) = Flip.objects.filter(kind="run.restart_loop")
    assert "last 3 resumes (from steps 20, 20, 10) each ended" in loop.message
    assert "same error" not in loop.message  # step 20's and step 10's texts differ
    skipped = Event.objects.filter(type="resume.skipped").latest("pk")
    assert "restart loop" in skipped.message
    # Later looks change nothing: no new attempt, no second alert; max_restarts (6) was
    # not spent, and step 10 was not quarantined on one failure.
    alerts.check_runs()
    assert Resume.objects.count() == 3 and Flip.objects.filter(kind="run.restart_loop").count() == 1
    assert Checkpoint.objects.get(step=10).quarantined_at is None
    # The last attempt's page offers step 10 by hand, and says step 20 was passed over.
    client.force_login(operator)
    last = f"train-resume-{attempts[-1].pk}"
    page = client.get(reverse("dashboard:run", args=[project.slug, last])).content.decode()
    assert "Passed over, quarantined:" in page and ">step 20</a>" in page
    # Releasing over the API (an operate token), as from a script; a repeat says so.
    step_20 = Checkpoint.objects.get(step=20)
    answer = api.post(token, f"/checkpoints/{step_20.pk}/release")
    assert answer.status_code == 200 and answer.json()["message"] == "released from quarantine"
    again = api.post(token, f"/checkpoints/{step_20.pk}/release")
    assert again.json()["message"] == "was not quarantined"
    assert Event.objects.get(type="checkpoint.released").actor.startswith("token:")


def test_a_persons_resume_that_gets_somewhere_ends_the_streak(job, api, token):
    job(bad="all")
    sweep_until_settled()  # three attempts without progress: automatic resume stopped
    assert Flip.objects.filter(kind="run.restart_loop").count() == 1
    # A person resumes from step 10 with a fixed job: it trains past step 10, then its
    # node is lost. That failure is resumed automatically again: the streak is over.
    job(bad="later", name="fixed", auto=False)
    step_10 = Checkpoint.objects.get(step=10)
    answer = api.post(token, f"/checkpoints/{step_10.pk}/resume", {"profile": "fixed"})
    assert answer.status_code == 202, answer.content
    launch_resume(answer.json()["id"])
    assert follow_until_done(answer.json()["id"], timeout=120).status == "failed"
    alerts.check_runs()
    newest = Resume.objects.latest("pk")
    assert newest.automatic and newest.pk != answer.json()["id"]
    assert Flip.objects.filter(kind="run.restart_loop").count() == 1


@pytest.mark.usefixtures("slurm_cluster")
def test_a_slurm_job_preempted_by_a_signal_is_resumed_and_not_counted_as_a_failure(
    launcher, server, token, project, tmp_path, settings
):
    # A Slurm job reports steps 10 and 20 and trains on; the scheduler's USR1 (the time
    # limit near, --signal=B:USR1@...) reaches it: the client records run.preempted.
    env = {**os.environ, "LIFEBOAT_URL": server.url, "LIFEBOAT_TOKEN": token,
           "LIFEBOAT_RUN": "slurm-train",
           "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool")}  # fmt: skip
    log = tmp_path / "job.log"
    command = (
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(JOB))} --then-wait "
        f"--fresh {shlex.quote(str(tmp_path / 'ckpt' / 'slurm-train'))}"
    )
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={log}", f"--chdir={ROOT}", "--wrap", command],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    slurm_job = submitted.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: "saved, waiting" in (log.read_text() if log.exists() else ""), 90)
        subprocess.run(["scancel", "--batch", "--signal=USR1", slurm_job], check=True, timeout=30)
        slurm.wait(slurm_job, timeout=60, interval=0.5)
    finally:
        slurm.cancel(slurm_job)
    run = wait_for(lambda: Run.objects.filter(key="slurm-train", status="preempted").first(), 30)
    assert run.exit_code == 128 + 10 and "SIGUSR1" in run.error, log.read_text()
    for checkpoint in Checkpoint.objects.filter(run=run):
        validate_checkpoint(checkpoint.pk)

    # Resumed by Lifeboat once it has not come back by itself; max_restarts 0 and still
    # resumed: a preemption is not counted, and raises no run.failed alert.
    launcher(bad="none")
    project.max_restarts = 0
    project.save()
    settings.AUTO_RESUME_PREEMPTED_AFTER_S = 0
    (resume,) = sweep_until_settled()
    assert resume.automatic and resume.after_preemption and resume.checkpoint.step == 20
    assert resume.status == "succeeded", resume.error
    assert not Flip.objects.filter(kind="run.failed").exists()
    requested = Event.objects.get(type="resume.requested")
    assert "after a preemption, not counted" in requested.message
    # Kept apart in the MTBF.
    _, failures, seen = analytics.project_mtbf(project)
    assert failures == 0 and Run.objects.filter(status="preempted").count() == 1
    alerts.check_runs()
    assert Resume.objects.count() == 1  # once


def test_a_job_claiming_resumed_from_cannot_quarantine_a_checkpoint(job, api, token):
    # An ingest token (in every job's environment) reports runs that say they resumed
    # from step 20 and fail at once: only Lifeboat's own resumes count against it.
    step_20 = Checkpoint.objects.get(step=20)
    for key in ("fake-1", "fake-2", "fake-3"):
        body = {"events": [
            event("run.started", run=key, t=1, resumed_from=step_20.pk),
            event("run.failed", run=key, t=2, exit_code=1, error="RuntimeError: boom"),
        ]}  # fmt: skip
        assert api.post_events(token, body).status_code == 202
    alerts.check_runs()
    step_20.refresh_from_db()
    assert step_20.quarantined_at is None
    assert api.get(token, "/runs/train/latest").json()["step"] == 20
