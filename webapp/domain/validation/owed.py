"""Validations owed and nobody doing them, sent again (the sweeper: webapp/domain/repair.py).

* A checkpoint never put on the queue (the publish failed: validation_enqueued_at is
  NULL), once SWEEP_LOST_AFTER_S has passed since it changed.
* One put on the queue whose message was lost: not settled, sent before
  owed_work.lost_before(), no worker holds a live lease on its check, and none took
  its message within SWEEP_LOST_AFTER_S (owed_work.taken_ids).
* A check whose worker died (its lease lapsed), a re-validation of a settled checkpoint
  included: sent again, and the task takes the running row over (checking.claim).
"""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from django.conf import settings
from django.db.models import Exists, OuterRef, Q

from webapp.domain import owed_work, publish
from webapp.domain.models import Checkpoint, Validation, ValidationPart
from webapp.domain.models.checkpoints import UNSETTLED
from webapp.domain.models.recovery import ValidationKind, ValidationStatus
from webapp.domain.validation.publish import DISPATCH, VALIDATE, enqueue_validations

QUEUE = "validate"


def resend(now, limit: int) -> list[owed_work.Owed]:
    grace = now - timedelta(seconds=settings.SWEEP_LOST_AFTER_S)
    lost = owed_work.lost_before(now, QUEUE)
    in_hand = owed_work.taken_ids(now, QUEUE, {VALIDATE: False, DISPATCH: True})
    live = Validation.objects.filter(
        checkpoint=OuterRef("pk"),
        kind=ValidationKind.INTEGRITY,
        status=ValidationStatus.RUNNING,
        lease_until__gte=now,
    )
    # Served by the partial index checkpoint_unsettled.
    unsettled = (
        Checkpoint.objects.filter(status__in=UNSETTLED)
        .filter(
            Q(validation_enqueued_at__isnull=True, updated_at__lt=grace)
            | Q(validation_enqueued_at__lt=lost)
        )
        .exclude(Exists(live))
        .exclude(pk__in=in_hand)
        .order_by("validation_enqueued_at")
        .values_list("pk", "project_id", "run_id", "step", "validation_enqueued_at")[:limit]
    )
    owed = [
        owed_work.Owed(
            "validate",
            project,
            f"the check of step {step} was "
            + ("never put on the queue" if sent is None else "lost on its way to a worker")
            + ": sent again",
            run_id=run,
            checkpoint_id=pk,
        )
        for pk, project, run, step, sent in unsettled
    ]
    ids = [cast(int, o.checkpoint_id) for o in owed]  # each made with checkpoint_id=pk
    # Served by the partial index validation_unsettled. A check whose worker died; one
    # fanned out in parts renews its lease only while a part runs, so while parts may
    # still wait on the queue, its lapse means nothing yet. And a re-validation whose
    # message was lost before any worker took it.
    # One the sweeper handed back to the queue (no worker) is lost again only as a
    # message is (owed_work.handed_back_before).
    parts = ValidationPart.objects.filter(validation=OuterRef("pk"))
    handed_back = Q(worker="", lease_until__lt=owed_work.handed_back_before(now, QUEUE))
    held = ~Q(worker="") & (
        (
            ~Q(Exists(parts))
            & (Q(lease_until__lt=now) | Q(lease_until__isnull=True, started_at__lt=grace))
        )
        | (
            Q(Exists(parts))
            & (Q(lease_until__lt=lost) | Q(lease_until__isnull=True, started_at__lt=lost))
        )
    )
    running = Q(status=ValidationStatus.RUNNING) & (handed_back | held)
    queued = Q(status=ValidationStatus.QUEUED, created_at__lt=lost)
    dead = (
        Validation.objects.filter(kind=ValidationKind.INTEGRITY)
        .filter(running | queued)
        .exclude(checkpoint_id__in=ids)
        .exclude(checkpoint_id__in=in_hand)
        .values_list(
            "checkpoint_id",
            "checkpoint__project_id",
            "checkpoint__run_id",
            "checkpoint__step",
            "checkpoint__status",
            "requested_by",
        )[:limit]
    )
    revalidations = []
    for pk, project, run, step, status, requested_by in dead:
        owed.append(
            owed_work.Owed(
                "validate",
                project,
                f"the check of step {step} had no live worker (a worker died, or its "
                "message was lost): sent again",
                run_id=run,
                checkpoint_id=pk,
            )
        )
        if status in UNSETTLED:
            ids.append(pk)
        else:
            revalidations.append((pk, requested_by))
    # Handed back to the queue: no worker holds them, and the lease (until the message
    # sent now could be lost too) keeps the next sweeps from sending them again.
    Validation.objects.filter(
        kind=ValidationKind.INTEGRITY,
        status=ValidationStatus.RUNNING,
        checkpoint_id__in=[o.checkpoint_id for o in owed],
    ).update(worker="", lease_until=now + timedelta(seconds=settings.SWEEP_LOST_AFTER_S))
    if ids:
        Checkpoint.objects.filter(pk__in=ids).update(validation_enqueued_at=now)
        enqueue_validations(ids)
    for pk, requested_by in revalidations:
        publish.send(VALIDATE, (pk,), {"requested_by": requested_by, "revalidate": True})
    return owed
