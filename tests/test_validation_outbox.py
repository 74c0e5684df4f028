"""The validation outbox (webapp/domain/validation/outbox.py): the checkpoints that many
requests commit go onto the queue in a few messages, and none is left out."""

from __future__ import annotations

import pytest

from tests.support.celery_workers import queued_tasks
from tests.support.concurrency import run_together
from tests.support.events import saved
from tests.support.servers import WebServer
from webapp.domain.models import Checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


def _queued_checkpoint_ids(queues) -> tuple[list[int], int]:
    ids, messages = [], 0
    for task in queued_tasks(queues):
        messages += 1
        if task["task"].endswith("dispatch_validations"):
            ids.extend(task["args"][0])
        else:
            ids.append(task["args"][0])
    return ids, messages


def test_checkpoints_of_many_requests_are_queued_once_each_in_fewer_messages(
    project, worker_env, queues
):
    token = project.issue_token("t", ["ingest"])[1]
    events = [saved(run=f"run-{i % 4}", step=i, t=i) for i in range(160)]
    failures: list = []
    # A long pause between messages, so that coalescing does not depend on timing; the
    # server is stopped right after the last answer, so what the outbox still holds
    # then goes out on the way out.
    web = WebServer(worker_env, VALIDATION_PUBLISH_MS="300")

    def send(bodies):
        for body in bodies:
            status, answer = web.post_events(token, body)
            if status != 202:
                failures.append((status, answer))

    try:
        run_together(send, [[events[k::8]] for k in range(8)])
    finally:
        web.stop()

    assert failures == []
    ids, messages = _queued_checkpoint_ids(queues)
    every = sorted(Checkpoint.objects.values_list("pk", flat=True))
    assert len(every) == 160
    assert sorted(ids) == every  # each exactly once
    assert messages < 40, messages  # one per transaction would be 40 or more
    assert not Checkpoint.objects.filter(validation_enqueued_at__isnull=True).exists()


def test_without_the_outbox_each_transaction_publishes_its_own(project, worker_env, queues):
    token = project.issue_token("t", ["ingest"])[1]
    web = WebServer(worker_env, VALIDATION_PUBLISH_MS="0")
    try:
        for step in range(5):
            assert web.post_events(token, saved(step=step))[0] == 202
    finally:
        web.stop()
    ids, messages = _queued_checkpoint_ids(queues)
    assert messages == 5
    assert sorted(ids) == sorted(Checkpoint.objects.values_list("pk", flat=True))
