"""Keeps each run's share of its training's goodput ledger (models/goodput.py), so that a
project's view of thousands of trainings reads one row a run instead of every event
(goodput_report.py reads them).

A pass (the beat task workers.analytics.refresh_goodput, every GOODPUT_REFRESH_S) computes
again the families of the runs that need it: runs without a row, runs still running (their
time grows), and runs with events received since the previous pass. A family is computed
whole (a resume changes its parent's lost work), from the same events and with the same
code as the run page's ledger (goodput.py), so the two agree. Safe to run twice: each pass
writes the figures the events give at its time.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from webapp.domain.health import goodput
from webapp.domain.models import Event, Project, Run, RunGoodput

FIGURES = (*goodput.SHARE_FIGURES, "failures", "preemptions", "gpus")
# Events received this long before the previous pass began are taken as already seen: the
# margin covers an ingest transaction that committed after the pass read.
MARGIN = timedelta(seconds=60)


def refresh_family(run: Run, now=None) -> set[int]:
    """Computes the ledger of `run`'s training and writes every member's row; returns the
    ids of the runs written."""
    now = now or timezone.now()
    members = goodput.family_of(run)
    root = members[0]
    measured = goodput.ledger(goodput.attempts_of(members), now)
    rows = []
    for member in members:
        share = measured.runs.get(member.pk)
        row = RunGoodput(run=member, project_id=member.project_id, family=root, computed_at=now)
        if share is None:  # no event yet that starts an attempt: a row of zeros
            row.started_at = member.started_at or member.created_at
            row.ended_at = member.ended_at
        else:
            row.started_at, row.ended_at = share["start"], share["end"]
            for name in FIGURES:
                setattr(row, name, share[name])
        rows.append(row)
    with transaction.atomic():
        RunGoodput.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["run"],
            update_fields=[
                "project", "family", "started_at", "ended_at", "computed_at", *FIGURES
            ],
        )  # fmt: skip
    return {member.pk for member in members}


def due(project: Project, now=None) -> set[int]:
    """The ids of the project's runs whose rows are missing or out of date."""
    now = now or timezone.now()
    runs = Run.objects.filter(project=project)
    todo = set(runs.filter(goodput__isnull=True).values_list("pk", flat=True))
    todo |= set(
        RunGoodput.objects.filter(project=project, ended_at__isnull=True).values_list(
            "run_id", flat=True
        )
    )
    # Per run, against that run's own pass: a pass cut short by GOODPUT_REFRESH_MAX_RUNS
    # leaves the others' rows older, and their new events still count.
    todo |= set(
        Event.objects.filter(
            project=project, run__goodput__computed_at__lte=F("received_at") + MARGIN
        )
        .values_list("run_id", flat=True)
        .distinct()
    )
    return todo


def refresh_project(project: Project, now=None, limit: int | None = None) -> int:
    """One pass over `project`; returns how many runs' rows were written."""
    now = now or timezone.now()
    limit = limit or settings.GOODPUT_REFRESH_MAX_RUNS
    done: set[int] = set()
    for run in Run.objects.filter(pk__in=sorted(due(project, now))).order_by("pk"):
        if run.pk in done:
            continue
        done |= refresh_family(run, now)
        if len(done) >= limit:  # the next pass goes on; a pass stays bounded
            break
    return len(done)


def refresh_all(now=None) -> int:
    now = now or timezone.now()
    return sum(refresh_project(project, now) for project in Project.objects.all())


def as_of(project: Project):
    """When the project's rows were last computed (None: never)."""
    return RunGoodput.objects.filter(project=project).aggregate(at=Max("computed_at"))["at"]


def stale_after() -> timedelta:
    return timedelta(seconds=settings.GOODPUT_REFRESH_S)
