"""The sweeper (webapp/domain/repair.py): for every stage, the work the database says is
owed and nobody is doing is sent again, once, and never while a live worker holds it or
its message may still wait in a queue; what it sends is on the run's timeline, in
/metrics and, when it keeps happening, among the project's problems. And the tasks' own
retry of failures that pass (workers/retrying.py)."""

from __future__ import annotations

import contextlib
import json
import time
from datetime import timedelta

import kombu
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from django.db import OperationalError, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerDown

from tests.support.celery_workers import queued_tasks
from tests.support.replication import make_checkpoint, make_target
from webapp.domain import publish, repair
from webapp.domain.health import problems
from webapp.domain.models import (
    Checkpoint,
    Event,
    LaunchProfile,
    Replica,
    Resume,
    Validation,
)
from webapp.domain.recovery import restore_test
from webapp.domain.recovery import resume as resumes
from webapp.domain.replication import replicate
from webapp.domain.transient import is_transient
from webapp.domain.validation import checking
from webapp.domain.validation.publish import VALIDATE
from webapp.domain.validation.verdict import decide
from workers.celery import app
from workers.retention import finish_interrupted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]

LONG_AGO = timedelta(hours=1)


def tasks(queues, queue: str) -> list[tuple[str, list]]:
    return [(t["task"].rsplit(".", 1)[1], t["args"]) for t in queued_tasks(queues, queue)]


def running_check(checkpoint, lease_until, worker: str = "node-3") -> Validation:
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        status="verifying", validation_enqueued_at=timezone.now()
    )
    return Validation.objects.create(
        checkpoint=checkpoint,
        kind="integrity",
        status="running",
        worker=worker,
        started_at=timezone.now() - LONG_AGO,
        lease_until=lease_until,
    )


def test_a_verdict_writes_the_replica_rows_its_targets_ask_for_in_its_own_transaction(
    project, root, s3, queues
):
    make_target(project, s3, "main")
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"}, status="verifying")
    validation = Validation.objects.create(checkpoint=checkpoint, kind="integrity")
    fingerprint = checking.files_fingerprint(checkpoint)
    with transaction.atomic():
        checking.record(validation.pk, fingerprint, decide([], 1, 1, {}), {}, {})
        # Before the commit: the verdict and its replica rows are one transaction.
        assert Replica.objects.filter(checkpoint=checkpoint, status="pending").count() == 1
    assert tasks(queues, "replicate") == [("replicate", [Replica.objects.get().pk])]


def test_a_verified_checkpoint_without_the_copy_its_policy_asks_for_gets_it(
    project, root, s3, queues
):
    target = make_target(project, s3, "main")
    target.created_at = timezone.now() - LONG_AGO
    target.save()
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"})
    manual = make_target(project, s3, "manual", policy="manual")
    Checkpoint.objects.filter(pk=checkpoint.pk).update(verified_at=timezone.now() - LONG_AGO / 2)

    done = repair.sweep()

    assert [o.stage for o in done] == ["replicate"]
    assert "verified without the copy to main that its policy asks for" in done[0].what
    replica = Replica.objects.get()
    assert (replica.target, replica.status) == (target, "pending")
    assert not Replica.objects.filter(target=manual).exists()
    assert tasks(queues, "replicate") == [("replicate", [replica.pk])]
    assert repair.sweep() == []  # asked for once


def test_a_check_whose_worker_died_is_sent_again_once_and_taken_over(project, root, queues):
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"})
    now = timezone.now()
    dead = running_check(checkpoint, lease_until=now - timedelta(seconds=1))

    assert [o.checkpoint_id for o in repair.sweep()] == [checkpoint.pk]
    assert tasks(queues, "validate") == [("validate_checkpoint", [checkpoint.pk])]
    dead.refresh_from_db()
    assert dead.worker == ""  # handed back to the queue
    # The message waits on the queue: the next sweeps leave it alone.
    assert repair.sweep() == []
    assert repair.sweep(now=now + timedelta(minutes=30)) == []
    # The task that takes it finds no live worker on it.
    claimed = checking.claim(checkpoint.pk, "system", False)
    assert claimed[0] == dead.pk


def test_a_live_lease_is_never_doubled(project, root, queues):
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"})
    live = running_check(checkpoint, lease_until=timezone.now() + timedelta(minutes=2))
    assert repair.sweep() == []
    assert queued_tasks(queues, "validate") == []
    busy = checking.claim(checkpoint.pk, "system", False)
    assert 100 < busy.retry_in_s < 125
    live.refresh_from_db()
    assert live.worker == "node-3"


def test_a_message_that_may_wait_behind_a_backlog_is_not_taken_for_lost(project, root, queues):
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"}, status="reported")
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        validation_enqueued_at=timezone.now() - timedelta(minutes=10)
    )
    queues.rpush("validate", b"{}")  # someone else's message still waits
    assert repair.sweep() == []
    queues.delete("validate")  # the queue drained, and ours never came: lost
    (owed,) = repair.sweep()
    assert "lost on its way to a worker" in owed.what
    assert tasks(queues, "validate") == [("validate_checkpoint", [checkpoint.pk])]


@contextlib.contextmanager
def taken_by_a_worker(queue: str):
    """The one message on `queue` taken as Celery's worker takes it (a kombu consumer)
    and not acknowledged: as a worker holds a task between taking it and its end."""
    taken = []
    with publish.app().connection_for_read() as connection, connection.channel() as channel:
        consumer = kombu.Consumer(
            channel, [kombu.Queue(queue)], accept=["json"], callbacks=[
                lambda body, message: taken.append(message)
            ]
        )  # fmt: skip
        consumer.consume()
        connection.drain_events(timeout=10)
        assert len(taken) == 1
        yield
        taken[0].ack()


def test_a_message_a_worker_has_taken_and_not_yet_claimed_is_not_taken_for_lost(
    project, root, s3, queues, settings
):
    """Between a worker taking a message off the queue and its task claiming the work,
    the queue is empty and no lease is live; on a loaded machine that lasts a second or
    more, and a sweep then sent the check again. The broker's own record of what a
    worker holds says it is in hand, until SWEEP_LOST_AFTER_S after it was taken."""
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"}, status="reported")
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        validation_enqueued_at=timezone.now() - timedelta(minutes=10)
    )
    copied = make_checkpoint(project, root, 2, {"m": b"y"})
    replica = Replica.objects.create(
        checkpoint=copied, target=make_target(project, s3, "main"), status="pending"
    )
    Replica.objects.filter(pk=replica.pk).update(created_at=timezone.now() - LONG_AGO)
    restore = Validation.objects.create(
        checkpoint=copied, kind="restore", created_at=timezone.now() - LONG_AGO
    )
    profile = LaunchProfile.objects.create(project=project, name="p", command_template="true")
    launch = Resume.objects.create(
        project=project, run=copied.run, checkpoint=copied, profile=profile,
        created_at=timezone.now() - LONG_AGO,
    )  # fmt: skip
    publish.send(VALIDATE, (checkpoint.pk,))
    publish.send("workers.replicate.replicate", (replica.pk,))
    publish.send(restore_test.TASK, (restore.pk,), queue="restore")
    publish.send(resumes.LAUNCH, (launch.pk,), queue="launch")
    later = timezone.now() + timedelta(seconds=settings.SWEEP_LOST_AFTER_S + 1)
    with contextlib.ExitStack() as held:
        for queue in ("validate", "replicate", "restore", "launch"):
            held.enter_context(taken_by_a_worker(queue))
            assert queues.llen(queue) == 0
        assert repair.sweep() == []
        # Held past SWEEP_LOST_AFTER_S and never claimed: its worker died with it.
        owed = repair.sweep(now=later)
        assert sorted(o.what for o in owed) == [
            f"resume {launch.pk} was never launched (its message was lost): sent again",
            "the check of step 1 was lost on its way to a worker: sent again",
            "the copy of step 2 to main: its task was lost; sent again",
            "the restore test of step 2: its message was lost; sent again",
        ]
    assert tasks(queues, "validate") == [("validate_checkpoint", [checkpoint.pk])]
    assert tasks(queues, "replicate") == [("replicate", [replica.pk])]
    assert tasks(queues, "restore") == [("restore_test", [restore.pk])]
    assert tasks(queues, "launch") == [("launch_resume", [launch.pk])]


def test_unreadable_or_foreign_held_messages_hold_nothing_back(project, root, queues):
    """What the broker says a worker holds is read defensively: an entry that is not a
    message, one whose arguments are not ids, and one taken from another host's queue
    (validate.node-3) keep no check of the central queue from being sent again."""
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"}, status="reported")
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        validation_enqueued_at=timezone.now() - timedelta(minutes=10)
    )
    publish.send(VALIDATE, (checkpoint.pk,), queue="validate.node-3")
    with taken_by_a_worker("validate.node-3"):
        unacked = {
            b"not-json": b"{{{",
            b"wrong-shape": b'{"a": 1}',
            b"no-body": json.dumps([{"headers": {}}, "", "validate"]).encode(),
            b"a-bool": json.dumps([{"body": json.dumps([[True], {}, {}]), "properties": {},
                                    "headers": {"task": VALIDATE}}, "", "validate"]).encode(),
            b"a-string": json.dumps([{"body": json.dumps([["1"], {}, {}]), "properties": {},
                                      "headers": {"task": VALIDATE}}, "", "validate"]).encode(),
        }  # fmt: skip
        queues.hset("unacked", mapping=unacked)
        queues.zadd("unacked_index", {tag: time.time() for tag in unacked})
        assert queues.hlen("unacked") == len(unacked) + 1  # and the host queue's message
        (owed,) = repair.sweep()
        assert "lost on its way to a worker" in owed.what
    assert tasks(queues, "validate") == [("validate_checkpoint", [checkpoint.pk])]


def test_a_copy_whose_worker_died_is_handed_back_and_sent_again_once(project, root, s3, queues):
    target = make_target(project, s3, "main")
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"})
    replica = Replica.objects.create(
        checkpoint=checkpoint,
        target=target,
        status="uploading",
        worker="node-2",
        attempts=1,
        lease_until=timezone.now() - timedelta(seconds=1),
    )
    (owed,) = repair.sweep()
    assert "stopped mid-copy" in owed.what
    replica.refresh_from_db()
    assert (replica.status, replica.worker) == ("pending", "")
    assert tasks(queues, "replicate") == [("replicate", [replica.pk])]
    assert repair.sweep() == []

    assert isinstance(replicate.claim(replica.pk), replicate.Claim)


def test_a_deletion_left_half_done_is_finished(project, root, queues):

    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"})
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        status="deleting", updated_at=timezone.now() - LONG_AGO
    )
    (owed,) = repair.sweep()
    assert (owed.stage, owed.project_id) == ("retention", project.pk)
    [(name, args)] = tasks(queues, "validate")
    assert (name, args[0]) == ("finish_interrupted", project.pk)
    finish_interrupted(*args)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "deleted"
    assert not (root / "run-1" / "step-1").exists()


def test_lost_restore_tests_and_resumes_are_sent_again_and_a_stuck_one_fails(project, root, queues):
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"})
    long_ago = timezone.now() - LONG_AGO
    restore = Validation.objects.create(checkpoint=checkpoint, kind="restore", created_at=long_ago)
    profile = LaunchProfile.objects.create(project=project, name="p", command_template="true")

    def resume(**fields) -> Resume:
        fields = {"created_at": long_ago, "updated_at": long_ago, **fields}
        return Resume.objects.create(
            project=project, run=checkpoint.run, checkpoint=checkpoint, profile=profile, **fields
        )

    never_launched = resume()
    unfollowed = resume(status="running", external_id="pid:1", followed_at=long_ago)
    followed = resume(status="running", external_id="pid:1", followed_at=timezone.now())
    stuck = resume(status="restoring", updated_at=timezone.now() - timedelta(hours=2))

    done = repair.sweep()

    assert sorted(o.stage for o in done) == ["launch", "launch", "launch", "restore"]
    assert tasks(queues, "restore") == [("restore_test", [restore.pk])]
    assert sorted(tasks(queues, "launch")) == [
        ("follow_resume", [unfollowed.pk]),
        ("launch_resume", [never_launched.pk]),
    ]
    followed.refresh_from_db()
    assert followed.status == "running"
    stuck.refresh_from_db()
    assert stuck.status == "failed"
    assert "the launch worker stopped while the resume was restoring" in stuck.error
    assert Event.objects.filter(type="resume.failed", data__resume=stuck.pk).exists()


def test_a_second_chain_of_follow_tasks_ends_itself(project, root):

    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"})
    running = Resume.objects.create(
        project=project, run=checkpoint.run, checkpoint=checkpoint, status="running"
    )
    assert resumes.follow_due(running.pk)
    assert not resumes.follow_due(running.pk)  # another chain just looked


def test_repairs_are_on_the_timeline_in_metrics_and_a_problem_when_they_keep_happening(
    project, root, queues, client, settings
):
    settings.METRICS_PUBLIC = True
    settings.SWEEP_PROBLEM_PER_HOUR = 2
    for step in (1, 2):
        checkpoint = make_checkpoint(project, root, step, {"m": b"x"})
        running_check(checkpoint, lease_until=timezone.now() - timedelta(seconds=1))
    assert problems.summary(project.pk) == []

    assert len(repair.sweep()) == 2

    event = Event.objects.filter(type="repair.resent").first()
    assert event.run.key == "run-1" and event.actor == "system:sweeper"
    body = client.get("/metrics").content.decode()
    assert 'lifeboat_repairs_total{stage="validate"} 2' in body
    (problem,) = problems.summary(project.pk)
    assert problem["count"] == 2 and "sent again by the sweeper" in problem["label"]


def test_a_task_that_meets_a_deadlock_is_tried_again(settings):

    settings.TASK_RETRY_MAX_S = 1
    calls = []

    @app.task(name="tests.flaky", bind=True)
    def flaky(self):
        calls.append(self.request.retries)
        if len(calls) < 3:
            raise OperationalError("deadlock detected")
        return "done"

    assert flaky.apply().get() == "done"
    assert calls == [0, 1, 2]


def test_a_permanent_error_is_not_retried(settings):

    calls = []

    @app.task(name="tests.broken")
    def broken():
        calls.append(1)
        raise ValueError("a bug, not a blip")

    with pytest.raises(ValueError):
        broken.apply().get()
    assert calls == [1]


def test_what_counts_as_transient():

    def s3(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": ""}}, "PutObject")

    assert is_transient(OperationalError("could not serialize access"))
    assert is_transient(BrokerDown("connection refused"))
    assert is_transient(s3("SlowDown"))
    assert is_transient(EndpointConnectionError(endpoint_url="http://s3"))
    assert not is_transient(s3("AccessDenied"))
    assert not is_transient(s3("NoSuchBucket"))
    assert not is_transient(ValueError("x"))
