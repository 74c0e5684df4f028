"""The deeper restore-test levels with examples/train_digits.py: the forward pass fails
for a checkpoint whose keys do not fit the model; the replay passes for the run's own
checkpoint and fails for one from another run. And automatic resume, at most N times."""

from __future__ import annotations

import pytest
import torch

from tests.support.celery_workers import queued_tasks
from tests.support.client_scripts import train_digits
from tests.support.events import event
from tests.support.restore_levels import CHECKS, restore, verified_with_replica
from webapp.domain.health import alerts
from webapp.domain.models import Checkpoint, Event, LaunchProfile, Resume, Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_run_s_own_checkpoint_passes_forward_and_replay(digits, project, s3, queues):
    checkpoint = verified_with_replica(digits, project, s3)
    outcome, validation = restore(checkpoint)
    assert outcome == "passed", validation.message
    assert "Forward: loads strictly into the model and its forward pass is finite" in (
        validation.message
    )
    assert "Replay: 5 steps (24-28) replayed; the largest difference is" in validation.message
    assert validation.timings["forward_s"] > 0 and validation.timings["replay_s"] > 0
    assert [level["level"] for level in validation.findings] == ["forward", "replay"]


def test_a_checkpoint_from_another_run_fails_the_replay(
    digits, server, token, project, s3, tmp_path, queues
):
    train_digits(server, token, tmp_path, "other", seed=1)
    # The other run's step-23 file, reported as this run's step 23 (a wrong path, a
    # mixed-up directory): it loads, it is finite, but training does not follow this run.
    Checkpoint.objects.filter(pk=digits.pk).delete()
    # A copy of its row and files under this run (a checkpoint never moves between runs:
    # the run totals' trigger refuses it).
    stranger = Checkpoint.objects.get(run__key="other", step=23)
    files = list(stranger.files.all())
    stranger.pk, stranger.run = None, Run.objects.get(key="digits")
    stranger.save(force_insert=True)
    for file in files:
        file.pk, file.checkpoint = None, stranger
        file.save(force_insert=True)
    stranger = verified_with_replica(Checkpoint.objects.get(pk=stranger.pk), project, s3)
    outcome, validation = restore(stranger)
    assert outcome == "failed"
    assert "the replay check failed: the resumed training does not follow the run" in (
        validation.message
    )
    assert "forward" not in validation.message.split("failed:")[0]


def test_a_checkpoint_whose_keys_do_not_fit_the_model_fails_forward(
    digits, project, s3, tmp_path, queues
):
    project.restore_checks = {"forward": CHECKS["forward"]}
    project.save()
    path = tmp_path / "ckpt" / "digits" / "epoch-000-step-23.pt"
    state = torch.load(path, weights_only=True)
    state["model"]["head.3.weight_renamed"] = state["model"].pop("head.3.weight")
    torch.save(state, path)
    from tests.support.validation import file_entry

    entry = file_entry(path, path.name)
    digits.files.update(size=entry["size"], sha256=entry["sha256"])
    Checkpoint.objects.filter(pk=digits.pk).update(total_size=entry["size"])
    checkpoint = verified_with_replica(Checkpoint.objects.get(pk=digits.pk), project, s3)
    outcome, validation = restore(checkpoint)
    assert outcome == "failed"
    assert "the forward check failed: the checkpoint does not fit the model" in validation.message
    assert "head.3.weight" in validation.message
    # Verified bytes that no job could resume from: quarantined at once (docs/restore.md).
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified" and checkpoint.quarantined_at is not None
    assert checkpoint.quarantine_reason.startswith("its restore test failed: Downloaded")
    assert checkpoint.run.latest_verified_checkpoint() is None


def test_a_failed_run_is_resumed_automatically_at_most_n_times(api, token, project, queues):
    profile = LaunchProfile.objects.create(
        project=project, name="auto", kind="local", command_template="echo {{checkpoint_id}}"
    )
    project.auto_resume_profile, project.max_restarts = profile, 1
    project.save()
    from tests.support.events import saved

    assert (
        api.post_events(
            token,
            {
                "events": [
                    event("run.started", run="job"),
                    saved(run="job", step=10, t=1),
                    event("run.failed", run="job", t=2, exit_code=1, error="NCCL timeout"),
                ]
            },
        ).status_code
        == 202
    )
    checkpoint = Checkpoint.objects.get()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    assert [f.kind for f in alerts.check_runs()] == ["run.failed"]
    (resume,) = Resume.objects.all()
    assert resume.automatic and resume.checkpoint_id == checkpoint.pk
    assert [t["task"] for t in queued_tasks(queues, "launch")] == ["workers.launch.launch_resume"]
    # The resumed job fails as well: the lineage has used its one restart.
    assert (
        api.post_events(
            token,
            {
                "events": [
                    event(
                        "run.started",
                        run=f"job-resume-{resume.pk}",
                        t=3,
                        resumed_from=checkpoint.pk,
                    ),
                    event("run.failed", run=f"job-resume-{resume.pk}", t=4, exit_code=1),
                ]
            },
        ).status_code
        == 202
    )
    assert [f.kind for f in alerts.check_runs()] == ["run.failed"]
    assert Resume.objects.count() == 1
    skipped = Event.objects.get(type="resume.skipped")
    assert "resumed automatically 1 times already (max 1)" in skipped.message
