"""The `validate` queue.

NOT IMPLEMENTED YET (issue #4): this task reads no file and checks nothing. It records,
once, that the checkpoint is waiting for validation, and leaves it "reported". It never
marks a checkpoint verified, so nothing unchecked is ever called good.
"""

from __future__ import annotations

from celery import shared_task
from django.db import transaction
from django.utils import timezone

PENDING_MESSAGE = (
    "Waiting for validation: checksum and load checks are not implemented yet in this "
    "version, so this checkpoint stays 'reported' and is not called verified."
)


@shared_task(name="workers.validate.validate_checkpoint", ignore_result=True)
def validate_checkpoint(checkpoint_id: int, requested_by: str = "system") -> str:
    from webapp.domain.models import Checkpoint, Validation
    from webapp.domain.models.recovery import ValidationKind, ValidationStatus

    with transaction.atomic():
        checkpoint = Checkpoint.objects.select_for_update().filter(pk=checkpoint_id).first()
        if checkpoint is None:
            return "gone"
        if checkpoint.is_settled:
            return "settled"
        Validation.objects.get_or_create(
            checkpoint=checkpoint,
            kind=ValidationKind.INTEGRITY,
            status=ValidationStatus.QUEUED,
            defaults={
                "message": PENDING_MESSAGE,
                "requested_by": requested_by,
                "created_at": timezone.now(),
            },
        )
    return "queued"
