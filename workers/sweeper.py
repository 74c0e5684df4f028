"""Periodic repair (Celery beat): the sweeper of webapp/domain/repair.py, and the daily
re-validation of the checkpoints people rely on."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import Max, OuterRef, Q, Subquery
from django.utils import timezone

from webapp.domain import parts_deadline, repair
from webapp.domain.health import live_workers
from webapp.domain.models import Checkpoint, Validation
from workers.validate import validate_checkpoint


@shared_task(name="workers.sweeper.sweep", ignore_result=True)
def sweep(limit: int = 1000) -> int:
    """Every stage's work that the database says is owed and nobody is doing, sent
    again (webapp/domain/repair.py). Returns how many pieces were sent."""

    closed = parts_deadline.close_overdue(limit=limit)
    try:
        live_workers.refresh()
        live_workers.alert_stranded()
    except Exception:  # noqa: BLE001 (the repairs below matter more; the next sweep asks again)
        logging.getLogger(__name__).exception("sweep: could not ask the workers")
    return len(repair.sweep(limit=limit)) + len(closed)


@shared_task(name="workers.sweeper.revalidate_stale", ignore_result=True)
def revalidate_stale(limit: int = 500) -> int:
    """Check again, since bits rot, the checkpoints people rely on: pinned ones and the
    latest verified of every run, when their last check is older than
    REVALIDATE_AFTER_S. Their status stays until the new verdict."""

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
