"""Runs: one training job each, keyed by the client's run key within a project."""

from __future__ import annotations

from django.db import models
from django.db.models import Case, F, Func, OuterRef, Q, Subquery, Sum, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone


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


# The grace period, as a fraction of the expected interval (a save is rarely punctual).
HEALTH_GRACE = 0.5


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
        from webapp.domain.models.checkpoints import Checkpoint, CheckpointStatus
        from webapp.domain.models.recovery import Replica, ReplicaStatus

        of_run = Checkpoint.objects.filter(run=OuterRef("pk"))
        saved = of_run.exclude(
            status__in=(CheckpointStatus.SAVING, CheckpointStatus.FAILED)
        ).order_by("-step")
        verified = of_run.filter(status=CheckpointStatus.VERIFIED).order_by("-step")
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

    def with_health(self, now=None):
        """Annotate `health` (a Health value) and `checkpoint_age_s`; needs
        with_dashboard_stats() first. Same rules as Run.health()."""
        now = now or timezone.now()
        since = Coalesce(F("last_checkpoint_at"), F("started_at"), F("created_at"))
        interval = F("expected_interval_s")
        return self.annotate(
            checkpoint_age_s=SecondsBetween(Value(now, output_field=models.DateTimeField()), since)
        ).annotate(
            health=Case(
                When(status__in=(RunStatus.FINISHED, RunStatus.FAILED), then=Value(Health.ENDED)),
                When(
                    Q(expected_interval_s__isnull=True) | Q(expected_interval_s__lte=0),
                    then=Value(Health.UNKNOWN),
                ),
                When(checkpoint_age_s__lte=interval, then=Value(Health.UP)),
                When(checkpoint_age_s__lte=interval * (1 + HEALTH_GRACE), then=Value(Health.LATE)),
                default=Value(Health.OVERDUE),
                output_field=models.CharField(),
            )
        )


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

    def health(self, now=None, last_checkpoint_at=None) -> str:
        """up / late / overdue against expected_interval_s (see Health), measured from
        the newest saved checkpoint, or from the start while there is none."""
        if self.is_final:
            return Health.ENDED
        if not self.expected_interval_s or self.expected_interval_s <= 0:
            return Health.UNKNOWN
        if last_checkpoint_at is None:
            last_checkpoint_at = getattr(self, "last_checkpoint_at", None)
        if last_checkpoint_at is None:
            from webapp.domain.models.checkpoints import CheckpointStatus

            newest = (
                self.checkpoints.exclude(
                    status__in=(CheckpointStatus.SAVING, CheckpointStatus.FAILED)
                )
                .order_by("-step")
                .values_list("saved_at", flat=True)
                .first()
            )
            last_checkpoint_at = newest
        since = last_checkpoint_at or self.started_at or self.created_at
        age = ((now or timezone.now()) - since).total_seconds()
        if age <= self.expected_interval_s:
            return Health.UP
        if age <= self.expected_interval_s * (1 + HEALTH_GRACE):
            return Health.LATE
        return Health.OVERDUE

    def latest_verified_checkpoint(self):
        from webapp.domain.models.checkpoints import CheckpointStatus

        return self.checkpoints.filter(status=CheckpointStatus.VERIFIED).order_by("-step").first()
