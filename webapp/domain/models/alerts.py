"""Alerts: a status change worth telling someone about is recorded once (a Flip), then
sent once per channel (a Notification), with every attempt kept (healthchecks' model)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from webapp.domain import channels
from webapp.domain.channels.signing import new_secret


class AlertKind(models.TextChoices):
    RUN_OVERDUE = "run.overdue", "Run overdue (no checkpoint or heartbeat in time)"
    RUN_UP = "run.up", "Run back on time"
    RUN_FAILED = "run.failed", "Run failed"
    CHECKPOINT_CORRUPT = "checkpoint.corrupt", "Checkpoint corrupt"
    CHECKPOINT_SUSPICIOUS = "checkpoint.suspicious", "Checkpoint suspicious"
    CHECKPOINT_MISSING = "checkpoint.missing", "Checkpoint missing"
    REPLICA_FAILED = "replica.failed", "Replica failed after its retries"
    RESTORE_FAILED = "restore.failed", "Restore test failed"
    SAVE_SLOW = "save.slow", "A save took far longer than usual"
    STORAGE_OVER_QUOTA = "storage.over_quota", "Storage over the project's quota"
    CHECKPOINT_INCOMPLETE = "checkpoint.incomplete", "Checkpoint incomplete (a rank never reported)"
    HOST_NO_WORKER = "host.no_worker", "No worker for a host's node-local checkpoints"
    CHECKPOINT_QUARANTINED = (
        "checkpoint.quarantined",
        "Checkpoint quarantined (resumes from it fail)",
    )
    RUN_RESTART_LOOP = "run.restart_loop", "Automatic resumes stopped: no progress"
    STORAGE_DELETE_UNCONFIRMED = (
        "storage.delete_unconfirmed",
        "A replica deleted by retention is still stored",
    )
    STORAGE_ORPHANS = "storage.orphans", "Storage holds objects no record accounts for"


class AlertChannel(models.Model):
    project = models.ForeignKey(
        "domain.Project", on_delete=models.CASCADE, related_name="alert_channels"
    )
    name = models.CharField(max_length=100)
    # The kinds are the table in webapp/domain/channels (KINDS). A callable, so that the
    # migrations name the function rather than copy the list: a new kind needs none.
    kind = models.CharField(max_length=16, choices=channels.choices)
    # What the kind sends to: a URL for the webhook, json and slack kinds; one or more
    # addresses, comma-separated, for e-mail (each kind's clean_target()).
    target = models.TextField()
    # The alert kinds it wants; empty means all of them.
    kinds = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Deliveries of the signed kinds carry Standard Webhooks signatures made with it
    # (webapp/domain/channels/signing.py); shown to the project's admins on the channel's
    # settings page only.
    secret = models.CharField(max_length=100, default=new_secret, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="alert_channel_unique")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def transport_class(self) -> type[channels.Transport] | None:
        """The class of the channel's kind; None for a kind this server does not have."""
        return channels.KINDS.get(self.kind)

    @property
    def shown_target(self) -> str:
        """What pages, audit messages and events may show: a URL masked to
        scheme://host/… (its path often is the secret), e-mail addresses as they are.
        A kind this server does not know shows nothing of its target."""
        transport = self.transport_class
        return transport.shown_target(self.target) if transport else "…"

    @property
    def signed(self) -> bool:
        """Its deliveries are signed with `secret` (the settings page shows it)."""
        transport = self.transport_class
        return bool(transport and transport.signed)

    def wants(self, kind: str) -> bool:
        return self.enabled and (not self.kinds or kind in self.kinds)


class Flip(models.Model):
    """One status change, recorded once: `key` is unique, so a second worker (or a second
    run of the same task) that sees the same change inserts nothing."""

    project = models.ForeignKey("domain.Project", on_delete=models.CASCADE, related_name="flips")
    run = models.ForeignKey(
        "domain.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="flips"
    )
    checkpoint = models.ForeignKey(
        "domain.Checkpoint", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    key = models.CharField(max_length=200, unique=True)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # process_flips' queue: the unprocessed ones, oldest first.
            models.Index(
                fields=["created_at"],
                name="flip_unprocessed",
                condition=models.Q(processed_at__isnull=True),
            ),
            models.Index(fields=["project", "-created_at"], name="flip_project_created"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message[:60]}"


class NotificationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"


class Notification(models.Model):
    flip = models.ForeignKey(Flip, on_delete=models.CASCADE, related_name="notifications")
    channel = models.ForeignKey(
        AlertChannel, on_delete=models.CASCADE, related_name="notifications"
    )
    status = models.CharField(
        max_length=16, choices=NotificationStatus.choices, default=NotificationStatus.PENDING
    )
    # Every attempt: [{"at", "ok", "status" (HTTP), "error"}], for the UI.
    attempts = models.JSONField(default=list, blank=True)
    last_error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["flip", "channel"], name="notification_unique")
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="notification_pending",
                condition=models.Q(status="pending"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.flip_id} to {self.channel_id}: {self.status}"
