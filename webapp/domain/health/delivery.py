"""Sending the flips that webapp/domain/health/alerts.py found: a flip becomes one
Notification per channel that wants it, and each notification is delivered by its
channel's transport (webapp/domain/channels: the kind picks the class), with retries for
temporary errors and every attempt stored on the row for the UI.

A flip is processed once (claimed with a conditional UPDATE of processed_at); each
channel gets one Notification (unique); a delivery leases its notification under a row
lock, so two workers never send the same one at once.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.domain import channels
from webapp.domain.channels import signing
from webapp.domain.locks import for_update
from webapp.domain.models.alerts import AlertChannel, Flip, Notification, NotificationStatus


def process(flip_id: int) -> list[int]:
    """Claim the flip and create one notification per channel that wants it; returns the
    notification ids to deliver. A second call finds it claimed and does nothing."""

    now = timezone.now()
    if Flip.objects.filter(pk=flip_id, processed_at__isnull=True).update(processed_at=now) != 1:
        return []
    flip = Flip.objects.get(pk=flip_id)
    ids = []
    for channel in AlertChannel.objects.filter(project_id=flip.project_id, enabled=True):
        if not channel.wants(flip.kind):
            continue
        notification, _ = Notification.objects.get_or_create(
            flip=flip, channel=channel, defaults={"next_attempt_at": now}
        )
        ids.append(notification.pk)
    return ids


def deliver(notification_id: int) -> str | float:
    """One attempt. Returns the final status, or the seconds to wait before the next
    attempt. Safe to call twice: a settled notification is left alone."""

    now = timezone.now()
    with transaction.atomic():
        notification = (
            for_update(Notification.objects, skip_locked=True)
            .filter(pk=notification_id, status=NotificationStatus.PENDING)
            .first()
        )
        if notification is None:
            return "settled"
        # Lease it: another delivery of the same id waits for next_attempt_at.
        if notification.next_attempt_at and notification.next_attempt_at > now:
            return (notification.next_attempt_at - now).total_seconds()
        notification.next_attempt_at = now + timedelta(seconds=settings.ALERT_TIMEOUT_S * 3)
        notification.save(update_fields=["next_attempt_at"])
    channel, flip = notification.channel, notification.flip
    attempt = {"at": now.isoformat(), "ok": False, "status": None, "error": ""}
    outcome: str | float
    try:
        # The same id on every try of this notification: receivers drop repeats by it.
        message_id = signing.message_id(channel.secret, notification.pk, flip.key)
        attempt["status"] = channels.transport(channel).notify(flip, message_id=message_id)
        attempt["ok"] = True
        notification.status = NotificationStatus.SENT
        notification.sent_at = timezone.now()
        notification.last_error = ""
        outcome = "sent"
    except (channels.TemporaryError, channels.PermanentError) as exc:
        attempt["error"] = str(exc)
        notification.last_error = str(exc)
        tries = len(notification.attempts) + 1
        if isinstance(exc, channels.PermanentError) or tries >= settings.ALERT_MAX_ATTEMPTS:
            notification.status = NotificationStatus.FAILED
            outcome = "failed"
        else:
            delay = settings.ALERT_RETRY_BASE_S * 4 ** (tries - 1)
            notification.next_attempt_at = timezone.now() + timedelta(seconds=delay)
            outcome = float(delay)
    notification.attempts = [*notification.attempts, attempt]
    notification.save(
        update_fields=["status", "attempts", "last_error", "next_attempt_at", "sent_at"]
    )
    return outcome
