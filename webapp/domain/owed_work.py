"""When work the database says is owed counts as lost (the sweeper's leases), and the
record of one piece of it sent again: what every stage's owed.py uses to name its owed
work (repair.py runs them all)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from webapp.domain import publish


@dataclass(frozen=True)
class Owed:
    """One piece of work sent again, and why."""

    stage: str
    project_id: int
    what: str
    run_id: int | None = None
    checkpoint_id: int | None = None


def lost_before(now: datetime, queue: str | list[str]) -> datetime:
    """A message sent before this and not started is lost: SWEEP_LOST_AFTER_S ago when
    its queue is empty (nothing of ours waits there), else once the broker's visibility
    timeout has passed too (it may be waiting behind a backlog, or held by a worker)."""
    queues = [queue] if isinstance(queue, str) else queue
    grace = timedelta(seconds=settings.SWEEP_LOST_AFTER_S)
    if all(publish.waiting(q) == 0 for q in queues):
        return now - grace
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    return now - grace - timedelta(seconds=visibility)


def taken_ids(now: datetime, queue: str | list[str], tasks: dict[str, bool]) -> set[int]:
    """The ids in the messages of `tasks` (name: whether its first argument is a list of
    ids rather than one) that a worker took from `queue` within SWEEP_LOST_AFTER_S and
    has not finished. Not lost: a worker holds them, and is about to claim them. Read
    after lost_before's look at the queue, so that a message taken between the two is
    seen in one place or the other; on a loaded machine the claim can follow the take by
    a second or more, and a sweep in between took such a check for lost."""
    since = (now - timedelta(seconds=settings.SWEEP_LOST_AFTER_S)).timestamp()
    ids: set[int] = set()
    queues = [queue] if isinstance(queue, str) else queue
    taken = [task for q in queues for task in publish.taken_since(q, since)]
    for name, args in taken:
        if name not in tasks or not args:
            continue
        values = args[0] if tasks[name] else [args[0]]
        if isinstance(values, list):
            ids.update(v for v in values if isinstance(v, int) and not isinstance(v, bool))
    return ids


def handed_back_before(now: datetime, queue: str | list[str]) -> datetime:
    """Work a sweep handed back to the queue gets a lease of SWEEP_LOST_AFTER_S from
    then; one whose lease ends before this was lost again (see lost_before)."""
    return lost_before(now, queue) + timedelta(seconds=settings.SWEEP_LOST_AFTER_S)


def stuck_before(now: datetime) -> datetime:
    """Work with no sign of life since before this (a deletion, a resume being prepared)
    was interrupted."""
    return now - timedelta(seconds=settings.SWEEP_STUCK_S)
