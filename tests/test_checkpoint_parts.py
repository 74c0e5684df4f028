"""A checkpoint written by many ranks, each reporting its own part (docs/api.md, "Checkpoints
written by many ranks"): the parts of (run, step) join into one checkpoint, checked only
once every rank has reported, marked incomplete with the missing ranks after the wait,
never verified with a part missing; repeated and late parts change nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.celery_workers import queued_tasks
from tests.support.events import SHA, event, saved
from webapp.domain import parts_deadline
from webapp.domain.models import Checkpoint, CheckpointPart, Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]

LOCATION = "/data/run-1/step-100"


def part(rank: int, world_size: int = 3, t: float = 0, host: str = "", **fields) -> dict:
    """Rank `rank`'s part: its shard, and the shared .metadata on rank 0."""
    files = [{"path": f"__{rank}_0.distcp", "size": 100 + rank, "sha256": SHA}]
    if rank == 0:
        files.append({"path": ".metadata", "size": 10, "sha256": "cd" * 32})
    body = saved(t=t, location=LOCATION, files=files, format="dcp")
    body["part"] = {"rank": rank, "world_size": world_size, "host": host or f"node-{rank}"}
    body.update(fields)
    return body


def post(api, token, *bodies):
    answer = api.post_events(token, {"events": list(bodies)})
    assert answer.status_code == 202, answer.content
    return answer


def checks_queued(queues) -> list:
    return [t["args"] for t in queued_tasks(queues) if t["task"].endswith("validate_checkpoint")]


def test_the_parts_of_every_rank_join_into_one_checkpoint_checked_once_whole(api, token, queues):
    post(api, token, part(0, t=1), part(2, t=2))
    checkpoint = Checkpoint.objects.get()
    assert checkpoint.status == "saving"
    assert checkpoint.status_message == "2 of 3 ranks reported their part; waiting for rank 1"
    assert checks_queued(queues) == []  # nothing is checked with a part missing

    post(api, token, part(1, t=3))
    checkpoint.refresh_from_db()
    assert (checkpoint.status, checkpoint.world_size) == ("reported", 3)
    files = sorted(checkpoint.files.values_list("path", "rank"))
    assert files == [
        (".metadata", 0), ("__0_0.distcp", 0), ("__1_0.distcp", 1), ("__2_0.distcp", 2)
    ]  # fmt: skip
    assert (checkpoint.file_count, checkpoint.total_size) == (4, 100 + 101 + 102 + 10)
    hosts = dict(CheckpointPart.objects.values_list("rank", "host"))
    assert hosts == {0: "node-0", 1: "node-1", 2: "node-2"}
    assert checks_queued(queues) == [[checkpoint.pk]]


def test_a_repeated_or_late_part_changes_nothing(api, token, queues):
    post(api, token, part(0, t=1), part(1, t=1), part(2, t=1))
    checkpoint = Checkpoint.objects.get()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified", status_message="ok")
    queues.flushdb()

    # The same part again under a new id (a client that re-sent it), then an older
    # report of rank 1's part with other files: neither touches the verified checkpoint.
    post(api, token, part(2, t=1))
    older = part(1, t=0.5)
    older["files"][0]["size"] = 999
    post(api, token, older)
    checkpoint.refresh_from_db()
    assert (checkpoint.status, checkpoint.status_message) == ("verified", "ok")
    assert checkpoint.files.get(rank=1).size == 101
    assert checks_queued(queues) == []


def test_a_rank_that_saves_its_part_again_replaces_only_its_files(api, token, queues):
    post(api, token, part(0, t=1), part(1, t=1), part(2, t=1))
    checkpoint = Checkpoint.objects.get()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    queues.flushdb()
    again = part(1, t=5)
    again["files"] = [{"path": "__1_0.distcp", "size": 7, "sha256": "ef" * 32}]
    post(api, token, again)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "reported"  # checked again, as a whole
    assert sorted(checkpoint.files.values_list("path", "size")) == [
        (".metadata", 10), ("__0_0.distcp", 100), ("__1_0.distcp", 7), ("__2_0.distcp", 102)
    ]  # fmt: skip
    assert checks_queued(queues) == [[checkpoint.pk]]


def test_a_part_at_another_location_starts_the_step_over(api, token):
    post(api, token, part(0, t=1), part(1, t=1), part(2, t=1))
    moved = part(0, t=10, location="/data/run-1/step-100-b")
    post(api, token, moved)
    checkpoint = Checkpoint.objects.get()
    assert checkpoint.status == "saving" and checkpoint.location.endswith("-b")
    assert sorted(checkpoint.files.values_list("path", flat=True)) == [".metadata", "__0_0.distcp"]
    assert list(checkpoint.parts.values_list("rank", flat=True)) == [0]


def test_a_whole_report_still_works_and_replaces_parts(api, token):
    post(api, token, part(0, t=1))
    post(api, token, saved(t=5, location=LOCATION))  # one process reported the whole
    checkpoint = Checkpoint.objects.get()
    assert (checkpoint.status, checkpoint.world_size) == ("reported", None)
    assert sorted(checkpoint.files.values_list("path", "rank")) == [
        ("model.pt", None), ("optim.pt", None)
    ]  # fmt: skip
    assert not CheckpointPart.objects.exists()


def test_a_rank_that_never_reports_makes_the_checkpoint_incomplete_never_checked(
    api, token, queues, settings
):
    settings.CHECKPOINT_PARTS_WAIT_S = 600
    post(api, token, part(0, world_size=5, t=1), part(2, world_size=5, t=1))
    checkpoint = Checkpoint.objects.get()
    assert parts_deadline.close_overdue() == []  # not yet past the wait
    later = timezone.now() + timedelta(seconds=601)
    assert parts_deadline.close_overdue(now=later) == [checkpoint.pk]
    checkpoint.refresh_from_db()
    assert checkpoint.status == "incomplete"
    assert checkpoint.status_message == (
        "incomplete: ranks 1, 3, 4 never reported (2 of 5 parts); never checked"
    )
    note = Event.objects.get(type="checkpoint.incomplete")
    assert note.data["missing_ranks"] == [1, 3, 4]
    # Asked to check it anyway, Lifeboat refuses and says why.
    answer = api.post(token, f"/checkpoints/{checkpoint.pk}/validate")
    assert answer.status_code == 409 and "ranks 1, 3, 4 never reported" in answer.json()["error"]
    assert checks_queued(queues) == []

    # The parts still arrive: the checkpoint is whole, and checked.
    post(api, token, *(part(r, world_size=5, t=2) for r in (1, 3)))
    checkpoint.refresh_from_db()
    assert checkpoint.status_message == (
        "incomplete: rank 4 never reported (4 of 5 parts); never checked"
    )
    post(api, token, part(4, world_size=5, t=3))
    checkpoint.refresh_from_db()
    assert checkpoint.status == "reported"
    assert checks_queued(queues) == [[checkpoint.pk]]


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"rank": 3}, "part", "rank 3 is not below world_size 3"),
        ({"rank": -1}, "part.rank", "greater than or equal to 0"),
        ({"world_size": 0}, "part.world_size", "greater than or equal to 1"),
        ({"host": "node/../x"}, "part.host", "letters, digits"),
        ({"rank": "1"}, "part.rank", "integer"),
    ],
)
def test_a_malformed_part_is_refused_naming_the_field(api, token, change, field, words):
    body = part(0)
    body["part"].update(change)
    answer = api.post_events(token, body)
    assert answer.status_code == 400
    assert answer.json()["field"] == field and words in answer.json()["error"]
    assert not Checkpoint.objects.exists()


def test_parts_of_one_checkpoint_in_one_batch_out_of_order(api, token):
    post(api, token, part(2, t=3), part(0, t=1), part(1, t=2), event("run.heartbeat", step=5))
    checkpoint = Checkpoint.objects.get()
    assert checkpoint.status == "reported"
    assert checkpoint.parts.count() == 3


def test_a_world_of_a_million_ranks_is_named_without_walking_it(api, token):
    """The largest world size a job may send, on 200 checkpoints in one batch: each is
    described from the parts it has (walking 2^20 ranks per event was seconds a batch)."""
    bodies = [part(0, world_size=2**20, step=s) for s in range(200)]
    post(api, token, *bodies)
    checkpoint = Checkpoint.objects.get(step=7)
    assert checkpoint.status_message == (
        "1 of 1048576 ranks reported their part; waiting for ranks 1, 2, 3, 4, 5, 6, 7, 8, "
        "9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20 and 1,048,555 more"
    )
    assert checkpoint.missing_parts(3) == [1, 2, 3]
