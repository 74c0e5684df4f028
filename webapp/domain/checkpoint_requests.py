"""What a person asks of a checkpoint, through the API or the dashboard: a new check
(Checkpoint.request_validation), a restore test, copies to the storage targets.

One function per action, called by both audiences: each locks the checkpoint, refuses
what cannot be done (CheckpointActionRefused), writes the audit Event and publishes its
task once the caller's transaction commits. A repeat of a request that is still queued or
running is coalesced into it: the answer names the request already there, and nothing
new is stored or published, so pressing a button (or looping over the API) a thousand
times queues one piece of work.

A request that has been queued or running for longer than any check may take
(VALIDATION_TIMEOUT_S plus ten minutes: restore_test.claim's lease) is presumed lost (a
message the broker dropped, a worker that died): a new request publishes its task again,
with an audit line, instead of being coalesced into it forever."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.domain.models import Checkpoint, Event, Validation
from webapp.domain.models.checkpoints import CheckpointActionRefused, CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus, ValidationKind, ValidationStatus


@dataclass(frozen=True)
class Requested:
    """The request's Validation, and whether it was already there (coalesced): then
    nothing was stored, audited or published by this call."""

    validation: Validation
    coalesced: bool


class NoSuchTarget(CheckpointActionRefused):
    """No enabled storage target (of the name asked for) in the project."""


def lost_after() -> timedelta:
    return timedelta(seconds=settings.VALIDATION_TIMEOUT_S + 600)


def pending(checkpoint: Checkpoint, kind: str, now=None) -> tuple[Validation | None, bool]:
    """The newest queued or running Validation of `kind`, and whether it is alive (not
    presumed lost: see the module's docstring). Call with the checkpoint locked."""
    row = (
        checkpoint.validations.filter(
            kind=kind, status__in=(ValidationStatus.QUEUED, ValidationStatus.RUNNING)
        )
        .order_by("-created_at")
        .first()
    )
    if row is None:
        return None, False
    since = row.started_at if row.status == ValidationStatus.RUNNING else row.created_at
    return row, (since or row.created_at) >= (now or timezone.now()) - lost_after()


def lock(checkpoint_id: int, project=None) -> Checkpoint:
    """The checkpoint, locked until the caller's transaction ends; DoesNotExist if it is
    not there (or not in `project`). Only its row: its run and project are read, not
    locked, so an action never holds a run's lock that ingest takes (in its own order)."""
    rows = Checkpoint.objects.select_for_update(of=("self",)).select_related("project", "run")
    if project is not None:
        rows = rows.filter(project=project)
    return rows.get(pk=checkpoint_id)


def audit(checkpoint: Checkpoint, type_: str, actor: str, message: str, **data) -> Event:
    return Event.objects.create(
        project_id=checkpoint.project_id,
        run_id=checkpoint.run_id,
        type=type_,
        step=checkpoint.step,
        time=timezone.now(),
        actor=actor,
        message=message,
        data=data,
    )


def request_restore_test(checkpoint_id: int, actor: str) -> Requested:
    """Queue a restore test (download from a verified replica, load, time each phase),
    or name the one already queued or running. Raises CheckpointActionRefused without a
    verified replica (a restore test never reads the local copy)."""
    from webapp.domain import restore_test

    with transaction.atomic():
        checkpoint = lock(checkpoint_id)
        if not checkpoint.replicas.filter(status=ReplicaStatus.VERIFIED).exists():
            raise CheckpointActionRefused(
                f"step {checkpoint.step} has no verified replica to restore from; "
                "replicate it first (a restore test never reads the local copy)"
            )
        row, alive = pending(checkpoint, ValidationKind.RESTORE)
        if alive:
            return Requested(row, coalesced=True)
        if row is None:
            row = restore_test.request(checkpoint, requested_by=actor)
        else:
            pk = row.pk
            transaction.on_commit(lambda: restore_test.enqueue(pk))
        audit(
            checkpoint,
            "checkpoint.restore_test_requested",
            actor,
            f"{actor} asked for a restore test of step {checkpoint.step}",
            validation=row.pk,
        )
    return Requested(row, coalesced=False)


def request_replication(checkpoint_id: int, actor: str, target: str | None = None) -> list[int]:
    """Copy a verified checkpoint to every enabled storage target of its project (or the
    one named), whatever their policies say. A target with a copy on its way or a
    verified copy of the same files is left alone (coalesced). Returns the replica ids
    queued, possibly none. Raises NoSuchTarget, or CheckpointActionRefused if the
    checkpoint is not verified."""
    from webapp.domain.replication.policy import request as request_replicas

    with transaction.atomic():
        checkpoint = lock(checkpoint_id)
        if checkpoint.status != CheckpointStatus.VERIFIED:
            raise CheckpointActionRefused(
                f"step {checkpoint.step} is {checkpoint.status}; only verified checkpoints "
                "are copied"
            )
        targets = checkpoint.project.storage_targets.filter(enabled=True).order_by("pk")
        if target:
            targets = targets.filter(name=target)
        targets = list(targets)
        if not targets:
            raise NoSuchTarget(
                f"no enabled storage target named {target!r} in this project"
                if target
                else "this project has no enabled storage target"
            )
        queued = request_replicas(checkpoint, targets, by_policy=False)
        if queued:
            copies = f"{len(queued)} cop{'y' if len(queued) == 1 else 'ies'}"
            audit(
                checkpoint,
                "checkpoint.replication_requested",
                actor,
                f"{actor} asked for {copies} of step {checkpoint.step}",
                replicas=queued,
            )
    return queued
