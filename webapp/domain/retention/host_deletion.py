"""A node-local checkpoint's local copy removed where it lives: each host's share by a
worker on that host (queue validate.<host>), recorded once every share is gone.

retention decides as for any checkpoint (local_deletion.carry_out, after its reasons were
re-checked under lock and it was marked `deleting`), then sends one task per host whose
parts are not yet removed. Each removes the files of the ranks that ran there (the same
confined removal as any local copy) and marks those parts removed; the last one records
the checkpoint `deleted`. A host that fails records the failure: the checkpoint is
verified again with the error, as for any failed deletion (its verified replica is
whole), and the next retention run sends what is left. A host with no worker leaves it
`deleting`; the sweeper's finish of interrupted deletions sends it again later.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, CheckpointPart
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.retention import local_deletion

log = logging.getLogger(__name__)


def remove_share(checkpoint_id: int, host: str, actor: str, why: str, previous) -> str:
    checkpoint = Checkpoint.objects.select_related("project").filter(pk=checkpoint_id).first()
    if checkpoint is None or checkpoint.status != CheckpointStatus.DELETING:
        return "settled"
    ranks = list(
        checkpoint.parts.filter(host=host, removed_at__isnull=True).values_list("rank", flat=True)
    )
    if not ranks:
        return "done"
    paths = list(checkpoint.files.filter(rank__in=ranks).values_list("path", flat=True))
    try:
        local_deletion.remove_local_copy(checkpoint, paths)
    except Exception as exc:  # noqa: BLE001 (recorded: the checkpoint is kept, verified)
        log.warning("retention: removing %s's share of %s failed: %s", host, checkpoint, exc)
        error = f"on host {host}: {exc}"
        local_deletion.record(checkpoint_id, actor, why, previous, error)
        return "failed"
    with transaction.atomic():
        locked = for_update(Checkpoint.objects.filter(pk=checkpoint_id)).first()
        if locked is None or locked.status != CheckpointStatus.DELETING:
            return "settled"
        CheckpointPart.objects.filter(checkpoint_id=checkpoint_id, rank__in=ranks).update(
            removed_at=timezone.now()
        )
        if locked.parts.filter(removed_at__isnull=True).exists():
            return "removed"
        local_deletion.record(checkpoint_id, actor, why, previous, None)
    return "deleted"
