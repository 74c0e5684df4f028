"""What a listing of a storage target found that no record accounts for
(webapp/domain/retention/orphans.py): the audit is the dry run, and a cleanup deletes
only what an audit found, after checking again."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class AuditStatus(models.TextChoices):
    RUNNING = "running", "Listing"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class StorageAudit(models.Model):
    target = models.ForeignKey(
        "domain.StorageTarget", on_delete=models.CASCADE, related_name="audits"
    )
    status = models.CharField(max_length=16, choices=AuditStatus.choices, default="running")
    error = models.TextField(blank=True)
    actor = models.CharField(max_length=200)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Objects listed under Lifeboat's own keys (<prefix>/sha256/, <prefix>/manifests/);
    # nothing else in the bucket is looked at.
    listed_objects = models.BigIntegerField(default=0)
    listed_bytes = models.BigIntegerField(default=0)
    # Named by a replica (of any project on the same store), or still being deleted.
    accounted_objects = models.BigIntegerField(default=0)
    accounted_bytes = models.BigIntegerField(default=0)
    # Younger than STORAGE_AUDIT_GRACE_S: not judged (an upload may be under way).
    recent_objects = models.BigIntegerField(default=0)
    orphan_objects = models.BigIntegerField(default=0)
    orphan_bytes = models.BigIntegerField(default=0)
    # [{key, bytes, modified}], the largest first, at most orphans.SHOWN of them.
    orphans = models.JSONField(default=list, blank=True)
    # Multipart uploads no replica knows of, begun before the grace: [{key, upload_id,
    # initiated, bytes}] (their parts' bytes are stored and billed until aborted).
    uploads = models.JSONField(default=list, blank=True)
    upload_bytes = models.BigIntegerField(default=0)
    # The cleanup of what this audit found, once a person asked for it.
    cleaned_at = models.DateTimeField(null=True, blank=True)
    cleaned_by = models.CharField(max_length=200, blank=True)
    cleaned_objects = models.BigIntegerField(default=0)
    cleaned_bytes = models.BigIntegerField(default=0)
    cleaned_uploads = models.IntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["target", "-started_at"], name="audit_target_recent")]

    def __str__(self) -> str:
        return f"audit {self.pk} of target {self.target_id}"

    @property
    def unaccounted_bytes(self) -> int:
        return self.orphan_bytes + self.upload_bytes
