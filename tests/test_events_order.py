"""Events arrive late, twice, or out of order; the state still ends right."""

from __future__ import annotations

import pytest

from tests.support.events import event, saved
from webapp.domain.models import Checkpoint, Run

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_checkpoint_saved_before_run_started_still_creates_the_run(api, token):
    api.post_events(token, saved(step=5, t=10))
    run = Run.objects.get(key="run-1")
    assert run.status == "running"
    assert run.checkpoints.get().step == 5
    api.post_events(token, event("run.started", t=0, host="gpu-1"))
    run.refresh_from_db()
    assert run.host == "gpu-1"
    assert run.checkpoints.count() == 1


def test_a_late_heartbeat_does_not_move_the_run_backwards(api, token):
    api.post_events(token, event("run.heartbeat", t=100, step=1000, metrics={"loss": 0.1}))
    api.post_events(token, event("run.heartbeat", t=50, step=500, metrics={"loss": 0.9}))
    run = Run.objects.get()
    assert run.last_step == 1000
    assert run.last_metrics == {"loss": 0.1}


def test_a_batch_in_reverse_order_ends_in_the_newest_state(api, token):
    batch = [
        event("run.finished", t=30, exit_code=0),
        event("run.heartbeat", t=20, step=2),
        event("run.started", t=0, name="n"),
    ]
    api.post_events(token, {"events": batch})
    run = Run.objects.get()
    assert run.status == "finished"
    assert run.last_step == 2
    assert run.name == "n"


def test_a_heartbeat_after_the_end_does_not_reopen_the_run(api, token):
    api.post_events(token, event("run.started", t=0))
    api.post_events(token, event("run.failed", t=60, exit_code=1))
    api.post_events(token, event("run.heartbeat", t=30, step=9))
    assert Run.objects.get().status == "failed"


def test_a_run_started_again_after_its_end_runs_again(api, token):
    # A Slurm requeue keeps the run key: a newer start reopens the run.
    api.post_events(token, event("run.started", t=0))
    api.post_events(token, event("run.failed", t=60, exit_code=137))
    api.post_events(token, event("run.started", t=120))
    run = Run.objects.get()
    assert (run.status, run.exit_code, run.ended_at) == ("running", None, None)


def test_the_end_of_an_earlier_attempt_arriving_late_is_ignored(api, token):
    api.post_events(token, event("run.started", t=120))
    api.post_events(token, event("run.failed", t=60, exit_code=137))
    assert Run.objects.get().status == "running"


def test_a_late_checkpoint_started_does_not_undo_a_save(api, token):
    api.post_events(token, saved(step=10, t=5))
    api.post_events(token, event("checkpoint.started", step=10, t=0))
    api.post_events(token, event("checkpoint.failed", step=10, t=1, error="retry"))
    assert Checkpoint.objects.get().status == "reported"


def test_an_older_report_of_a_resaved_step_does_not_replace_the_newer(api, token):
    newer = saved(step=10, t=50, location="/data/run-1/new")
    older = saved(step=10, t=10, location="/data/run-1/old")
    api.post_events(token, newer)
    api.post_events(token, older)
    assert Checkpoint.objects.get().location == "/data/run-1/new"


def test_a_step_saved_again_with_other_files_is_checked_again(api, token, project):
    api.post_events(token, saved(step=10, t=0))
    checkpoint = Checkpoint.objects.get()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    resave = saved(step=10, t=60, files=[{"path": "model.pt", "size": 7, "sha256": "ef" * 32}])
    api.post_events(token, resave)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "reported"
    assert list(checkpoint.files.values_list("path", "size")) == [("model.pt", 7)]
    assert checkpoint.total_size == 7


def test_the_same_save_reported_twice_under_new_ids_changes_nothing(api, token):
    first = saved(step=10, t=0)
    api.post_events(token, first)
    checkpoint = Checkpoint.objects.get()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    again = {**first, "id": "0f0e0d0c-0b0a-4909-8807-060504030201"}
    response = api.post_events(token, again)
    assert response.json()["created"] == 1  # a new event in the log...
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified"  # ...that does not throw away the verdict
