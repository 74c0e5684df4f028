"""Reads about the project as a whole (scope read): its problems, the live workers per
queue and host with the hosts whose work nobody takes, and its goodput
(webapp/domain/health/)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from ninja import Query, Router, Schema
from pydantic import AfterValidator, BeforeValidator

from webapp.api.auth import read_auth
from webapp.api.params import Limit
from webapp.domain.health import goodput_report, live_workers, problems

router = Router(tags=["project"])


class ProblemOut(Schema):
    label: str
    count: int
    tone: str


class QueueOut(Schema):
    queue: str
    workers: list[str]


class StrandedOut(Schema):
    host: str
    queues: list[str]
    waiting: int  # validation parts and replica legs


class WorkersOut(Schema):
    # When a sweep last asked the workers (None: none asked lately, nothing is known).
    asked_at: datetime | None
    queues: list[QueueOut]
    # Hosts with node-local parts of this project's checkpoints waiting, no worker alive.
    stranded: list[StrandedOut]


@router.get("/problems", auth=read_auth, response={200: list[ProblemOut]})
def list_problems(request):
    """What the runs list shows as problems: overdue and failed runs, damaged or
    incomplete checkpoints, repeated repairs, hosts with no worker."""
    return problems.summary(request.auth.project.pk)


@router.get("/workers", auth=read_auth, response={200: WorkersOut})
def list_workers(request):
    """The workers alive at the last sweep, per queue; and the hosts whose queue holds
    this project's work with no worker to take it."""
    known = live_workers.snapshot()
    stranded = live_workers.stranded_hosts(request.auth.project.pk)
    return {
        "asked_at": known["at"] if known else None,
        "queues": [{"queue": q, "workers": w} for q, w in live_workers.by_queue(known).items()],
        "stranded": [
            {"host": host, "queues": sorted(entry["queues"]), "waiting": entry["waiting"]}
            for host, entry in sorted(stranded.items())
        ],
    }


ISO_START = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_only(value):
    """An ISO 8601 time, not the Unix timestamp pydantic would also take for one."""
    if isinstance(value, str) and ISO_START.match(value):
        return value
    raise ValueError("an ISO 8601 time, e.g. 2026-11-01T00:00:00Z")


def _utc(value: datetime) -> datetime:
    """In UTC (a time without a zone is UTC, as in events): PostgreSQL refuses offsets past
    15:59, which ISO 8601 allows; a time past the calendar's ends is that end."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return (datetime.min if value.year < 2 else datetime.max).replace(tzinfo=UTC)


Since = Annotated[datetime, BeforeValidator(_iso_only), AfterValidator(_utc)]


@router.get("/goodput", auth=read_auth, response={200: dict[str, Any]})
def project_goodput(
    request,
    since: Annotated[Since | None, Query()] = None,
    group_by: Annotated[Literal[goodput_report.GROUPS], Query()] = "run",
    limit: Limit = 20,
):
    """How much of the project's GPU time became kept progress and where the rest went,
    with the trainings, tags or hosts that lost most, and the measured MTBF
    (docs/analytics.md, "A project's goodput")."""
    return goodput_report.report(request.auth.project, since, group_by, limit)
