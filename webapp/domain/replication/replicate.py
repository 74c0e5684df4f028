"""Making one replica: claim it, send what the target lacks, confirm, write the manifest
last, record. workers.replicate calls these; each step is safe to repeat.

1. claim (short transaction): lock the Replica row; nothing to do if it is final or
   another worker holds its lease; else take the lease, count the attempt, note the
   files it will be made of.
2. send (no transaction): abort the multipart uploads a crashed attempt left (their ids
   are on the row), then for every file: skip it if its object is already on the target
   with the same sha256 (in the object's metadata), else stream it (upload.upload).
   Then confirm every object with a HEAD, and write the manifest.
3. record (short transaction): verified, failed, or back to pending for a retry.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

from botocore.exceptions import ClientError
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.domain.health import alerts
from webapp.domain.lease import Busy, busy_until
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Event, Replica
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.replication import fanout, packs, pieces, targets
from webapp.domain.replication.objects import keys_of
from webapp.domain.replication.sources import SourceUnavailable, sources
from webapp.domain.replication.upload import Throttle, abort_quietly

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 1.0
MANIFEST_FORMAT = "lifeboat.replica/1"
# A packed file adds where it is in its pack (replication/packs.py); a file cut at
# tensor boundaries lists its pieces instead of a key (replication/pieces.py).
MANIFEST_FIELDS = ("path", "size", "sha256", "key", "offset", "object_size", "pieces")


@dataclass
class Claim:
    replica_id: int
    # Results are recorded only if no later attempt took the replica over meanwhile.
    attempt: int
    stale_uploads: dict = field(default_factory=dict)


def claim(replica_id: int) -> Claim | Busy | None:
    now = timezone.now()
    with transaction.atomic():
        # Only the replica's row: its checkpoint, run, project and target are read.
        replica = (
            for_update(Replica.objects.select_related("checkpoint", "target"))
            .filter(pk=replica_id)
            .first()
        )
        if replica is None or replica.is_final:
            return None
        # Another worker is sending it, or a retry is not due yet; a replica the sweeper
        # handed back to the queue has no worker: the first task takes it.
        if replica.worker and (busy := busy_until(replica.lease_until, now)):
            return busy
        checkpoint = replica.checkpoint
        problem = None
        if checkpoint.status != CheckpointStatus.VERIFIED:
            problem = f"checkpoint is {checkpoint.status}, and only verified checkpoints are copied"
        elif not replica.target.enabled:
            problem = f"storage target {replica.target.name} is disabled"
        if problem:
            _finish(replica, ReplicaStatus.FAILED, problem, now)
            return None
        files = list(checkpoint.files.order_by("path").values("path", "size", "sha256"))
        for entry in files:
            entry["key"] = targets.blob_key(replica.target, entry["sha256"])
        stale = dict(replica.uploads)
        replica.status = ReplicaStatus.UPLOADING
        replica.attempts += 1
        replica.worker = socket.gethostname()
        replica.started_at = now
        replica.finished_at = None
        replica.lease_until = now + timedelta(seconds=settings.REPLICATION_LEASE_S)
        replica.files = files
        replica.bytes_total = sum(f["size"] for f in files)
        replica.bytes_done = replica.bytes_sent = 0
        replica.save()
        return Claim(replica.pk, replica.attempts, stale)


class _Progress:
    """Writes the bytes done and sent, and the open multipart uploads, to the row with
    the lease: the uploads as soon as they change, the rest about once a second."""

    def __init__(self, replica_id: int):
        self.replica_id = replica_id
        self.tally = fanout.Tally()
        self.last = time.monotonic()

    @property
    def done(self) -> int:
        return self.tally.done

    @property
    def sent(self) -> int:
        return self.tally.sent

    def wake(self) -> None:
        if self.tally.uploads_changed or time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.flush()

    def flush(self, **extra) -> None:
        with self.tally.lock:
            uploads = dict(self.tally.uploads)
            self.tally.uploads_changed = False
        self.last = time.monotonic()
        Replica.objects.filter(pk=self.replica_id).update(
            bytes_done=self.tally.done,
            bytes_sent=self.tally.sent,
            uploads=uploads,
            lease_until=timezone.now() + timedelta(seconds=settings.REPLICATION_LEASE_S),
            **extra,
        )


def on_target(client, bucket: str, key: str, sha256: str, size: int) -> bool:
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return head.get("Metadata", {}).get("sha256") == sha256 and head["ContentLength"] == size


def on_target_all(client, bucket: str, looks: list[tuple]) -> list[bool]:
    """on_target for each (key, sha256, size, name), LOOKS_AT_ONCE at a time: a copy that
    points into hundreds of pieces of earlier copies waits for one round trip, not for
    hundreds one after the other."""
    if not looks:
        return []
    with ThreadPoolExecutor(max_workers=min(LOOKS_AT_ONCE, len(looks))) as pool:
        return list(pool.map(lambda look: on_target(client, bucket, *look[:3]), looks))


LOOKS_AT_ONCE = 16
# Earlier replicas of the same run looked at for objects already on the target.
DEDUP_LOOKBACK = 8


def _worth_a_look(replica, claimed: Claim):
    """Which files to look for on the target (a HEAD) before sending them. A HEAD is a
    round trip: for a checkpoint of 10,000 small files it would double the requests.
    So: a file larger than one part (the HEAD is nothing beside its upload), every file
    on a retry (an earlier attempt may have sent it), and a file that one of the run's
    recent live replicas in the same store names (a tokenizer, a config, a frozen
    shard). A small file that is on the target for another reason is sent again: the
    same bytes under the same content address."""
    if claimed.attempt > 1:
        return lambda entry: True
    known: set[str] = set()
    for files in packs.earlier_files(replica, DEDUP_LOOKBACK):
        known |= keys_of(files)
    part = settings.REPLICATION_PART_SIZE
    return lambda entry: entry["size"] > part or entry["key"] in known


def abort_stale_uploads(client, bucket: str, replica, claimed: Claim) -> None:
    """Parts left by a crashed attempt would be kept (and billed) forever otherwise.
    The uploads that could not be aborted stay on the replica, so the next try
    aborts them again; the first failure is raised (retried)."""

    still_open, error = {}, None
    for key, upload_id in claimed.stale_uploads.items():
        if failed := abort_quietly(client, bucket, key, upload_id):
            still_open[key], error = upload_id, failed
    Replica.objects.filter(pk=replica.pk).update(uploads=still_open)
    if error is not None:
        raise error


def write_manifest(client, target, checkpoint, replica) -> str:
    """Written last, once every file is confirmed: a manifest on the target means a
    complete copy. Returns its key."""
    bucket = target.bucket
    manifest = {
        "format": MANIFEST_FORMAT,
        "project": checkpoint.project.slug,
        "run": checkpoint.run.key,
        "step": checkpoint.step,
        "checkpoint": checkpoint.pk,
        "location": checkpoint.location,
        "total_size": replica.bytes_total,
        "files": [{k: entry[k] for k in MANIFEST_FIELDS if k in entry} for entry in replica.files],
        "written_at": timezone.now().isoformat(),
    }
    body = json.dumps(manifest, indent=1).encode()
    digest = hashlib.sha256(body)
    mkey = targets.manifest_key(target, checkpoint)
    extra = {"StorageClass": target.storage_class} if target.storage_class else {}
    client.put_object(
        Bucket=bucket,
        Key=mkey,
        Body=body,
        ContentType="application/json",
        ChecksumSHA256=base64.b64encode(digest.digest()).decode(),
        Metadata={"sha256": digest.hexdigest()},
        **extra,
    )
    return mkey


def send_entries(client, replica, claimed: Claim, entries: list[dict], progress) -> list[dict]:
    """Send the entries of the replica's files the target lacks, from the checkpoint's
    own files (a whole replica, or one host's leg of a node-local one). Returns the
    entries that were there already."""
    target, bucket = replica.target, replica.target.bucket
    worth_a_look = _worth_a_look(replica, claimed)
    with sources(replica.checkpoint) as open_source:
        return fanout.send_files(
            client,
            bucket,
            entries,
            open_source=open_source,
            present=lambda e: (
                worth_a_look(e) and on_target(client, bucket, e["key"], e["sha256"], e["size"])
            ),
            tally=progress.tally,
            on_wake=progress.wake,
            files_at_once=settings.REPLICATION_FILES_AT_ONCE,
            upload_kwargs={
                "part_size": settings.REPLICATION_PART_SIZE,
                "concurrency": settings.REPLICATION_CONCURRENCY,
                "storage_class": target.storage_class,
                "throttle": Throttle(settings.REPLICATION_MAX_BYTES_PER_S),
                "part_checksum": settings.REPLICATION_PART_CHECKSUM,
            },
        )


def send(claimed: Claim) -> dict:
    """Everything that touches S3 and the source files. Returns what record_verified
    needs; raises SourceChanged / SourceUnavailable (permanent) or anything else
    (the target could not be reached: retried)."""

    replica = Replica.objects.select_related(
        "checkpoint__project", "checkpoint__run", "target"
    ).get(pk=claimed.replica_id)
    target, checkpoint = replica.target, replica.checkpoint
    try:
        client = targets.client_for(target)
    except targets.TargetRefused as exc:
        raise SourceUnavailable(str(exc)) from None  # the same answer on every try
    bucket = target.bucket

    abort_stale_uploads(client, bucket, replica, claimed)
    progress = _Progress(replica.pk)
    packed, alone = packs.split(replica.files)

    def earlier():
        return packs.earlier_files(replica, DEDUP_LOOKBACK)

    cut, alone = pieces.split(alone, checkpoint.location, earlier)
    reused: dict[str, int] = {}  # objects of earlier copies this one points into
    files_reused = 0
    try:
        if packed:
            with sources(checkpoint) as open_source:
                found = packs.send(client, replica, packed, open_source, progress, DEDUP_LOOKBACK)
            reused.update(found["reused_keys"])
            files_reused += found["reused"]
        if cut:
            with sources(checkpoint) as open_source:
                recent = list(earlier())
                cut_now = pieces.plan(replica, cut, open_source, progress, recent)
                found = pieces.send(client, replica, cut_now, open_source, progress, recent)
            reused.update(found["reused"])
            files_reused += sum(
                1 for e in cut_now if all(p["key"] in found["reused"] for p in e["pieces"])
            )
            cut_ids = {id(e) for e in cut_now}
            alone += [e for e in cut if id(e) not in cut_ids]  # no tensors found: whole
        skipped = send_entries(client, replica, claimed, alone, progress)
    finally:
        progress.flush()
    sent_files = len(replica.files) - len(skipped) - files_reused
    # The packs and pieces of earlier copies this one points into: still there, whole?
    # A file sent now was confirmed by the server's answer (its checksum checked, and
    # its sha256 compared before the upload was completed); one that was already there
    # may have been deleted since by retention of another replica: looked at again.
    looks = [(key, key.rsplit("/", 1)[-1], size, f"the object {key} of an earlier copy")
             for key, size in reused.items()]  # fmt: skip
    looks += [(e["key"], e["sha256"], e["size"], e["path"]) for e in skipped]
    for (*_, name), there in zip(looks, on_target_all(client, bucket, looks), strict=True):
        if not there:
            raise ConnectionError(f"{name} is not on the target")

    mkey = write_manifest(client, target, checkpoint, replica)
    progress.flush()
    return {
        "manifest_key": mkey,
        "bytes_done": progress.done,
        "bytes_sent": progress.sent,
        "files_sent": sent_files,
        "files": len(replica.files),
    }


def _finish(replica, status: str, message: str, now) -> None:
    replica.status = status
    replica.last_error = message[:4000]
    replica.finished_at = now
    replica.lease_until = None
    replica.save()


def _event(replica, type_: str, message: str, now, **data) -> None:
    Event.record(
        type_,
        checkpoint=replica.checkpoint,
        time=now,
        actor="worker:replicate",
        message=message,
        data={"replica": replica.pk, "target": replica.target.name, **data},
    )
    if type_ == "replica.failed":
        alerts.on_replica_failed(replica)


def owned_lock(claimed: Claim, with_checkpoint: bool = False):
    """The replica, locked, if this attempt still owns it; else None. With
    with_checkpoint, its checkpoint's row is locked first (the order of
    webapp/domain/locks.py)."""

    if with_checkpoint:
        checkpoint_id = Replica.objects.values_list("checkpoint_id", flat=True).get(
            pk=claimed.replica_id
        )
        for_update(Checkpoint.objects.filter(pk=checkpoint_id)).exists()
    replica = for_update(Replica.objects.select_related("checkpoint", "target")).get(
        pk=claimed.replica_id
    )
    if replica.status != ReplicaStatus.UPLOADING or replica.attempts != claimed.attempt:
        return None
    return replica


def record_verified(claimed: Claim, result: dict) -> str:
    now = timezone.now()
    with transaction.atomic():
        replica = owned_lock(claimed)
        if replica is None:
            return "superseded"
        replica.status = ReplicaStatus.VERIFIED
        replica.manifest_key = result["manifest_key"]
        replica.bytes_done = result["bytes_done"]
        replica.bytes_sent = result["bytes_sent"]
        replica.verified_at = now
        replica.uploads = {}
        _finish(replica, ReplicaStatus.VERIFIED, "", now)
        skipped = result["files"] - result["files_sent"]
        message = (
            f"Copied to {replica.target.name}: {result['files']} files, "
            f"{replica.bytes_total:,} bytes, every sha256 matched"
            + (f" ({skipped} already there, not sent again)" if skipped else "")
        )
        _event(replica, "replica.verified", message, now)
    return ReplicaStatus.VERIFIED


def record_source_changed(claimed: Claim, exc: Exception) -> str:
    """The bytes on disk are not the ones that were verified: the replica fails, and the
    checkpoint is flagged, since what it now holds is not what the job wrote."""

    now = timezone.now()
    with transaction.atomic():
        replica = owned_lock(claimed, with_checkpoint=True)
        if replica is None:
            return "superseded"
        _finish(replica, ReplicaStatus.FAILED, f"Not copied: {exc}", now)
        _event(replica, "replica.failed", replica.last_error, now)
        checkpoint = Checkpoint.objects.get(pk=replica.checkpoint_id)  # locked by _lock
        if checkpoint.status == CheckpointStatus.VERIFIED:
            checkpoint.status = CheckpointStatus.CORRUPT
            checkpoint.status_message = f"Found while copying to {replica.target.name}: {exc}"
            checkpoint.updated_at = now
            checkpoint.save(update_fields=["status", "status_message", "updated_at"])
            _event(replica, "checkpoint.corrupt", checkpoint.status_message, now)
    return ReplicaStatus.FAILED


def record_unavailable(claimed: Claim, exc: Exception) -> str:
    now = timezone.now()
    with transaction.atomic():
        replica = owned_lock(claimed)
        if replica is None:
            return "superseded"
        _finish(replica, ReplicaStatus.FAILED, f"Not copied: {exc}", now)
        _event(replica, "replica.failed", replica.last_error, now)
    return ReplicaStatus.FAILED


def record_error(claimed: Claim, exc: Exception) -> float | None:
    """The attempt could not reach the target (or died on the way). Back to pending with
    a retry due after an exponential backoff, or failed after the last attempt. Returns
    the delay before the retry, or None when there is none."""

    now = timezone.now()
    error = f"{type(exc).__name__}: {exc}"[:2000]
    with transaction.atomic():
        replica = owned_lock(claimed)
        if replica is None:
            return None
        if replica.attempts >= settings.REPLICATION_MAX_ATTEMPTS:
            _finish(
                replica,
                ReplicaStatus.FAILED,
                f"Could not copy to {replica.target.name} after {replica.attempts} attempts; "
                f"last error: {error}",
                now,
            )
            _event(replica, "replica.failed", replica.last_error, now)
            return None
        delay = min(
            settings.REPLICATION_RETRY_BASE_S * 2 ** (replica.attempts - 1),
            settings.REPLICATION_RETRY_MAX_S,
        )
        replica.status = ReplicaStatus.PENDING
        replica.last_error = error
        # The lease doubles as "not before": an early copy of the task waits for it.
        replica.lease_until = now + timedelta(seconds=delay)
        replica.save(update_fields=["status", "last_error", "lease_until"])
    return float(delay)


def abort_abandoned_uploads(target, older_than_s: float) -> list[str]:
    """Abort the multipart uploads under the target's objects that no replica knows of
    and that began more than `older_than_s` ago: left by a worker killed between
    starting an upload and writing its id down. (Uploads a replica knows of are aborted
    by its next attempt.) Returns the keys aborted."""

    client = targets.client_for(target)
    known = set()
    for uploads in Replica.objects.filter(
        status__in=(ReplicaStatus.PENDING, ReplicaStatus.UPLOADING), **targets.same_store(target)
    ).values_list("uploads", flat=True):
        known |= set((uploads or {}).values())
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    prefix = targets.blobs_prefix(target)
    aborted = []
    paginator = client.get_paginator("list_multipart_uploads")
    for page in paginator.paginate(Bucket=target.bucket, Prefix=prefix):
        for started in page.get("Uploads", []):
            if started["UploadId"] in known or started["Initiated"] > cutoff:
                continue
            if abort_quietly(client, target.bucket, started["Key"], started["UploadId"]) is None:
                aborted.append(started["Key"])
    return aborted
