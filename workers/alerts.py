"""Alert tasks (queue `alerts`): the periodic sweep that finds overdue and failed runs and
storage over quota (webapp/domain/health/alerts.py), and the processing and delivery of
each flip through its channel's kind (webapp/domain/health/delivery.py).
Every task takes ids and is safe to run twice."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from webapp.domain.health import alerts, delivery
from webapp.domain.models.alerts import Flip, Notification, NotificationStatus


@shared_task(name="workers.alerts.check", ignore_result=True)
def check() -> int:
    """Beat, every minute: record new flips, and pick up flips and notifications whose
    messages were lost (a publish while Redis was down, a worker that died)."""

    flips = alerts.check_runs() + alerts.check_quotas()
    stale = timezone.now() - timedelta(seconds=60)
    for flip_id in Flip.objects.filter(processed_at__isnull=True, created_at__lt=stale).values_list(
        "pk", flat=True
    )[:1000]:
        process_flip.delay(flip_id)
    for notification_id in Notification.objects.filter(
        status=NotificationStatus.PENDING, next_attempt_at__lt=stale
    ).values_list("pk", flat=True)[:1000]:
        deliver_notification.delay(notification_id)
    return len(flips)


@shared_task(name="workers.alerts.process_flip", ignore_result=True)
def process_flip(flip_id: int) -> int:
    ids = delivery.process(flip_id)
    for notification_id in ids:
        deliver_notification.delay(notification_id)
    return len(ids)


@shared_task(name="workers.alerts.deliver_notification", ignore_result=True)
def deliver_notification(notification_id: int) -> str:
    outcome = delivery.deliver(notification_id)
    if isinstance(outcome, float):
        # A temporary error: try again later. The row holds the time, so an early
        # duplicate of this message only finds it not yet due.
        deliver_notification.apply_async((notification_id,), countdown=outcome)
        return f"retry in {outcome:.0f} s"
    return outcome
