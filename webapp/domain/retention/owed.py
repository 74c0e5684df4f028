"""Deletions a worker left half done, finished (the sweeper: webapp/domain/repair.py).

A local copy is marked `deleting` before its files go, and a replica `deleted` before
its objects go; a worker killed in between leaves the mark. One marked longer ago than
SWEEP_STUCK_S (a replica: past its deletion lease) was interrupted: its project gets a
task that finishes those, and only those (retention.policy.finish_interrupted).
"""

from __future__ import annotations

from django.db.models import Q

from webapp.domain import owed_work, publish
from webapp.domain.models import Checkpoint, Replica
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus

TASK = "workers.retention.finish_interrupted"


def resend(now, limit: int) -> list[owed_work.Owed]:
    before = owed_work.stuck_before(now)
    local = Checkpoint.objects.filter(status=CheckpointStatus.DELETING, updated_at__lt=before)
    remote = Replica.objects.filter(status=ReplicaStatus.DELETED, deleted_at__isnull=True).filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    )
    counts: dict[int, int] = {}
    for project_id in [
        *local.values_list("project_id", flat=True)[:limit],
        *remote.values_list("checkpoint__project_id", flat=True)[:limit],
    ]:
        counts[project_id] = counts.get(project_id, 0) + 1
    owed = []
    for project_id, n in sorted(counts.items()):
        publish.send(TASK, (project_id, before.isoformat()))
        owed.append(
            owed_work.Owed(
                "retention",
                project_id,
                f"{n} deletion{'s' if n > 1 else ''} left half done by a worker that stopped: "
                "sent again to finish",
            )
        )
    return owed
