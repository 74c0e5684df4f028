"""The storage ledger's history: what each storage target of a project held, and what the
project's own file systems held, at each pass of workers.replicate.measure_storage
(webapp/domain/replication/ledger.py). The newest rows are what the storage page, the
API and the gauges show (a pass over every replica is the worker's, not a request's); all
of them draw the chart of stored bytes over time."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class StorageSnapshot(models.Model):
    project = models.ForeignKey("domain.Project", on_delete=models.CASCADE, related_name="+")
    # None: the checkpoints' local copies, where the jobs wrote them.
    target = models.ForeignKey(
        "domain.StorageTarget", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    taken_at = models.DateTimeField(default=timezone.now)
    # Each object counted once, however many replicas name it.
    stored_bytes = models.BigIntegerField(default=0)
    stored_objects = models.BigIntegerField(default=0)
    # Each copy counted whole: what the same copies would take without deduplication.
    logical_bytes = models.BigIntegerField(default=0)
    copies = models.IntegerField(default=0)
    # What the retention policy now in force would free, and what it freed so far.
    would_free_bytes = models.BigIntegerField(default=0)
    freed_bytes = models.BigIntegerField(default=0)
    # The runs that store most here: [{run, stored_bytes}] (each object counts for the
    # run that named it first), at most ledger.TOP_RUNS_KEPT of them.
    runs = models.JSONField(default=list, blank=True)
    runs_total = models.IntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["project", "taken_at"], name="ledger_project_time")]

    def __str__(self) -> str:
        return f"storage of project {self.project_id} at {self.taken_at:%Y-%m-%d %H:%M}"
