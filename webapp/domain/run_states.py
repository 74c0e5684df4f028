"""A run's status and health, as values and SQL: below the models (runs.py) and the
health rule (webapp/domain/health/run_health.py), which both read them."""

from __future__ import annotations

from django.db import models
from django.db.models import Func


class RunStatus(models.TextChoices):
    RUNNING = "running", "Running"
    FINISHED = "finished", "Finished"
    FAILED = "failed", "Failed"
    # Stopped by its scheduler (run.preempted): not a failure (docs/restore.md).
    PREEMPTED = "preempted", "Preempted"


ENDED = (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.PREEMPTED)


class Health(models.TextChoices):
    """How a run's checkpoints keep time, as healthchecks shows checks: up within its
    expected interval, late within the interval plus a grace period, overdue beyond."""

    UP = "up", "Up"
    LATE = "late", "Late"
    OVERDUE = "overdue", "Overdue"
    UNKNOWN = "unknown", "No interval"  # the run never said how often it checkpoints
    ENDED = "ended", "Ended"  # finished or failed: nothing more is expected


class SecondsBetween(Func):
    """Seconds from `start` to `end` (two datetimes), as a float, in SQL."""

    output_field = models.FloatField()
    arity = 2

    def as_sql(self, compiler, connection, **extra):
        # PostgreSQL (and anything that speaks EXTRACT EPOCH).
        return super().as_sql(
            compiler, connection, template="EXTRACT(EPOCH FROM (%(expressions)s))",
            arg_joiner=" - ", **extra,
        )  # fmt: skip

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(
            compiler, connection, template="((julianday(%(expressions)s)) * 86400.0)",
            arg_joiner=") - julianday(", **extra,
        )  # fmt: skip
