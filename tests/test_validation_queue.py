"""Each checkpoint.saved puts a validation task on the `validate` queue after the
transaction commits; a real Celery worker takes it. The broker being down loses nothing."""

from __future__ import annotations

import pytest
from django.db import transaction

from tests.support.celery_workers import queued_tasks
from tests.support.events import event, saved
from tests.support.servers import wait_for
from webapp.domain.models import Checkpoint, Validation


@pytest.mark.django_db(transaction=True)
def test_a_saved_checkpoint_is_queued_for_validation_after_commit(api, token, queues):
    api.post_events(token, saved(step=1))
    checkpoint = Checkpoint.objects.get()
    assert queued_tasks(queues) == [
        {"task": "workers.validate.validate_checkpoint", "args": [checkpoint.pk], "kwargs": {}}
    ]
    assert checkpoint.validation_enqueued_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_batch_is_queued_as_one_dispatch_message(api, token, queues):
    # Publishing costs about a millisecond a message: a batch of 1000 publishes one.
    api.post_events(token, {"events": [saved(step=s) for s in range(1, 301)]})
    ids = sorted(Checkpoint.objects.values_list("pk", flat=True))
    [task] = queued_tasks(queues)
    assert task["task"] == "workers.validate.dispatch_validations"
    assert sorted(task["args"][0]) == ids
    assert all(c.validation_enqueued_at for c in Checkpoint.objects.all())


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_fans_a_batch_out_and_checks_every_checkpoint(api, token, queues, celery_worker):
    api.post_events(token, {"events": [saved(step=s) for s in range(1, 4)]})
    wait_for(lambda: all(c.is_settled for c in Checkpoint.objects.all()), timeout=60)
    assert set(Checkpoint.objects.values_list("status", flat=True)) == {"missing"}
    assert Validation.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_nothing_is_queued_when_the_transaction_rolls_back(project, queues):
    from webapp.domain.ingest.apply import ingest
    from webapp.domain.ingest.event_schema import parse_event

    raw = [saved(step=1)]
    with pytest.raises(RuntimeError), transaction.atomic():
        ingest(project, "test", [parse_event(0, raw[0])], raw)
        raise RuntimeError("the request failed after the ingest")
    assert Checkpoint.objects.count() == 0
    assert queued_tasks(queues) == []


@pytest.mark.django_db(transaction=True)
def test_repeats_and_heartbeats_queue_nothing(api, token, queues):
    first = saved(step=1)
    api.post_events(token, first)
    queues.delete("validate")
    api.post_events(token, first)
    api.post_events(token, event("run.heartbeat", step=3))
    assert queued_tasks(queues) == []


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_takes_the_task_and_checks_the_files(api, token, queues, celery_worker):
    # The files the event names do not exist: the worker must find that out for itself.
    api.post_events(token, saved(step=7))
    checkpoint = Checkpoint.objects.get()
    wait_for(lambda: Checkpoint.objects.get(pk=checkpoint.pk).is_settled, timeout=60)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "missing"
    assert checkpoint.status_message == "/data/run-1/step-7 does not exist (any more)"
    validation = Validation.objects.get(checkpoint=checkpoint)
    assert validation.status == "failed"
    assert validation.worker  # the host that ran it
    wait_for(lambda: "validate_checkpoint" in celery_worker.log_path.read_text())
    assert queues.llen("validate") == 0


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_down_events_are_kept_and_the_sweeper_requeues(
    project, queues, settings, worker_env
):
    from django.utils import timezone

    from tests.support.servers import WebServer, free_port
    from webapp.domain.validation import owed

    def requeue_unvalidated() -> int:
        return len(owed.resend(timezone.now(), 1000))

    token = project.issue_token("t", ["ingest"])[1]
    # The web server's Redis is a port where nothing listens: the broker is down.
    web = WebServer(worker_env, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    try:
        status, body = web.post_events(token, saved(step=5))
    finally:
        web.stop()
    assert status == 202, body
    checkpoint = Checkpoint.objects.get()
    assert checkpoint.status == "reported"
    assert checkpoint.validation_enqueued_at is None  # known not to be on the queue
    assert queued_tasks(queues) == []

    # Within the grace period the sweeper leaves it alone (an enqueue may be in flight)...
    assert requeue_unvalidated() == 0
    # ...after it, the checkpoint goes back on the queue.
    settings.SWEEP_LOST_AFTER_S = 0
    assert requeue_unvalidated() == 1
    assert [t["args"][0] for t in queued_tasks(queues)] == [checkpoint.pk]
    checkpoint.refresh_from_db()
    assert checkpoint.validation_enqueued_at is not None
    assert requeue_unvalidated() == 0  # now known to be queued


@pytest.mark.django_db(transaction=True)
def test_validate_action_queues_a_recheck_and_keeps_the_verdict_meanwhile(api, token, queues):
    api.post_events(token, saved(step=5))
    checkpoint = Checkpoint.objects.get()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    queues.delete("validate")
    response = api.post(token, f"/checkpoints/{checkpoint.pk}/validate")
    assert response.status_code == 202
    assert Checkpoint.objects.get(pk=checkpoint.pk).status == "verified"
    [task] = queued_tasks(queues)
    assert task["args"] == [checkpoint.pk]
    assert task["kwargs"] == {"requested_by": "token:all", "revalidate": True}
