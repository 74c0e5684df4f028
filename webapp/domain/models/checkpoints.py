"""Checkpoints: saved states of a run, the files they are made of, and the per-step
metrics a run reported (used to check that a resumed run follows the same path)."""

from __future__ import annotations

from django.db import models
from django.db.models import Exists, OuterRef
from django.utils import timezone

from webapp.domain.models.recovery import Replica, ReplicaStatus
from webapp.domain.ranks import missing_ranks


class CheckpointStatus(models.TextChoices):
    # Lifeboat heard checkpoint.started but not yet checkpoint.saved.
    SAVING = "saving", "Saving"
    # The job said the save failed (checkpoint.failed).
    FAILED = "failed", "Save failed"
    # Written by many ranks, and some never reported their part before the deadline
    # (CHECKPOINT_PARTS_WAIT_S): never checked, never verified (webapp/domain/parts.py).
    INCOMPLETE = "incomplete", "Incomplete"
    REPORTED = "reported", "Reported"
    VERIFYING = "verifying", "Verifying"
    VERIFIED = "verified", "Verified"
    SUSPICIOUS = "suspicious", "Suspicious"
    CORRUPT = "corrupt", "Corrupt"
    MISSING = "missing", "Missing"
    # Retention is removing the local copy (webapp/domain/retention/local_deletion.py).
    DELETING = "deleting", "Deleting"
    DELETED = "deleted", "Deleted"


# Never saved whole: nothing to check, copy or resume (a save still being written or
# reported part by part, a failed save, one whose ranks did not all report).
NOT_SAVED = (CheckpointStatus.SAVING, CheckpointStatus.FAILED, CheckpointStatus.INCOMPLETE)

# Statuses a validation task still has to settle; the sweeper looks for these.
UNSETTLED = (CheckpointStatus.REPORTED, CheckpointStatus.VERIFYING)

# What the runs list counts as problems of a run's checkpoints.
DAMAGED = (CheckpointStatus.CORRUPT, CheckpointStatus.SUSPICIOUS, CheckpointStatus.INCOMPLETE)

# The local copy is damaged or gone, but the bytes that were verified may live on in a
# replica (replicas are made of verified checkpoints only): resume.prepare() restores
# the local copy from a verified replica before the job starts.
LOCAL_COPY_LOST = (
    CheckpointStatus.CORRUPT,
    CheckpointStatus.MISSING,
    CheckpointStatus.DELETING,
    CheckpointStatus.DELETED,
)


def resumable_q() -> models.Q:
    """THE rule of what a run can be resumed from, as a filter on checkpoints: verified
    here, or its local copy lost and a replica verified; and not quarantined.
    resume.request() refuses what it excludes; the dashboard's pages, buttons and
    "latest verified" use it too."""

    replica = Replica.objects.filter(checkpoint=OuterRef("pk"), status=ReplicaStatus.VERIFIED)
    usable = models.Q(status=CheckpointStatus.VERIFIED) | models.Q(
        models.Q(status__in=LOCAL_COPY_LOST), Exists(replica)
    )
    return usable & models.Q(quarantined_at__isnull=True)


class Checkpoint(models.Model):
    project = models.ForeignKey(
        "domain.Project", on_delete=models.CASCADE, related_name="checkpoints"
    )
    # No index of its own: checkpoint_run_step_unique and the others lead with run_id,
    # and every index is one more write per checkpoint on the ingest path.
    run = models.ForeignKey(
        "domain.Run", on_delete=models.CASCADE, related_name="checkpoints", db_index=False
    )
    step = models.BigIntegerField()
    epoch = models.IntegerField(null=True, blank=True)
    saved_at = models.DateTimeField(null=True, blank=True)
    location = models.TextField(blank=True)
    format = models.CharField(max_length=50, blank=True)
    total_size = models.BigIntegerField(default=0)
    file_count = models.IntegerField(default=0)
    save_seconds = models.FloatField(null=True, blank=True)
    # Ranks that each report their own part (CheckpointPart); None when one process
    # reported the whole checkpoint.
    world_size = models.IntegerField(null=True, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    # What the last load check saw: {"tensors", "parameters", "dtypes", "keys": {name:
    # [dtype, shape]}}; the next checkpoint of the run is compared against it.
    content = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=16, choices=CheckpointStatus.choices, default=CheckpointStatus.REPORTED
    )
    status_message = models.TextField(blank=True)
    error = models.TextField(blank=True)
    pinned = models.BooleanField(default=False)
    # When a validation task was last put on the queue; None while none is known to be.
    validation_enqueued_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    # Set when resumes from it kept failing before any progress, or a restore test could
    # not load it (recovery/quarantine.py): no resume, `latest` or auto-resume takes it
    # until an operator releases it. A database default too: ingest inserts rows in SQL.
    quarantined_at = models.DateTimeField(null=True, blank=True)
    quarantine_reason = models.TextField(blank=True, default="", db_default="")
    deleted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "step"],
                # The project page's storage per run, sorted: an index-only sum on
                # PostgreSQL (bench/pages.py: p50 294 -> 125 ms at 10,000 runs, 1,000,000
                # checkpoints). In this index rather than one of its own on run: with that
                # one, a plan made while the table was small or never analyzed looked a
                # step up through it, reading every checkpoint of the run, once per event
                # (migration 0006 says more).
                include=["total_size", "status"],
                name="checkpoint_run_step_unique",
            )
        ]
        indexes = [
            # A run's timeline and "latest verified" (GET /runs/<key>/latest).
            models.Index(fields=["run", "status", "-step"], name="checkpoint_run_status_step"),
            # Checkpoints still waiting for validation: only a few rows at any time, so a
            # partial index keeps workers.sweeper.requeue_unvalidated cheap.
            models.Index(
                fields=["validation_enqueued_at"],
                name="checkpoint_unsettled",
                condition=models.Q(status__in=UNSETTLED),
            ),
            # The runs list's problems summary counts these per project: few rows, so a
            # partial index answers without reading the project's million checkpoints.
            models.Index(
                fields=["project", "status"],
                name="checkpoint_damaged",
                condition=models.Q(status__in=DAMAGED),
            ),
            # Checkpoints whose ranks are still reporting their parts: the sweeper closes
            # those past CHECKPOINT_PARTS_WAIT_S (webapp/domain/parts_deadline.py).
            models.Index(
                fields=["updated_at"],
                name="checkpoint_parts_waiting",
                condition=models.Q(status="saving", world_size__isnull=False),
            ),
            # The sweeper looks for the checkpoints verified lately that miss a replica
            # their targets' policies ask for (webapp/domain/replication/owed.py).
            models.Index(
                fields=["verified_at"],
                name="checkpoint_verified_at",
                condition=models.Q(status="verified"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run.key}@{self.step}"

    def missing_parts(self, limit: int = 1000) -> list[int]:
        """The first `limit` ranks whose part was never reported ([] for a checkpoint
        reported whole)."""
        if self.world_size is None:
            return []
        return missing_ranks(self.world_size, self.parts.values_list("rank", flat=True), limit)

    def resume_refusal(self) -> str:
        """Why this checkpoint cannot be resumed from ("" when it can), by resumable_q()."""
        if Checkpoint.objects.filter(pk=self.pk).filter(resumable_q()).exists():
            return ""
        if self.quarantined_at is not None:
            return (
                f"step {self.step} is quarantined ({self.quarantine_reason.splitlines()[0]}); "
                "an operator can release it"
            )
        status = self.get_status_display().lower()
        if self.status in LOCAL_COPY_LOST:
            return (
                f"step {self.step} is {status} and no replica of it is verified: only a "
                "verified checkpoint, or one with a verified replica, can be resumed from"
            )
        return (
            f"step {self.step} is {status}: only a verified checkpoint, or one with a "
            "verified replica, can be resumed from"
        )

    @property
    def is_settled(self) -> bool:
        return self.status not in UNSETTLED

    @property
    def can_be_validated(self) -> bool:
        return self.status not in (
            *NOT_SAVED,
            CheckpointStatus.DELETING,
            CheckpointStatus.DELETED,
        )


class CheckpointActionRefused(Exception):
    """An action that cannot apply to a checkpoint in its present state."""


class CheckpointFile(models.Model):
    """One file of a checkpoint, as the client reported it (size and sha256)."""

    # Indexed by checkpoint_file_unique (checkpoint, path).
    checkpoint = models.ForeignKey(
        Checkpoint, on_delete=models.CASCADE, related_name="files", db_index=False
    )
    path = models.CharField(max_length=1000)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    # The rank whose part reported it; None when the whole checkpoint was one report.
    rank = models.IntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "path"], name="checkpoint_file_unique")
        ]

    def __str__(self) -> str:
        return self.path


class CheckpointPart(models.Model):
    """One rank's report of its share of a checkpoint (a `checkpoint.saved` event with a
    `part`): the files that rank wrote, on the host that holds them."""

    checkpoint = models.ForeignKey(
        Checkpoint, on_delete=models.CASCADE, related_name="parts", db_index=False
    )
    rank = models.IntegerField()
    host = models.CharField(max_length=255, blank=True)
    file_count = models.IntegerField(default=0)
    total_size = models.BigIntegerField(default=0)
    # sha256 of the part's sorted (path, size, sha256) list: a repeated report of the
    # same part is told from a re-save without reading the files' rows.
    files_digest = models.CharField(max_length=64)
    # The time the job gave its report (the event's), and when it arrived.
    saved_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)
    # When retention removed this part's files from its host (node-local checkpoints).
    removed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "rank"], name="checkpoint_part_once")
        ]

    def __str__(self) -> str:
        return f"rank {self.rank} of checkpoint {self.checkpoint_id}"


class MetricPoint(models.Model):
    """The values a run reported for one step (`metrics` events)."""

    run = models.ForeignKey("domain.Run", on_delete=models.CASCADE, related_name="metric_points")
    step = models.BigIntegerField()
    values = models.JSONField(default=dict)
    time = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="metric_point_unique")]

    def __str__(self) -> str:
        return f"{self.run_id}@{self.step}"
