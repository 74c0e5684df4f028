"""What workers do with checkpoints: check them (Validation), copy them (Replica) and
bring jobs back from them (Resume)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


def progress_of(work, now=None) -> dict:
    """Bytes done, rate (bytes/s) and ETA (s) of a long operation with bytes_done,
    bytes_total, started_at, finished_at and is_final (a check, a copy)."""
    end = work.finished_at or now or timezone.now()
    elapsed = (end - work.started_at).total_seconds() if work.started_at else 0.0
    rate = work.bytes_done / elapsed if elapsed > 0 else 0.0
    remaining = max(work.bytes_total - work.bytes_done, 0)
    return {
        "bytes_done": work.bytes_done,
        "bytes_total": work.bytes_total,
        "rate": rate,
        "eta_s": remaining / rate if rate > 0 and not work.is_final else None,
    }


class ValidationKind(models.TextChoices):
    INTEGRITY = "integrity", "Integrity (sizes and checksums)"
    LOAD = "load", "Load"
    RESTORE = "restore", "Restore from a replica"
    REPLAY = "replay", "Replay training steps"


class ValidationStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    PASSED = "passed", "Passed"
    WARNING = "warning", "Warning"
    FAILED = "failed", "Failed"
    ERROR = "error", "Could not run"


class Validation(models.Model):
    checkpoint = models.ForeignKey(
        "domain.Checkpoint", on_delete=models.CASCADE, related_name="validations"
    )
    kind = models.CharField(max_length=16, choices=ValidationKind.choices)
    status = models.CharField(
        max_length=16, choices=ValidationStatus.choices, default=ValidationStatus.QUEUED
    )
    device = models.CharField(max_length=100, blank=True)
    worker = models.CharField(max_length=255, blank=True)
    requested_by = models.CharField(max_length=200, blank=True)
    timings = models.JSONField(default=dict, blank=True)
    findings = models.JSONField(default=list, blank=True)
    message = models.TextField(blank=True)
    # Progress while it runs, written about once a second by the worker.
    bytes_total = models.BigIntegerField(default=0)
    bytes_done = models.BigIntegerField(default=0)
    # Per file: how many of the checkpoint's files are checked, and the bytes hashed so far
    # of each file being checked now ({path: bytes}; a few at a time, never all).
    files_total = models.IntegerField(default=0)
    files_done = models.IntegerField(default=0)
    files_running = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # While it runs, its worker renews this (webapp/domain/lease.py); a lapsed lease
    # means the worker died, and the sweeper sends the check again.
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["checkpoint", "-created_at"], name="validation_ckpt"),
            # The sweeper's question (webapp/domain/validation/owed.py): few rows at a time.
            models.Index(
                fields=["kind", "status"],
                name="validation_unsettled",
                condition=models.Q(status__in=["queued", "running"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} of {self.checkpoint_id}: {self.status}"

    @property
    def is_final(self) -> bool:
        return self.status not in (ValidationStatus.QUEUED, ValidationStatus.RUNNING)

    def progress(self, now=None) -> dict:
        """Bytes done, rate (bytes/s) and ETA (s) for the UI and the CLI; files done of
        files total, and the files being checked now with their bytes done."""
        return {
            **progress_of(self, now),
            "files_total": self.files_total,
            "files_done": self.files_done,
            "files_running": {} if self.is_final else dict(self.files_running or {}),
        }


class ValidationPart(models.Model):
    """One part of a big checkpoint's validation fanned out over workers
    (webapp/domain/validation/fanout.py): the files one task hashes and inspects, and what
    it found, until the verdict task merges every part."""

    validation = models.ForeignKey(Validation, on_delete=models.CASCADE, related_name="parts")
    index = models.IntegerField()
    files = models.JSONField(default=list)  # relative paths, in the checkpoint's order
    bytes_total = models.BigIntegerField(default=0)
    status = models.CharField(
        max_length=16, choices=ValidationStatus.choices, default=ValidationStatus.QUEUED
    )
    # The host that holds these files, for a node-local checkpoint (its task goes to
    # validate.<host>); "" when any worker can read them.
    host = models.CharField(max_length=255, blank=True)
    worker = models.CharField(max_length=255, blank=True)
    # {"findings": [...], "bytes_read": int, "hash_s": float, "inspection": {...}}
    result = models.JSONField(default=dict, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["validation", "index"], name="validation_part_once")
        ]

    def __str__(self) -> str:
        return f"part {self.index} of validation {self.validation_id}: {self.status}"


class ReplicaStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    UPLOADING = "uploading", "Uploading"
    VERIFIED = "verified", "Verified"
    FAILED = "failed", "Failed"
    DELETED = "deleted", "Deleted"


class Replica(models.Model):
    checkpoint = models.ForeignKey(
        "domain.Checkpoint", on_delete=models.CASCADE, related_name="replicas"
    )
    target = models.ForeignKey(
        "domain.StorageTarget", on_delete=models.PROTECT, related_name="replicas"
    )
    status = models.CharField(
        max_length=16, choices=ReplicaStatus.choices, default=ReplicaStatus.PENDING
    )
    bytes_total = models.BigIntegerField(default=0)
    bytes_done = models.BigIntegerField(default=0)
    attempts = models.IntegerField(default=0)
    last_error = models.TextField(blank=True)
    manifest_key = models.CharField(max_length=1000, blank=True)
    # Bytes actually sent in the last attempt; files already on the target are not sent.
    bytes_sent = models.BigIntegerField(default=0)
    # [{path, size, sha256, key}]: what this replica is made of, set when it is claimed so
    # that retention knows which content-addressed objects are still referenced.
    files = models.JSONField(default=list, blank=True)
    # {object key: multipart upload id} of the attempt in progress, so that the next
    # attempt (after a crash) aborts them instead of leaving parts behind.
    uploads = models.JSONField(default=dict, blank=True)
    # A node-local checkpoint's copy is sent by each host's worker, its share of the files
    # (webapp/domain/replication/host_legs.py): {host: "queued" | "done"} for this attempt.
    legs = models.JSONField(default=dict, blank=True)
    worker = models.CharField(max_length=255, blank=True)
    # Held by the worker uploading it, renewed with every progress write; a second copy
    # of the task waits until it has lapsed.
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # Bytes of the objects its deletion removed and proved gone (shared objects another
    # replica names stay, and are not counted): what retention freed.
    freed_bytes = models.BigIntegerField(default=0)
    # Bytes of the objects this copy was the first to name on its target, as of the storage
    # ledger's last pass (ledger.py): what it added. None until a pass has counted it.
    added_bytes = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "target"], name="replica_unique")
        ]
        indexes = [
            models.Index(
                fields=["created_at"],
                name="replica_unsettled",
                condition=models.Q(status__in=["pending", "uploading"]),
            )
        ]

    def __str__(self) -> str:
        return f"{self.checkpoint_id} on {self.target_id}: {self.status}"

    @property
    def is_final(self) -> bool:
        return self.status not in (ReplicaStatus.PENDING, ReplicaStatus.UPLOADING)

    def progress(self, now=None) -> dict:
        """Bytes done, rate (bytes/s) and ETA (s), as Validation.progress()."""
        return progress_of(self, now)


class ResumeStatus(models.TextChoices):
    REQUESTED = "requested", "Requested"
    RESTORING = "restoring", "Restoring checkpoint"
    LAUNCHING = "launching", "Launching"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class Resume(models.Model):
    project = models.ForeignKey("domain.Project", on_delete=models.CASCADE, related_name="resumes")
    run = models.ForeignKey("domain.Run", on_delete=models.CASCADE, related_name="resumes")
    checkpoint = models.ForeignKey(
        "domain.Checkpoint", on_delete=models.PROTECT, related_name="resumes"
    )
    profile = models.ForeignKey(
        "domain.LaunchProfile", null=True, blank=True, on_delete=models.SET_NULL
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    automatic = models.BooleanField(default=False)
    # Automatic, after the scheduler preempted the run: not counted against max_restarts.
    after_preemption = models.BooleanField(default=False, db_default=False)
    # The world size the job is launched on, when the profile takes one ({{world_size}});
    # when it differs from the checkpoint's, the checkpoint is first loaded on it
    # (recovery/reshard.py) and the job launched only if that passes.
    world_size = models.PositiveIntegerField(null=True, blank=True)
    command = models.TextField(blank=True)
    external_id = models.CharField(max_length=100, blank=True)
    status = models.CharField(
        max_length=16, choices=ResumeStatus.choices, default=ResumeStatus.REQUESTED
    )
    error = models.TextField(blank=True)
    # The end of the job's output once it has ended, secrets redacted
    # (webapp/domain/launch/redact.py); shown to operators and above only.
    output = models.TextField(blank=True)
    # The token the job reports back with (webapp/domain/launch/job_token.py).
    token = models.ForeignKey(
        "domain.ApiToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    new_run = models.ForeignKey(
        "domain.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    # When the launch host last looked at the job (workers.launch.follow_resume): one
    # chain of follow tasks per resume, and the sweeper starts a new one when it lapses.
    followed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # The sweeper's question (webapp/domain/recovery/owed.py): resumes not ended.
            models.Index(
                fields=["status"],
                name="resume_unfinished",
                condition=models.Q(status__in=["requested", "restoring", "launching", "running"]),
            )
        ]

    def __str__(self) -> str:
        return f"resume of {self.run_id} from {self.checkpoint_id}: {self.status}"

    def seconds_to_first_step(self) -> float | None:
        """Click to the resumed job's first reported step: from this request to the
        time of the new run's first metrics point (what bench/resume.py measures)."""
        if self.new_run_id is None:
            return None
        # By name from the app registry: checkpoints.py, which holds it, imports this module.
        metric_point = self._meta.apps.get_model("domain", "MetricPoint")
        first = (
            metric_point.objects.filter(run_id=self.new_run_id)
            .order_by("time")
            .values_list("time", flat=True)
            .first()
        )
        return None if first is None else (first - self.created_at).total_seconds()


class SavedChunks(models.Model):
    """Where every tensor chunk of a DCP checkpoint lies in its shard and the sha256 of
    its stored bytes, recorded by the restore test that first loaded it on another world
    size (from bytes whose files matched their verified sha256). A shard found altered
    later is then named down to the tensors it holds (recovery/reshard.py)."""

    checkpoint = models.OneToOneField(
        "domain.Checkpoint", on_delete=models.CASCADE, related_name="saved_chunks"
    )
    # [[fqn, offsets, path, byte offset, length, sha256], ...]
    chunks = models.JSONField(default=list)
    recorded_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{len(self.chunks)} chunks of checkpoint {self.checkpoint_id}"
