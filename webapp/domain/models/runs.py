"""Runs: one training job each, keyed by the client's run key within a project."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class RunStatus(models.TextChoices):
    RUNNING = "running", "Running"
    FINISHED = "finished", "Finished"
    FAILED = "failed", "Failed"


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
    created_at = models.DateTimeField(default=timezone.now)

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

    def latest_verified_checkpoint(self):
        from webapp.domain.models.checkpoints import CheckpointStatus

        return self.checkpoints.filter(status=CheckpointStatus.VERIFIED).order_by("-step").first()
