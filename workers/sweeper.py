"""Periodic repair of the queues (Celery beat).

The database is the truth and the broker can lose messages: a publish that failed while
Redis was down, or a Redis restarted without persistence. The sweeper finds checkpoints
whose validation nobody is known to be doing and puts them on the queue again; the
validation task is idempotent, so an extra copy costs only a lookup.
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone


@shared_task(name="workers.sweeper.requeue_unvalidated", ignore_result=True)
def requeue_unvalidated(limit: int = 1000) -> int:
    from webapp.domain.models import Checkpoint
    from webapp.domain.models.checkpoints import UNSETTLED
    from webapp.domain.validation.publish import enqueue_validations

    now = timezone.now()
    # Never enqueued (publish failed), or enqueued so long ago that even a redelivery
    # after the visibility timeout should have happened: the message is lost.
    lost_before = now - timedelta(
        seconds=settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
        + settings.VALIDATION_REQUEUE_AFTER_S
    )
    grace = now - timedelta(seconds=settings.VALIDATION_REQUEUE_AFTER_S)
    # Served by the partial index checkpoint_unsettled.
    ids = list(
        Checkpoint.objects.filter(status__in=UNSETTLED)
        .filter(
            Q(validation_enqueued_at__isnull=True, updated_at__lt=grace)
            | Q(validation_enqueued_at__lt=lost_before)
        )
        .order_by("validation_enqueued_at")
        .values_list("pk", flat=True)[:limit]
    )
    if ids:
        Checkpoint.objects.filter(pk__in=ids).update(validation_enqueued_at=now)
        enqueue_validations(ids)
    return len(ids)


@shared_task(name="workers.sweeper.revalidate_stale", ignore_result=True)
def revalidate_stale(limit: int = 500) -> int:
    """Check again, since bits rot, the checkpoints people rely on: pinned ones and the
    latest verified of every run, when their last check is older than
    REVALIDATE_AFTER_S. Their status stays until the new verdict."""
    from django.db.models import Max, OuterRef, Subquery

    from webapp.domain.models import Checkpoint, Validation
    from workers.validate import validate_checkpoint

    cutoff = timezone.now() - timedelta(seconds=settings.REVALIDATE_AFTER_S)
    latest_verified = (
        Checkpoint.objects.filter(run=OuterRef("run"), status="verified")
        .order_by("-step")
        .values("pk")[:1]
    )
    candidates = (
        Checkpoint.objects.filter(status="verified")
        .filter(Q(pinned=True) | Q(pk=Subquery(latest_verified)))
        .annotate(last_check=Max("validations__created_at"))
        .filter(Q(last_check__lt=cutoff) | Q(last_check__isnull=True))
        .values_list("pk", flat=True)[:limit]
    )
    ids = list(candidates)
    for checkpoint_id in ids:
        # A queued row now, so the next sweep does not pick it again before it runs.
        Validation.objects.create(
            checkpoint_id=checkpoint_id, kind="integrity", requested_by="schedule"
        )
        validate_checkpoint.apply_async(
            (checkpoint_id,), {"requested_by": "schedule", "revalidate": True}
        )
    return len(ids)
