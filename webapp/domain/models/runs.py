"""Runs: one training job each, keyed by the client's run key within a project."""

from __future__ import annotations

import json

from django.db import connection, models
from django.db.models import Func, OuterRef, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from webapp.domain.run_health import HEALTH_GRACE  # noqa: F401 (re-exported)


class RunStatus(models.TextChoices):
    RUNNING = "running", "Running"
    FINISHED = "finished", "Finished"
    FAILED = "failed", "Failed"


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


class RunQuerySet(models.QuerySet):
    def with_dashboard_stats(self):
        """One row per run with what the project page shows, each from a correlated
        subquery on an index, so the number of queries does not grow with the rows:
        last_checkpoint_at (newest saved step), latest_verified_step, storage_bytes
        (sum of the sizes of checkpoints not deleted) and verified_replicas."""
        from webapp.domain.models.checkpoints import Checkpoint, CheckpointStatus, resumable_q
        from webapp.domain.models.recovery import Replica, ReplicaStatus

        of_run = Checkpoint.objects.filter(run=OuterRef("pk"))
        saved = of_run.exclude(
            status__in=(CheckpointStatus.SAVING, CheckpointStatus.FAILED)
        ).order_by("-step")
        # "Latest verified": what a resume can start from, a verified replica included.
        verified = of_run.filter(resumable_q()).order_by("-step")
        storage = (
            of_run.exclude(status=CheckpointStatus.DELETED)
            .order_by()
            .values("run")
            .annotate(total=Sum("total_size"))
            .values("total")
        )
        replicas = (
            Replica.objects.filter(checkpoint__run=OuterRef("pk"), status=ReplicaStatus.VERIFIED)
            .order_by()
            .values("checkpoint__run")
            .annotate(n=models.Count("pk"))
            .values("n")
        )
        return self.annotate(
            last_checkpoint_at=Subquery(saved.values("saved_at")[:1]),
            latest_verified_step=Subquery(verified.values("step")[:1]),
            storage_bytes=Coalesce(
                Subquery(storage), Value(0), output_field=models.BigIntegerField()
            ),
            verified_replicas=Coalesce(
                Subquery(replicas), Value(0), output_field=models.IntegerField()
            ),
        )

    def with_problem_counts(self):
        """Annotate corrupt_checkpoints and suspicious_checkpoints: two counts per run,
        each on the (run, status, step) index."""
        from webapp.domain.models.checkpoints import Checkpoint, CheckpointStatus

        def count(status):
            rows = (
                Checkpoint.objects.filter(run=OuterRef("pk"), status=status)
                .order_by()
                .values("run")
                .annotate(n=models.Count("pk"))
                .values("n")
            )
            return Coalesce(Subquery(rows), Value(0), output_field=models.IntegerField())

        return self.annotate(
            corrupt_checkpoints=count(CheckpointStatus.CORRUPT),
            suspicious_checkpoints=count(CheckpointStatus.SUSPICIOUS),
        )

    def with_health(self, now=None):
        """Annotate `health` (a Health value), `health_since` and `checkpoint_age_s`:
        the one rule of webapp/domain/run_health.py."""
        from webapp.domain import run_health

        return run_health.annotate(self, now)

    def tagged(self, tag: str):
        """The runs that carry `tag`."""
        if connection.vendor == "postgresql":
            return self.filter(tags__contains=[tag])
        # SQLite has no JSON containment: match the quoted element in the JSON text.
        return self.filter(tags__icontains=json.dumps(tag))


class Run(models.Model):
    project = models.ForeignKey("domain.Project", on_delete=models.CASCADE, related_name="runs")
    key = models.CharField(max_length=200)
    name = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING)
    host = models.CharField(max_length=255, blank=True)
    framework = models.CharField(max_length=100, blank=True)
    world_size = models.PositiveIntegerField(null=True, blank=True)
    config = models.JSONField(default=dict, blank=True)
    tags = models.JSONField(default=list, blank=True)
    expected_interval_s = models.FloatField(null=True, blank=True)
    # Lineage: the checkpoint this run was resumed from, as the client said it.
    resumed_from = models.ForeignKey(
        "domain.Checkpoint",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="resumed_runs",
    )
    resumed_from_ref = models.CharField(max_length=100, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_step = models.BigIntegerField(null=True, blank=True)
    last_metrics = models.JSONField(default=dict, blank=True)
    # What the alerts last said about it (up, overdue, failed, ended): a change of this
    # column, made with a conditional UPDATE, is what records an alert once.
    alert_state = models.CharField(max_length=16, blank=True, default="")
    # expected_interval_s was learned from the checkpoints, not sent by the job.
    interval_learned = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    objects = RunQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "key"], name="run_key_unique")]
        indexes = [
            # The run list of a project, newest activity first (dashboard, GET /runs).
            models.Index(fields=["project", "-last_seen_at"], name="run_project_seen"),
            models.Index(fields=["project", "status"], name="run_project_status"),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def is_final(self) -> bool:
        return self.status in (RunStatus.FINISHED, RunStatus.FAILED)

    def health(self, now=None) -> str:
        """up / late / overdue against expected_interval_s (see Health), measured from
        the newest saved checkpoint, or from the start while there is none: the SQL rule
        of webapp/domain/run_health.py, asked for this one run."""
        from webapp.domain import run_health

        return run_health.of(self, now).health

    def latest_verified_checkpoint(self):
        from webapp.domain.models.checkpoints import CheckpointStatus

        return self.checkpoints.filter(status=CheckpointStatus.VERIFIED).order_by("-step").first()

    def latest_resumable_checkpoint(self):
        """The newest checkpoint a resume can start from (checkpoints.resumable_q)."""
        from webapp.domain.models.checkpoints import resumable_q

        return self.checkpoints.filter(resumable_q()).order_by("-step").first()
