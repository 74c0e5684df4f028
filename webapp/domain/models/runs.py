"""Runs: one training job each, keyed by the client's run key within a project."""

from __future__ import annotations

import json

from django.db import connection, models
from django.db.models import F, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from webapp.domain.health import run_health
from webapp.domain.health.run_health import HEALTH_GRACE  # noqa: F401 (re-exported)
from webapp.domain.models.checkpoints import Checkpoint, CheckpointStatus, resumable_q
from webapp.domain.models.recovery import Replica, ReplicaStatus
from webapp.domain.run_states import ENDED, Health, RunStatus, SecondsBetween  # noqa: F401 (re-exported)


class RunQuerySet(models.QuerySet):
    def with_dashboard_stats(self):
        """One row per run with what the project page shows, so the number of queries
        does not grow with the rows: the totals of with_totals() (last_checkpoint_at,
        storage_bytes, checkpoint_count), and from a correlated subquery on an index
        each, computed for the rows shown only, latest_verified_step and
        verified_replicas."""

        of_run = Checkpoint.objects.filter(run=OuterRef("pk"))
        # "Latest verified": what a resume can start from, a verified replica included.
        verified = of_run.filter(resumable_q()).order_by("-step")
        replicas = (
            Replica.objects.filter(checkpoint__run=OuterRef("pk"), status=ReplicaStatus.VERIFIED)
            .order_by()
            .values("checkpoint__run")
            .annotate(n=models.Count("pk"))
            .values("n")
        )
        return self.with_totals().annotate(
            latest_verified_step=Subquery(verified.values("step")[:1]),
            verified_replicas=Coalesce(
                Subquery(replicas), Value(0), output_field=models.IntegerField()
            ),
        )

    def with_totals(self):
        """last_checkpoint_at, storage_bytes and checkpoint_count from RunStats (one LEFT
        JOIN, kept by triggers): sorting and filtering on them reads no checkpoint."""
        return self.annotate(
            last_checkpoint_at=F("stats__last_checkpoint_at"),
            storage_bytes=Coalesce(
                F("stats__storage_bytes"), Value(0), output_field=models.BigIntegerField()
            ),
            checkpoint_count=Coalesce(
                F("stats__checkpoint_count"), Value(0), output_field=models.BigIntegerField()
            ),
        )

    def with_problem_counts(self):
        """Annotate corrupt_checkpoints and suspicious_checkpoints: two counts per run,
        each on the (run, status, step) index."""

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
        the one rule of webapp/domain/health/run_health.py."""

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
        return self.status in ENDED

    def health(self, now=None) -> str:
        """up / late / overdue against expected_interval_s (see Health), measured from
        the newest saved checkpoint, or from the start while there is none: the SQL rule
        of webapp/domain/health/run_health.py, asked for this one run."""

        return run_health.of(self, now).health

    def latest_verified_checkpoint(self):
        return (
            self.checkpoints.filter(status=CheckpointStatus.VERIFIED, quarantined_at__isnull=True)
            .order_by("-step")
            .first()
        )

    def latest_resumable_checkpoint(self):
        """The newest checkpoint a resume can start from (checkpoints.resumable_q)."""

        return self.checkpoints.filter(resumable_q()).order_by("-step").first()


class RunStats(models.Model):
    """Totals of a run's checkpoints, kept by database triggers on domain_checkpoint
    (migration 0014) in the same transaction as every insert, update and delete of a
    checkpoint, whoever writes it (the ingest function, bulk SQL, retention, workers):
    so the project page sorts 10,000 runs by storage, and filters them by health, without
    summing 1,000,000 checkpoints (docs/benchmarks.md, bench/pages.py).

    A table of its own rather than columns of Run: Run rows are saved whole by Python
    code that read them earlier, which would write back totals that are out of date, and
    the ingest path updates Run rows on every event already. Only the triggers write
    here; a run with no checkpoint yet may have no row (read through Coalesce)."""

    run = models.OneToOneField(
        Run, on_delete=models.CASCADE, primary_key=True, related_name="stats"
    )
    # Sum of total_size of the checkpoints not deleted (what the run keeps on disk).
    storage_bytes = models.BigIntegerField(default=0)
    # Every checkpoint row, whatever its status (the run page's table counts these).
    checkpoint_count = models.BigIntegerField(default=0)
    # The newest saved checkpoint (status neither saving nor failed): highest step.
    last_checkpoint_step = models.BigIntegerField(null=True, blank=True)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"stats of run {self.run_id}"
