"""Checkpoints whose ranks did not all report their part in time are marked incomplete.

A checkpoint written by many ranks waits, `saving`, for every rank's part (parts.py in
webapp/domain/ingest). A rank that died, or whose report was lost for good, would leave it
waiting forever and looking like a save in progress: CHECKPOINT_PARTS_WAIT_S after the
first part arrived (the server's clock, not the job's), the sweeper marks it `incomplete`
with the ranks that never reported. It is never checked, copied or resumed from; a part
that still arrives completes it and it is checked then.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from webapp.domain.health import alerts
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Event
from webapp.domain.ranks import incomplete_message


def close_overdue(now: datetime | None = None, limit: int = 1000) -> list[int]:
    """Mark incomplete the waiting checkpoints whose first part is older than the wait;
    returns their ids."""

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.CHECKPOINT_PARTS_WAIT_S)
    # The partial index checkpoint_parts_waiting holds exactly the waiting rows.
    waiting = Checkpoint.objects.filter(status="saving", world_size__isnull=False)
    overdue = list(
        waiting.annotate(first=Min("parts__received_at"))
        .filter(first__lt=cutoff)
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )
    return [pk for pk in overdue if _close(pk)]


def _close(checkpoint_id: int) -> bool:
    with transaction.atomic():
        checkpoint = for_update(Checkpoint.objects).filter(pk=checkpoint_id).first()
        if checkpoint is None or checkpoint.status != "saving" or checkpoint.world_size is None:
            return False  # completed, or saved again, since the query
        missing = checkpoint.missing_parts()
        if not missing:
            return False
        reported = checkpoint.parts.values_list("rank", flat=True)
        checkpoint.status = "incomplete"
        checkpoint.status_message = incomplete_message(checkpoint.world_size, list(reported))
        checkpoint.updated_at = timezone.now()
        checkpoint.save(update_fields=["status", "status_message", "updated_at"])
        alerts.record(
            "checkpoint.incomplete",
            f"checkpoint.incomplete:{checkpoint.pk}:{checkpoint.saved_at.isoformat()}",
            f"Step {checkpoint.step} of run {checkpoint.run.key} is {checkpoint.status_message}.",
            project_id=checkpoint.project_id,
            run_id=checkpoint.run_id,
            checkpoint_id=checkpoint.pk,
            data={"missing_ranks": missing[:1000]},
        )
        Event.record(
            "checkpoint.incomplete",
            checkpoint=checkpoint,
            actor="lifeboat",
            message=f"step {checkpoint.step}: {checkpoint.status_message}",
            data={"missing_ranks": missing[:1000], "world_size": checkpoint.world_size},
        )
    return True
