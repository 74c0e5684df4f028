"""Removing a deleted replica's objects, and proving they are gone before saying so.

A DELETE that S3 answers with 204 is not proof that the bytes are gone. On a bucket with
versioning, it only adds a delete marker and the object's bytes stay, billed, as a
noncurrent version; a store that replicates between sites may list it again; a writer
that was still sending may put it back. So after removing, the store is asked with a
listing of each key's versions (ListObjectVersions, which lists current objects too, or
ListObjectsV2 where a store does not offer it) whether anything with that key is still
stored. Only then is the replica's `deleted_at` written. Otherwise the replica keeps
`deleted_at` empty, its `last_error` says what is still there and why, one
`replica.delete_unconfirmed` event and one `storage.delete_unconfirmed` alert are
recorded, and the sweeper tries again after RETENTION_RECHECK_S (a lifecycle rule added
in the meantime makes the next proof pass).

Lifeboat does not delete noncurrent versions itself: a team that turned versioning on
wants them kept from everyone, and the alert says what to change.

Objects are shared by content, so a copy being made while these deletes run may have
found one of them with a HEAD and skipped sending it; nothing orders that HEAD, on
another worker, before this DELETE. The live replicas are read again after the deletes:
a copy that names a deleted key the store no longer lists is sent again (reopened), and
an attempt under way is superseded, never recorded verified with an object missing.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from botocore.exceptions import ClientError
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from lifeboat.units import format_seconds
from webapp.domain.health import alerts
from webapp.domain.locks import for_update
from webapp.domain.models import Event, Replica
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.replication import policy, targets
from webapp.domain.replication.objects import keys_of, objects_of

log = logging.getLogger(__name__)

# Error codes of stores that do not implement ListObjectVersions.
_NO_VERSIONS_API = {"NotImplemented", "MethodNotAllowed", "XNotImplemented", "InvalidRequest"}
_AT_ONCE = 16  # listings in flight while proving a replica of many files
_SETTLED = (ReplicaStatus.VERIFIED, ReplicaStatus.FAILED)


def remove(replica) -> list[str]:
    """The manifest, and each content-addressed object no other live replica in the same
    store names (a tokenizer shared with a checkpoint that stays, stays). Returns the keys
    it deleted."""

    client = targets.client_for(replica.target)
    bucket = replica.target.bucket
    # Every live replica in the same place, of any project: a key one of them names stays
    # (two projects' targets on one prefix, or one project's two targets on one store).
    others = (
        Replica.objects.filter(**targets.same_store(replica.target))
        .exclude(pk=replica.pk)
        .exclude(status=ReplicaStatus.DELETED)
        .values_list("pk", "status", "started_at", "files", "manifest_key")
    )
    mine = keys_of(replica.files)
    manifests = set()
    seen = {}
    for pk, status, started_at, files, manifest_key in others:
        mine -= keys_of(files)
        manifests.add(manifest_key)
        if status in _SETTLED:
            seen[pk] = started_at
    deleted = []
    if replica.manifest_key and replica.manifest_key not in manifests:
        client.delete_object(Bucket=bucket, Key=replica.manifest_key)
        deleted.append(replica.manifest_key)
    for key in sorted(mine):
        client.delete_object(Bucket=bucket, Key=key)  # an absent key is no error in S3
        deleted.append(key)
    reopen_copies_that_lost(
        replica.target,
        set(deleted),
        f"with the replica of step {replica.checkpoint.step} they were shared with",
        actor="retention",
        seen=seen,
    )
    return deleted


def reopen_copies_that_lost(
    target, deleted: set[str], why: str, actor: str, seen: dict | None = None
) -> int:
    """Read the store's live replicas again, once `deleted` are gone: one that names a
    deleted key was claimed meanwhile (it was not live, or named other files, when they
    were read first), and may have found the object with a HEAD just before it went. Each
    copy that names a key the store no longer lists is sent again. Returns how many.

    `seen`: {replica id: started_at} of the replicas that were settled (verified or
    failed) at the first read. A settled replica's files change only when it is claimed
    again, which writes another started_at, so only replicas not in `seen` (copies under
    way write their files as they go: the packs they point into) or claimed since are
    read whole again."""
    if not deleted:
        return 0
    live = Replica.objects.filter(**targets.same_store(target)).exclude(
        status=ReplicaStatus.DELETED
    )
    if seen is not None:
        claimed_since = [
            pk
            for pk, started_at in live.values_list("pk", "started_at")
            if pk not in seen or seen[pk] != started_at
        ]
        live = live.filter(pk__in=claimed_since)
    late = live.values_list("pk", "files")
    named = {pk: deleted & keys_of(files) for pk, files in late}
    named = {pk: keys for pk, keys in named.items() if keys}
    if not named:
        return 0
    client = targets.client_for(target)
    asked = sorted(set().union(*named.values()))
    present = {i["key"] for i in still_stored(client, target.bucket, asked) if i["current"]}
    return sum(
        _reopen(pk, len(lost), why, actor) for pk, keys in named.items() if (lost := keys - present)
    )


def _reopen(pk: int, lost: int, why: str, actor: str) -> bool:
    now = timezone.now()
    with transaction.atomic():
        row = (
            for_update(Replica.objects.select_related("checkpoint", "target")).filter(pk=pk).first()
        )
        # A pending copy looks at the target again when it is claimed.
        if row is None or row.status not in (ReplicaStatus.VERIFIED, ReplicaStatus.UPLOADING):
            return False
        message = (
            f"{lost} of its objects on {row.target.name} were deleted, {why}, while this "
            "copy was being made: it is sent again."
        )
        if row.status == ReplicaStatus.VERIFIED:
            row.attempts = 0
            row.worker = ""
            row.lease_until = None
        # An attempt under way is superseded: it records nothing (replicate.owned_lock),
        # and its lease, which it renews until it stops, holds off the next attempt.
        was = row.status
        row.status = ReplicaStatus.PENDING
        row.verified_at = None
        row.last_error = message
        row.save(
            update_fields=[
                "status",
                "attempts",
                "worker",
                "lease_until",
                "verified_at",
                "last_error",
            ]
        )
        Event.record(
            "replica.reopened",
            checkpoint=row.checkpoint,
            time=now,
            actor=actor,
            message=message,
            data={"replica": row.pk, "target": row.target.name, "was": was, "lost": lost},
        )
        log.warning("replica %s: %s", row.pk, message)
        transaction.on_commit(lambda: policy.enqueue([row.pk]))
    return True


def still_stored(client, bucket: str, keys: list[str]) -> list[dict]:
    """[{key, bytes, current}] for each key of which the store still lists something:
    the object itself, or older versions of it (delete markers hold no bytes)."""
    if not keys:
        return []
    with ThreadPoolExecutor(max_workers=min(_AT_ONCE, len(keys))) as pool:
        found = list(pool.map(lambda key: _listed(client, bucket, key), keys))
    return [f for f in found if f is not None]


def _listed(client, bucket: str, key: str) -> dict | None:
    try:
        page = client.list_object_versions(Bucket=bucket, Prefix=key, MaxKeys=100)
        versions = [v for v in page.get("Versions", []) if v["Key"] == key]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in _NO_VERSIONS_API:
            raise
        page = client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
        versions = [v for v in page.get("Contents", []) if v["Key"] == key]
    if not versions:
        return None
    return {
        "key": key,
        "bytes": sum(v["Size"] for v in versions),
        # ListObjectsV2 lists current objects only; IsLatest is false on older versions.
        "current": any(v.get("IsLatest", True) for v in versions),
    }


def finish(replica, actor: str) -> bool:
    """Remove the replica's objects and prove it; True when `deleted_at` was written."""

    keys = remove(replica)
    left = still_stored(targets.client_for(replica.target), replica.target.bucket, keys)
    now = timezone.now()
    if not left:
        # A pack is one object of object_size bytes, whichever of its files is read.
        sizes = dict(pair for entry in replica.files for pair in objects_of(entry))
        freed = sum(sizes.get(key, 0) for key in keys)  # the manifest's few bytes aside
        Replica.objects.filter(pk=replica.pk).update(
            deleted_at=now, last_error="", freed_bytes=freed
        )
        return True
    _report(replica, left, actor, now)
    return False


def _report(replica, left: list[dict], actor: str, now) -> None:
    stored = sum(item["bytes"] for item in left)
    current = sum(1 for item in left if item["current"])
    message = (
        f"Deleted on {replica.target.name} but still stored: {len(left)} of its objects "
        f"({stored:,} bytes), {current} current and {len(left) - current} kept only as older "
        "versions. "
    )
    if current < len(left):
        message += (
            f"The bucket {replica.target.bucket} keeps versions, so a DELETE only hides an "
            "object: add a lifecycle rule that expires noncurrent versions. "
        )
    if current:
        message += "Something wrote them again, or the store did not delete them. "
    message += f"Lifeboat checks again in {format_seconds(settings.RETENTION_RECHECK_S)}."
    checkpoint = replica.checkpoint
    first_time = replica.last_error != message
    Replica.objects.filter(pk=replica.pk).update(
        last_error=message,
        lease_until=now + timedelta(seconds=settings.RETENTION_RECHECK_S),
    )
    log.warning("retention: replica %s: %s", replica.pk, message)
    if not first_time:
        return
    Event.record(
        "replica.delete_unconfirmed",
        checkpoint=checkpoint,
        time=now,
        actor=actor,
        message=message,
        data={
            "scope": "replicas",
            "replica": replica.pk,
            "target": replica.target.name,
            "still_stored": left[:100],
        },
    )
    alerts.record(
        "storage.delete_unconfirmed",
        f"storage.delete_unconfirmed:{replica.pk}",
        f"Step {checkpoint.step} of run {checkpoint.run.key}: {message}",
        project_id=checkpoint.project_id,
        run_id=checkpoint.run_id,
        checkpoint_id=checkpoint.pk,
        data={"bytes": stored, "objects": len(left)},
    )
