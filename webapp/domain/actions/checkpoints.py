"""The actions on a checkpoint: validate, pin (and unpin), restore-test, replicate.

Each locks the checkpoint's row, refuses what cannot be done (ActionRefused), writes one
audit Event and publishes its task once the caller's transaction commits; validate and
restore-test coalesce a repeat into the request already queued (common.py)."""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet

from webapp.domain import publish
from webapp.domain.actions.common import ActionRefused, NoSuchTarget, Requested, lock, pending
from webapp.domain.models import Checkpoint, Event, StorageTarget, Validation
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus, ValidationKind
from webapp.domain.recovery import quarantine
from webapp.domain.recovery import restore_test as restore_tests
from webapp.domain.replication.policy import request as request_replicas


def validate(checkpoint: Checkpoint, actor: str) -> Requested:
    """Queue a fresh check (bits rot). A queued Validation row is made at once so the
    page shows "queued" until a worker takes it (the worker's claim takes up that very
    row). Raises ActionRefused if there is nothing to check."""
    with transaction.atomic():
        locked = lock(checkpoint.pk)
        if locked.status in (CheckpointStatus.SAVING, CheckpointStatus.FAILED):
            raise ActionRefused(f"step {locked.step} was never saved")
        if locked.status == CheckpointStatus.INCOMPLETE:
            raise ActionRefused(f"step {locked.step} is {locked.status_message}")
        if locked.status in (CheckpointStatus.DELETED, CheckpointStatus.DELETING):
            raise ActionRefused(f"step {locked.step} is {locked.status}")
        validation, alive = pending(locked, ValidationKind.INTEGRITY)
        if alive:
            assert validation is not None  # pending(): alive only with a row
            return Requested(validation, coalesced=True)
        if validation is None:
            validation = Validation.objects.create(
                checkpoint=locked, kind=ValidationKind.INTEGRITY, requested_by=actor
            )
        Event.record(
            "checkpoint.validation_requested",
            checkpoint=locked,
            actor=actor,
            message=f"{actor} asked for a new check of step {locked.step}",
            data={"validation": validation.pk},
        )
        publish.after_commit(
            "workers.validate.validate_checkpoint",
            (locked.pk,),
            {"requested_by": actor, "revalidate": True},
        )
    return Requested(validation, coalesced=False)


def pin(checkpoint: Checkpoint, actor: str, pinned: bool = True) -> bool:
    """Pin (never deleted by a retention policy) or unpin. Returns whether anything
    changed: a repeat writes no second audit line."""
    with transaction.atomic():
        locked = lock(checkpoint.pk)
        checkpoint.pinned = pinned
        if locked.pinned == pinned:
            return False
        locked.pinned = pinned
        locked.save(update_fields=["pinned"])
        verb = "pinned" if pinned else "unpinned"
        Event.record(
            f"checkpoint.{verb}",
            checkpoint=locked,
            actor=actor,
            message=f"{actor} {verb} step {locked.step}",
        )
    return True


def release(checkpoint: Checkpoint, actor: str) -> bool:
    """Take a checkpoint out of quarantine (recovery/quarantine.py): resumes, `latest`
    and automatic resume may take it again. Returns whether it was quarantined; the
    release is audited with the reason it had."""

    return quarantine.release(checkpoint, actor)


def restore_test(checkpoint: Checkpoint, actor: str) -> Requested:
    """Queue a restore test (download from a verified replica, load, time each phase),
    or name the one already queued or running. Raises ActionRefused without a verified
    replica (a restore test never reads the local copy)."""

    with transaction.atomic():
        locked = lock(checkpoint.pk)
        if not locked.replicas.filter(status=ReplicaStatus.VERIFIED).exists():
            raise ActionRefused(
                f"step {locked.step} has no verified replica to restore from; "
                "replicate it first (a restore test never reads the local copy)"
            )
        row, alive = pending(locked, ValidationKind.RESTORE)
        if alive:
            assert row is not None  # pending(): alive only with a row
            return Requested(row, coalesced=True)
        if row is None:
            row = restore_tests.request(locked, requested_by=actor)
        else:
            pk = row.pk
            transaction.on_commit(lambda: restore_tests.enqueue(pk))
        Event.record(
            "checkpoint.restore_test_requested",
            checkpoint=locked,
            actor=actor,
            message=f"{actor} asked for a restore test of step {locked.step}",
            data={"validation": row.pk},
        )
    return Requested(row, coalesced=False)


def replicate(checkpoint: Checkpoint, actor: str, target: str | None = None) -> list[int]:
    """Copy a verified checkpoint to every enabled storage target of its project (or the
    one named), whatever their policies say. A target with a copy on its way or a
    verified copy of the same files is left alone (coalesced). Returns the replica ids
    queued, possibly none. Raises NoSuchTarget, or ActionRefused if the checkpoint is
    not verified."""

    with transaction.atomic():
        locked = lock(checkpoint.pk)
        if locked.status != CheckpointStatus.VERIFIED:
            raise ActionRefused(
                f"step {locked.step} is {locked.status}; only verified checkpoints are copied"
            )
        targets: QuerySet[StorageTarget] | list[StorageTarget]
        targets = locked.project.storage_targets.filter(enabled=True).order_by("pk")
        if target:
            targets = targets.filter(name=target)
        targets = list(targets)
        if not targets:
            raise NoSuchTarget(
                f"no enabled storage target named {target!r} in this project"
                if target
                else "this project has no enabled storage target"
            )
        queued = request_replicas(locked, targets, by_policy=False)
        if queued:
            copies = f"{len(queued)} cop{'y' if len(queued) == 1 else 'ies'}"
            Event.record(
                "checkpoint.replication_requested",
                checkpoint=locked,
                actor=actor,
                message=f"{actor} asked for {copies} of step {locked.step}",
                data={"replicas": queued},
            )
    return queued
