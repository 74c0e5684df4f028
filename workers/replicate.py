"""The `replicate` queue: copy one checkpoint to one storage target, verified.

The work is in webapp.domain.replication.replicate; this module decides what each
outcome means for the task. Acknowledged late: a worker killed mid-upload is redelivered
(after CELERY_VISIBILITY_TIMEOUT) and the next attempt aborts the multipart uploads it
left, skips the files already on the target, and finishes.
"""

from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task(name="workers.replicate.replicate", ignore_result=True)
def replicate(replica_id: int) -> str:
    from webapp.domain.replication import replicate as r
    from webapp.domain.replication.upload import SourceChanged

    claimed = r.claim(replica_id)
    if claimed is None:
        return "settled"
    if isinstance(claimed, r.Busy):
        # Someone holds the lease (or a retry is not due): look again when it lapses,
        # in case its holder died.
        replicate.apply_async((replica_id,), countdown=claimed.retry_in_s)
        return "busy"
    try:
        result = r.send(claimed)
    except SourceChanged as exc:
        return r.record_source_changed(claimed, exc)
    except r.SourceUnavailable as exc:
        return r.record_unavailable(claimed, exc)
    except Exception as exc:
        log.warning("replica %s: attempt %s failed: %s", replica_id, claimed.attempt, exc)
        delay = r.record_error(claimed, exc)
        if delay is None:
            return "failed"
        replicate.apply_async((replica_id,), countdown=delay)
        return "retrying"
    return r.record_verified(claimed, result)


@shared_task(name="workers.replicate.abort_abandoned_uploads", ignore_result=True)
def abort_abandoned_uploads() -> int:
    """Beat: the lifecycle rule S3 calls AbortIncompleteMultipartUpload, for every
    enabled target, after REPLICATION_ABANDONED_UPLOAD_S (a day)."""
    from django.conf import settings

    from webapp.domain.models import StorageTarget
    from webapp.domain.replication.replicate import abort_abandoned_uploads as abort

    aborted = 0
    for target in StorageTarget.objects.filter(enabled=True):
        try:
            aborted += len(abort(target, settings.REPLICATION_ABANDONED_UPLOAD_S))
        except Exception:
            log.exception("could not look for abandoned uploads on %s", target)
    return aborted
