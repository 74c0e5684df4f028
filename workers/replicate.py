"""The `replicate` queue: copy one checkpoint to one storage target, verified.

The work is in webapp.domain.replication.replicate; this module decides what each
outcome means for the task. Acknowledged late: a worker killed mid-upload is redelivered
(after CELERY_VISIBILITY_TIMEOUT) and the next attempt aborts the multipart uploads it
left, skips the files already on the target, and finishes.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from webapp.domain.models import Replica, StorageAudit, StorageTarget
from webapp.domain.replication import host_legs
from webapp.domain.replication import replicate as r
from webapp.domain.replication.replicate import Claim
from webapp.domain.replication.replicate import abort_abandoned_uploads as abort
from webapp.domain.replication.upload import SourceChanged
from webapp.domain.retention import orphans
from webapp.domain.validation import node_local

log = logging.getLogger(__name__)


@shared_task(name="workers.replicate.replicate", ignore_result=True)
def replicate(replica_id: int) -> str:
    claimed = r.claim(replica_id)
    if claimed is None:
        return "settled"
    if isinstance(claimed, r.Busy):
        # Someone holds the lease (or a retry is not due): look again when it lapses,
        # in case its holder died.
        replicate.apply_async((replica_id,), countdown=claimed.retry_in_s)
        return "busy"
    if _node_local(replica_id):
        # Sent by each host's worker (replication/host_legs.py).
        def split() -> str:
            host_legs.fan_out(claimed)
            return "fanned out"

        return _outcome(claimed, split)
    return _outcome(claimed, lambda: r.record_verified(claimed, r.send(claimed)))


def _node_local(replica_id: int) -> bool:
    replica = Replica.objects.select_related("checkpoint__project").get(pk=replica_id)
    return node_local.applies(replica.checkpoint)


def _outcome(claimed, attempt) -> str:
    """What an attempt's (or a leg's) ending means: recorded, retried, or failed."""

    try:
        return attempt()
    except SourceChanged as exc:
        return r.record_source_changed(claimed, exc)
    except r.SourceUnavailable as exc:
        return r.record_unavailable(claimed, exc)
    except Exception as exc:
        log.warning("replica %s: attempt %s failed: %s", claimed.replica_id, claimed.attempt, exc)
        delay = r.record_error(claimed, exc)
        if delay is None:
            return "failed"
        replicate.apply_async((claimed.replica_id,), countdown=delay)
        return "retrying"


@shared_task(name="workers.replicate.replicate_leg", ignore_result=True)
def replicate_leg(replica_id: int, attempt: int, host: str) -> str:
    """One host's share of a node-local checkpoint's copy (queue replicate.<host>)."""

    claimed = Claim(replica_id, attempt)

    def send_then_note() -> str:
        if (sent := host_legs.send_leg(claimed, host)) == "sent":
            host_legs.leg_done(claimed, host)
        return sent

    return _outcome(claimed, send_then_note)


@shared_task(name="workers.replicate.finish_legs", ignore_result=True)
def finish_legs(replica_id: int, attempt: int) -> str:
    """Every host sent its share: confirm every object, write the manifest."""

    claimed = Claim(replica_id, attempt)
    return _outcome(claimed, lambda: host_legs.finish(claimed))


@shared_task(name="workers.replicate.abort_abandoned_uploads", ignore_result=True)
def abort_abandoned_uploads() -> int:
    """Beat: the lifecycle rule S3 calls AbortIncompleteMultipartUpload, for every
    enabled target, after REPLICATION_ABANDONED_UPLOAD_S (a day)."""

    aborted = 0
    for target in StorageTarget.objects.filter(enabled=True):
        try:
            aborted += len(abort(target, settings.REPLICATION_ABANDONED_UPLOAD_S))
        except Exception:
            log.exception("could not look for abandoned uploads on %s", target)
    return aborted


@shared_task(name="workers.replicate.audit_storage", ignore_result=True)
def audit_storage() -> int:
    """Beat, every STORAGE_AUDIT_S: an audit of every enabled target, each its own task."""

    ids = list(StorageTarget.objects.filter(enabled=True).values_list("pk", flat=True))
    for target_id in ids:
        audit_target.delay(target_id, "worker:storage-audit")
    return len(ids)


@shared_task(name="workers.replicate.audit_target", ignore_result=True)
def audit_target(target_id: int, actor: str) -> int | None:
    """List one target and record what no record accounts for
    (webapp/domain/retention/orphans.py); safe to run twice."""

    target = StorageTarget.objects.filter(pk=target_id).first()
    return None if target is None else orphans.audit(target, actor).pk


@shared_task(name="workers.replicate.clean_storage", ignore_result=True)
def clean_storage(audit_id: int, actor: str) -> dict | None:
    """Delete what an audit found, checked again (a second run is refused)."""

    row = StorageAudit.objects.select_related("target").filter(pk=audit_id).first()
    if row is None:
        return None
    try:
        return orphans.clean(row, actor)
    except orphans.CleanRefused as exc:
        log.warning("storage cleanup of audit %s refused: %s", audit_id, exc)
        return None
