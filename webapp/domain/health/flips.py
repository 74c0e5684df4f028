"""A flip (a status change worth an alert), recorded once: the door every finder of
problems (alerts.py, quarantine, auto-resume, the part deadline, live workers, restore
tests, retention audits) goes through; delivery.py sends it."""

from __future__ import annotations

import logging

from django.db import IntegrityError, transaction

from webapp.domain import publish
from webapp.domain.models.alerts import Flip

log = logging.getLogger(__name__)


def record(
    kind: str, key: str, message: str, *, project_id, run_id=None, checkpoint_id=None, data=None
):
    """Insert the flip unless one with `key` exists; enqueue its processing after commit.
    Returns the new Flip, or None if it was recorded before."""

    try:
        with transaction.atomic():
            flip = Flip.objects.create(
                project_id=project_id,
                run_id=run_id,
                checkpoint_id=checkpoint_id,
                kind=kind,
                key=key[:200],
                message=message,
                data=data or {},
            )
    except IntegrityError:
        return None
    transaction.on_commit(lambda: _enqueue_processing(flip.pk))
    return flip


def _enqueue_processing(flip_id: int) -> None:
    try:
        publish.send("workers.alerts.process_flip", (flip_id,))
    except Exception:  # noqa: BLE001 (the beat sweep processes it within a minute)
        log.warning("could not enqueue flip %s; the sweep will process it", flip_id)
