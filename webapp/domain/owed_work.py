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


def handed_back_before(now: datetime, queue: str | list[str]) -> datetime:
    """Work a sweep handed back to the queue gets a lease of SWEEP_LOST_AFTER_S from
    then; one whose lease ends before this was lost again (see lost_before)."""
    return lost_before(now, queue) + timedelta(seconds=settings.SWEEP_LOST_AFTER_S)


def stuck_before(now: datetime) -> datetime:
    """Work with no sign of life since before this (a deletion, a resume being prepared)
    was interrupted."""
    return now - timedelta(seconds=settings.SWEEP_STUCK_S)
