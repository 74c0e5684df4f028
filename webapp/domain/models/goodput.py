"""Each run's share of its training's goodput ledger, kept so that a project's view over
thousands of runs reads rows instead of every event (webapp/domain/health/goodput_store.py
writes them; docs/analytics.md, "Goodput")."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class RunGoodput(models.Model):
    run = models.OneToOneField(
        "domain.Run", primary_key=True, on_delete=models.CASCADE, related_name="goodput"
    )
    project = models.ForeignKey("domain.Project", on_delete=models.CASCADE, related_name="+")
    # The first run of its training (family): the project's view groups trainings by it.
    family = models.ForeignKey("domain.Run", on_delete=models.CASCADE, related_name="+")
    started_at = models.DateTimeField()  # its first attempt's start
    ended_at = models.DateTimeField(null=True, blank=True)  # None: still running
    gpus = models.PositiveIntegerField(default=1)
    # Seconds. wall_seconds is the run's share of the training's elapsed time: its
    # productive time and badput less its overlap, so a family's rows sum to its ledger.
    wall_seconds = models.FloatField(default=0)
    running_seconds = models.FloatField(default=0)  # its attempts' own time: MTBF exposure
    productive_seconds = models.FloatField(default=0)
    checkpoint_save = models.FloatField(default=0)
    lost_work = models.FloatField(default=0)
    restart = models.FloatField(default=0)
    restore = models.FloatField(default=0)
    idle = models.FloatField(default=0)
    other = models.FloatField(default=0)
    overlap_seconds = models.FloatField(default=0)
    gpu_seconds = models.FloatField(default=0)
    productive_gpu_seconds = models.FloatField(default=0)
    failures = models.PositiveIntegerField(default=0)
    preemptions = models.PositiveIntegerField(default=0)
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["project", "started_at"], name="goodput_project_start"),
            models.Index(fields=["family"], name="goodput_family"),
        ]

    def __str__(self) -> str:
        return f"goodput of run {self.run_id}"
