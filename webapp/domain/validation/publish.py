"""Validation tasks onto the queue, by name (webapp/domain/publish.py), after commit: the
ingest paths (through webapp/domain/validation/outbox.py), the sweeper and the fan-out
task all publish through these two functions."""

from __future__ import annotations

import logging

from webapp.domain import publish
from webapp.domain.models import Checkpoint

log = logging.getLogger(__name__)

VALIDATE = "workers.validate.validate_checkpoint"
DISPATCH = "workers.validate.dispatch_validations"


def _unstamp(checkpoint_ids: list[int]) -> None:
    """Not on the queue after all: workers.sweeper puts them there later."""

    Checkpoint.objects.filter(pk__in=checkpoint_ids).update(validation_enqueued_at=None)


def enqueue_validations(checkpoint_ids: list[int]) -> None:
    """Put validations on the queue (called after commit).

    One checkpoint: its validation task. Several: one dispatch message that a worker fans
    out, because publishing costs about a millisecond per message and a batch of 1000
    must not spend a second of the request doing it.

    If the broker is down the events are already safe in the database: the checkpoints
    keep validation_enqueued_at NULL and workers.sweeper puts them on the queue later."""
    if len(checkpoint_ids) > 1:
        try:
            # argsrepr: Celery would otherwise write a repr of every id into the header.
            publish.send(
                DISPATCH,
                (list(checkpoint_ids),),
                argsrepr=f"[{len(checkpoint_ids)} checkpoint ids]",
            )
        except Exception:
            log.exception(
                "could not reach the broker to enqueue %d validations", len(checkpoint_ids)
            )
            _unstamp(checkpoint_ids)
        return
    publish_validations(checkpoint_ids)


def publish_validations(checkpoint_ids: list[int]) -> None:
    """One validation task per checkpoint, over one broker connection."""
    failed: list[int] = []
    try:
        with publish.producer() as producer:
            for checkpoint_id in checkpoint_ids:
                try:
                    publish.send(VALIDATE, (checkpoint_id,), producer=producer)
                except Exception:
                    failed.append(checkpoint_id)
                    if len(failed) == 1:
                        log.exception(
                            "could not enqueue validation of checkpoint %s", checkpoint_id
                        )
    except Exception:
        log.exception("could not reach the broker to enqueue %d validations", len(checkpoint_ids))
        failed = list(checkpoint_ids)
    if failed:
        _unstamp(failed)
