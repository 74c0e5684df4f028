"""The `validate` queue's entry points; the work is in webapp/domain/validation/checking.py
(one task per checkpoint) and fanout.py (a big checkpoint's parts over many workers)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from webapp.domain import lease
from webapp.domain.models import Checkpoint, Validation
from webapp.domain.transient import is_transient
from webapp.domain.validation import fanout
from webapp.domain.validation.checking import (  # noqa: F401  (the tests' names for them)
    claim,
    record,
    record_error,
    run_checks,
)
from webapp.domain.validation.publish import publish_validations

log = logging.getLogger(__name__)


@shared_task(name="workers.validate.validate_checkpoint", ignore_result=True)
def validate_checkpoint(
    checkpoint_id: int, requested_by: str = "system", revalidate: bool = False
) -> str:
    claimed = claim(checkpoint_id, requested_by, revalidate)
    if claimed is None:
        return "settled"
    if isinstance(claimed, lease.Busy):
        # Another worker is checking it (look again when its lease would have lapsed), or
        # its project has its fair share running (look again soon). Known to be on its
        # way, so the sweeper does not take it for lost meanwhile.
        Checkpoint.objects.filter(pk=checkpoint_id, validation_enqueued_at__isnull=False).update(
            validation_enqueued_at=timezone.now()
        )
        validate_checkpoint.apply_async(
            (checkpoint_id,),
            {"requested_by": requested_by, "revalidate": revalidate},
            countdown=claimed.retry_in_s,
        )
        return "busy"
    validation_id, fingerprint = claimed
    if fanout.fan_out(validation_id, fingerprint):
        return "fanned out"
    try:
        with lease.kept(Validation, validation_id, settings.VALIDATION_LEASE_S):
            verdict, content, timings = run_checks(validation_id)
    except Exception as exc:
        if is_transient(exc):
            raise  # tried again (workers/retrying.py): the check itself did not fail
        log.exception("validation %s of checkpoint %s could not run", validation_id, checkpoint_id)
        record_error(validation_id, exc)
        return "error"
    return record(validation_id, fingerprint, verdict, content, timings)


@shared_task(name="workers.validate.validate_part", ignore_result=True, bind=True)
def validate_part(self, part_id: int) -> str:
    """One part of a fanned-out validation: its files hashed and inspected here."""
    return fanout.run_part(part_id, worker=self.request.hostname or "")


@shared_task(name="workers.validate.decide_validation", ignore_result=True)
def decide_validation(validation_id: int, fingerprint: str) -> str:
    """The verdict of a fanned-out validation, once every part has finished."""
    return fanout.decide(validation_id, fingerprint)


@shared_task(name="workers.validate.dispatch_validations", ignore_result=True)
def dispatch_validations(checkpoint_ids: list[int]) -> int:
    """Fan a batch out into one validation task per checkpoint, so that they run in
    parallel on every worker. Safe to run twice: validations of settled checkpoints
    return at once."""

    publish_validations(checkpoint_ids)
    return len(checkpoint_ids)
