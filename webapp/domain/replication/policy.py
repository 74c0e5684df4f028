"""Which verified checkpoints go to which storage target, and putting them on the queue.

Each target has its own policy (StorageTarget.policy):
  all      every verified checkpoint;
  best     a checkpoint whose metric beats every checkpoint already copied there for
           its run (min or max);
  every_n  a checkpoint whose step is a multiple of N;
  latest   a checkpoint newer than every checkpoint of its run already copied there;
  manual   only when asked (POST /api/v1/checkpoints/<id>/replicate).
"""

from __future__ import annotations

import logging
import math

from django.db import transaction

from webapp.domain import publish
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Replica
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.projects import ReplicationPolicy
from webapp.domain.models.recovery import ReplicaStatus

log = logging.getLogger(__name__)


def _metric(checkpoint, name: str) -> float | None:
    value = (checkpoint.metrics or {}).get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def wants(target, checkpoint) -> bool:
    policy = target.policy
    if policy == ReplicationPolicy.ALL:
        return True
    if policy == ReplicationPolicy.EVERY_N:
        return checkpoint.step % max(target.policy_every_n, 1) == 0
    copied = Checkpoint.objects.filter(
        run_id=checkpoint.run_id,
        replicas__target=target,
        replicas__status__in=(
            ReplicaStatus.PENDING,
            ReplicaStatus.UPLOADING,
            ReplicaStatus.VERIFIED,
        ),
    ).exclude(pk=checkpoint.pk)
    if policy == ReplicationPolicy.LATEST:
        return not copied.filter(step__gt=checkpoint.step).exists()
    if policy == ReplicationPolicy.BEST:
        mine = _metric(checkpoint, target.policy_metric)
        if mine is None:
            return False
        others = [v for c in copied if (v := _metric(c, target.policy_metric)) is not None]
        if not others:
            return True
        return mine < min(others) if target.policy_mode == "min" else mine > max(others)
    return False


def _matches(replica, checkpoint) -> bool:
    """Whether a replica holds the checkpoint's current files (a step saved again with
    other files needs a new copy)."""
    current = sorted(checkpoint.files.values_list("path", "sha256"))
    return sorted((f["path"], f["sha256"]) for f in replica.files) == current


def request(checkpoint, targets=None, *, by_policy: bool = True) -> list[int]:
    """Create (or reopen) the replicas the checkpoint should have, inside the caller's
    transaction, and enqueue them once it commits. With by_policy=False every given
    target gets one (an explicit request). Returns the replica ids queued."""

    if targets is None:
        targets = checkpoint.project.storage_targets.filter(enabled=True).order_by("pk")
    queued = []
    for target in targets:
        replica = Replica.objects.filter(checkpoint=checkpoint, target=target).first()
        if replica is not None:
            if replica.status in (ReplicaStatus.PENDING, ReplicaStatus.UPLOADING):
                continue  # a task has it
            if replica.status == ReplicaStatus.VERIFIED and _matches(replica, checkpoint):
                continue
            if by_policy and replica.status != ReplicaStatus.VERIFIED:
                continue  # failed or deleted: only a person asks for it again
        elif by_policy and not wants(target, checkpoint):
            continue
        if replica is None:
            replica = Replica(checkpoint=checkpoint, target=target)
        replica.status = ReplicaStatus.PENDING
        replica.attempts = 0
        replica.last_error = ""
        replica.lease_until = None
        replica.worker = ""
        replica.verified_at = replica.deleted_at = None
        replica.save()
        queued.append(replica.pk)
    if queued:
        transaction.on_commit(lambda: enqueue(queued))
    return queued


def enqueue(replica_ids: list[int]) -> None:
    """After commit. If the broker is down the rows stay pending and
    the sweeper (webapp/domain/replication/owed.py) puts them on the queue later."""

    for replica_id in replica_ids:
        try:
            publish.send("workers.replicate.replicate", (replica_id,))
        except Exception:
            log.exception("could not enqueue replica %s", replica_id)
            return


def on_verified(checkpoint_id: int) -> list[int]:
    """Called once validation has found a checkpoint verified."""

    with transaction.atomic():
        checkpoint = (
            for_update(Checkpoint.objects.select_related("project"))
            .filter(pk=checkpoint_id, status=CheckpointStatus.VERIFIED)
            .first()
        )
        if checkpoint is None:
            return []
        return request(checkpoint)
