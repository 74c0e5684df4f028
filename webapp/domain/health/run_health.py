"""A run's health, the one rule that the dashboard, the alerts, the API and the badges
share: up while its newest checkpoint (or its start, before any) is younger than its
expected interval, late within the interval plus a grace period, overdue beyond; ended
once it finished or failed; unknown while it never said (nor was learned) how often it
checkpoints.

The rule is written once, as SQL (annotate()), so that lists filter and sort by it with
a constant number of queries; limits() is the single place its thresholds are set, and
next_deadline() reads the same annotations."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from webapp.domain.run_states import ENDED, Health, SecondsBetween

# The grace period, as a fraction of the expected interval (a save is rarely punctual).
HEALTH_GRACE = 0.5

# What the API says: up / late / overdue, or not_watched (ended, or no interval).
API_STATES = ("up", "late", "overdue", "not_watched")


def limits(interval):
    """(late after, overdue after), in seconds since the newest checkpoint, for an
    expected interval in seconds; a number or an F() expression alike."""
    return interval, interval * (1 + HEALTH_GRACE)


def annotate(queryset, now=None):
    """Annotate `health` (a Health value), `health_since` (the newest saved checkpoint's
    time, else the start, else the creation) and `checkpoint_age_s` (seconds since it).
    Adds `last_checkpoint_at` itself unless the queryset has it already: from RunStats,
    which triggers keep (webapp/domain/models/runs.py), so that filtering 10,000 runs by
    health reads no checkpoint."""
    now = now or timezone.now()
    if "last_checkpoint_at" not in queryset.query.annotations:
        queryset = queryset.annotate(last_checkpoint_at=F("stats__last_checkpoint_at"))
    late_after, overdue_after = limits(F("expected_interval_s"))
    return queryset.annotate(
        health_since=Coalesce(F("last_checkpoint_at"), F("started_at"), F("created_at"))
    ).annotate(
        checkpoint_age_s=SecondsBetween(
            Value(now, output_field=models.DateTimeField()), F("health_since")
        ),
        health=Case(
            When(status__in=ENDED, then=Value(Health.ENDED)),
            When(
                Q(expected_interval_s__isnull=True) | Q(expected_interval_s__lte=0),
                then=Value(Health.UNKNOWN),
            ),
            When(checkpoint_age_s__lte=late_after, then=Value(Health.UP)),
            When(checkpoint_age_s__lte=overdue_after, then=Value(Health.LATE)),
            default=Value(Health.OVERDUE),
            output_field=models.CharField(),
        ),
    )


def watched(queryset):
    """Only the runs that can be up, late or overdue (not ended, with an interval): the
    same rule as annotate()'s first two cases, said as plain conditions, so that a filter
    on one of those healths skips the other runs before the health of each is computed
    (the project page filtered to overdue runs, bench/pages.py)."""
    return queryset.exclude(status__in=ENDED).filter(expected_interval_s__gt=0)


def api_state(health: str) -> str:
    """The API's word for a Health value: ended and unknown runs are not watched."""
    return health if health in ("up", "late", "overdue") else "not_watched"


def api_filter(state: str) -> Q:
    """The rows whose api_state() is `state` (one of API_STATES), on annotate()d rows."""
    if state == "not_watched":
        return Q(health__in=("ended", "unknown"))
    return Q(health=state)


@dataclass(frozen=True)
class RunHealth:
    health: str  # a Health value
    next_deadline: datetime | None  # when it turns late (if up) or overdue (if late)

    @property
    def api_state(self) -> str:
        return api_state(self.health)


def of(run, now=None) -> RunHealth:
    """The health of one run: from its annotations when the row came from annotate(),
    otherwise with one query (the same SQL)."""
    if isinstance(getattr(run, "health", None), str) and hasattr(run, "health_since"):
        health, since, interval = run.health, run.health_since, run.expected_interval_s
    elif now is None and getattr(run, "_run_health", None) is not None:
        return run._run_health  # asked again for the same row in the same answer
    else:
        # The run's own model: this module sits below webapp.domain.models.
        row = annotate(type(run).objects.filter(pk=run.pk), now).values(
            "health", "health_since", "expected_interval_s"
        )
        row = row.first() or {}
        health, since = row.get("health"), row.get("health_since")
        interval = row.get("expected_interval_s")
        answer = RunHealth(health or "unknown", next_deadline(health, since, interval))
        if now is None:
            run._run_health = answer
        return answer
    return RunHealth(health or "unknown", next_deadline(health, since, interval))


def next_deadline(health: str | None, since: datetime | None, interval: float | None):
    """The time the run turns late (while up) or overdue (while late); None otherwise."""
    if since is None or not interval or health not in ("up", "late"):
        return None
    late_after, overdue_after = limits(interval)
    try:
        return since + timedelta(seconds=late_after if health == "up" else overdue_after)
    except (OverflowError, ValueError):
        # Past year 9999: a row from before event times and intervals were bounded
        # (event_schema.py). No deadline rather than a failed answer for the project.
        return None
