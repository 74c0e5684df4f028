"""Copies owed and nobody making them (the sweeper: webapp/domain/repair.py).

* resend: a replica `uploading` whose lease lapsed (its worker died: the lease is
  renewed with every progress write, about once a second); one `pending` whose retry
  was due long ago (the retry's message was lost); one `pending` never taken, sent
  before owed_work.lost_before(). None of them while a worker has taken its message
  within SWEEP_LOST_AFTER_S (owed_work.taken_ids).
* request_missing: a checkpoint verified lately (since its target was made, within
  SWEEP_REPLICA_LOOKBACK_S) with no replica row on an enabled target whose policy asks
  for it. Validation creates the rows in the transaction that records the verdict, so
  this finds what an older version, or a verdict recorded by hand, left without.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from webapp.domain import owed_work
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Replica, StorageTarget
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.replication import policy

QUEUE = "replicate"


def resend(now, limit: int) -> list[owed_work.Owed]:
    margin = timedelta(seconds=min(60, settings.REPLICATION_LEASE_S))
    lost = owed_work.lost_before(now, QUEUE)
    in_hand = owed_work.taken_ids(now, QUEUE, {"workers.replicate.replicate": False})
    # Served by the partial index replica_unsettled. Uploading: its worker renews the
    # lease about once a second. Pending with a worker: a retry, due at lease_until.
    # Pending without one: never taken, or handed back by an earlier sweep (whose lease
    # then keeps this one from sending it again).
    rows = (
        Replica.objects.filter(
            Q(status=ReplicaStatus.UPLOADING, lease_until__lt=now)
            | Q(status=ReplicaStatus.PENDING, lease_until__lt=now - margin) & ~Q(worker="")
            | Q(
                status=ReplicaStatus.PENDING,
                worker="",
                lease_until__lt=owed_work.handed_back_before(now, QUEUE),
            )
            | Q(status=ReplicaStatus.PENDING, lease_until__isnull=True, created_at__lt=lost)
        )
        .exclude(pk__in=in_hand)
        .order_by("pk")
        .values_list(
            "pk",
            "status",
            "target__name",
            "checkpoint_id",
            "checkpoint__project_id",
            "checkpoint__run_id",
            "checkpoint__step",
        )[:limit]
    )
    owed = []
    for _pk, status, target, checkpoint, project, run, step in rows:
        reasons: dict[str, str] = {
            ReplicaStatus.UPLOADING: "its worker stopped mid-copy (the lease lapsed)",
            ReplicaStatus.PENDING: "its task was lost",
        }
        why = reasons[status]
        owed.append(
            owed_work.Owed(
                "replicate",
                project,
                f"the copy of step {step} to {target}: {why}; sent again",
                run_id=run,
                checkpoint_id=checkpoint,
            )
        )
    ids = [pk for pk, *_ in rows]
    # Handed back to the queue: no worker holds them now.
    Replica.objects.filter(pk__in=ids).update(
        status=ReplicaStatus.PENDING,
        worker="",
        lease_until=now + timedelta(seconds=settings.SWEEP_LOST_AFTER_S),
    )
    policy.enqueue(ids)
    return owed


def request_missing(now, limit: int) -> list[owed_work.Owed]:
    margin = timedelta(seconds=min(60, settings.REPLICATION_LEASE_S))
    since = now - timedelta(seconds=settings.SWEEP_REPLICA_LOOKBACK_S)
    owed = []
    for target in StorageTarget.objects.filter(enabled=True).order_by("pk"):
        # Served by the partial index checkpoint_verified_at.
        candidates = (
            Checkpoint.objects.filter(
                project_id=target.project_id,
                status=CheckpointStatus.VERIFIED,
                verified_at__gte=max(since, target.created_at),
                verified_at__lt=now - margin,
            )
            .exclude(replicas__target=target)
            .order_by("run_id", "step")
            .values_list("pk", flat=True)[:limit]
        )
        for checkpoint_id in candidates:
            with transaction.atomic():
                checkpoint = (
                    for_update(Checkpoint.objects.select_related("project"))
                    .filter(pk=checkpoint_id, status=CheckpointStatus.VERIFIED)
                    .first()
                )
                if checkpoint is None or not policy.request(checkpoint, [target]):
                    continue
            owed.append(
                owed_work.Owed(
                    "replicate",
                    target.project_id,
                    f"step {checkpoint.step} was verified without the copy to {target.name} "
                    "that its policy asks for: requested",
                    run_id=checkpoint.run_id,
                    checkpoint_id=checkpoint.pk,
                )
            )
    return owed
