"""The storage audit: objects on a target that no record accounts for, and their cleanup.

Orphans come from uploads a worker never finished (objects sent, the replica then failed
or its row removed), replicas whose records were deleted with their project, and
multipart uploads begun by a worker that died before writing their id down. They cost
money and nobody sees them. The audit lists the target's own keys only
(`<prefix>/sha256/` and the project's own `<prefix>/manifests/<project>/`: nothing else
in the bucket is looked at, let alone deleted) and compares them with the replicas of
every project.

An object is accounted for when a replica not yet deleted names it (its files are
recorded when it is claimed, before any byte is sent, and its manifest key is known from
its checkpoint), or when its replica's deletion is still under way; replicas on every
target with the same bucket name count, whatever its endpoint is called. An object younger
than STORAGE_AUDIT_GRACE_S is not judged. The audit is the dry run: `clean` deletes only
objects that were older than the audit's own cutoff and that no replica names when the
cleanup looks again, aborts only the uploads the audit listed that no replica knows of
since, proves the deletions with a listing (replica_objects.still_stored), and sends
again any replica claimed during the cleanup that names an object it deleted.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from webapp.domain.health import alerts
from webapp.domain.models import Event, Replica, StorageAudit, StorageTarget
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.models.storage_audit import AuditStatus
from webapp.domain.replication import targets
from webapp.domain.replication.objects import keys_of
from webapp.domain.retention import replica_objects

log = logging.getLogger(__name__)

SHOWN = 1000  # orphans kept on the audit's row, the largest first
_BATCH = 1000  # keys per DeleteObjects request (S3's limit)


def _live_replicas(target):
    """Replicas whose objects must stay: any not deleted, and deleted ones whose objects
    are still being removed (or not yet proven gone), on every target, of any project,
    with this bucket name. Wider than namespace.same_store on purpose: two spellings of
    one endpoint that the namespace cannot tell apart (a host name and its address) must
    never let one project's cleanup take another's objects; a key names its prefix, so
    other prefixes in the bucket simply do not match."""

    same_bucket = StorageTarget.objects.filter(bucket=target.bucket).values("pk")
    return Replica.objects.filter(target_id__in=same_bucket).exclude(
        status=ReplicaStatus.DELETED, deleted_at__isnull=False
    )


def accounted(target) -> tuple[set[str], set[str]]:
    """(object keys, multipart upload ids) the records account for."""
    keys: set[str]
    uploads: set[str]
    keys, uploads = set(), set()
    rows = _live_replicas(target).values_list(
        "files", "manifest_key", "uploads", "checkpoint__project__slug",
        "checkpoint__run__key", "checkpoint__step",
    )  # fmt: skip
    for files, manifest, open_uploads, slug, run_key, step in rows:
        keys.update(keys_of(files))
        keys.add(manifest)
        # Written last, before the row says verified: known from the checkpoint.
        keys.add(targets.manifest_key_of(target, slug, run_key, step))
        uploads.update((open_uploads or {}).values())
    keys.discard("")
    return keys, uploads


def _prefixes(target) -> list[str]:
    """The shared content-addressed objects, and this project's own manifests only: the
    manifests of other projects on the same store name their runs, and are theirs to
    audit."""
    own_manifests = f"{targets.manifests_prefix(target)}{target.project.slug}/"
    return [targets.blobs_prefix(target), own_manifests]


def _listing(client, target):
    paginator = client.get_paginator("list_objects_v2")
    for prefix in _prefixes(target):
        for page in paginator.paginate(Bucket=target.bucket, Prefix=prefix):
            yield from page.get("Contents", [])


def _abandoned_uploads(client, target, known: set[str], cutoff) -> list[dict]:
    found = []
    paginator = client.get_paginator("list_multipart_uploads")
    for prefix in _prefixes(target):
        for page in paginator.paginate(Bucket=target.bucket, Prefix=prefix):
            for started in page.get("Uploads", []):
                if started["UploadId"] in known or started["Initiated"] > cutoff:
                    continue
                parts = client.get_paginator("list_parts").paginate(
                    Bucket=target.bucket, Key=started["Key"], UploadId=started["UploadId"]
                )
                size = sum(p["Size"] for page_ in parts for p in page_.get("Parts", []))
                found.append({
                    "key": started["Key"], "upload_id": started["UploadId"],
                    "initiated": started["Initiated"].isoformat(), "bytes": size,
                })  # fmt: skip
    return found


def audit(target, actor: str) -> StorageAudit:
    """List the target and record what no record accounts for (safe to run twice: each
    run is a row of its own)."""
    row = StorageAudit.objects.create(target=target, actor=actor)
    cutoff = row.started_at - timedelta(seconds=settings.STORAGE_AUDIT_GRACE_S)
    try:
        client = targets.client_for(target)
        keys, known_uploads = accounted(target)
        orphans = []
        for item in _listing(client, target):
            row.listed_objects += 1
            row.listed_bytes += item["Size"]
            if item["Key"] in keys:
                row.accounted_objects += 1
                row.accounted_bytes += item["Size"]
            elif item["LastModified"] > cutoff:
                row.recent_objects += 1
            else:
                orphans.append(item)
        row.uploads = _abandoned_uploads(client, target, known_uploads, cutoff)
    except Exception as exc:  # noqa: BLE001 (the store's answer is shown on the audit)
        log.exception("storage audit of target %s failed", target.pk)
        row.status, row.error = AuditStatus.FAILED, str(exc)[:1000]
        row.finished_at = timezone.now()
        row.save()
        return row
    orphans.sort(key=lambda item: (-item["Size"], item["Key"]))
    row.orphan_objects = len(orphans)
    row.orphan_bytes = sum(item["Size"] for item in orphans)
    row.orphans = [
        {"key": o["Key"], "bytes": o["Size"], "modified": o["LastModified"].isoformat()}
        for o in orphans[:SHOWN]
    ]
    row.upload_bytes = sum(u["bytes"] for u in row.uploads)
    row.status, row.finished_at = AuditStatus.DONE, timezone.now()
    row.save()
    _alert(row)
    return row


def _alert(row: StorageAudit) -> None:
    if not (row.orphan_objects or row.uploads):
        return
    if row.unaccounted_bytes < settings.STORAGE_AUDIT_ALERT_BYTES:
        return
    target = row.target
    alerts.record(
        "storage.orphans",
        # The same finding on the next audit is not news.
        f"storage.orphans:{target.pk}:{row.orphan_objects}:{row.orphan_bytes}:{len(row.uploads)}",
        f"Storage target {target.name} holds {row.orphan_objects:,} objects "
        f"({row.orphan_bytes:,} bytes) and {len(row.uploads)} unfinished uploads "
        f"({row.upload_bytes:,} bytes) that no record accounts for: review and clean them "
        "on its audit page.",
        project_id=target.project_id,
        data={"audit": row.pk, "bytes": row.unaccounted_bytes},
    )


class CleanRefused(Exception):
    """The audit cannot be cleaned (not finished, already cleaned, or not the newest)."""


def clean(row: StorageAudit, actor: str) -> dict:
    """Delete what the audit found, checked again now; recorded on the audit and as a
    `storage.cleaned` event. Returns the counts."""
    target = row.target
    newest = StorageAudit.objects.filter(target=target).order_by("-started_at").first()
    if row.status != AuditStatus.DONE or row.cleaned_at is not None or newest != row:
        raise CleanRefused("only the newest finished audit of a target, and only once")
    claimed = StorageAudit.objects.filter(pk=row.pk, cleaned_at__isnull=True).update(
        cleaned_at=timezone.now(), cleaned_by=actor[:200]
    )
    if not claimed:
        raise CleanRefused("this audit is being cleaned already")
    cutoff = row.started_at - timedelta(seconds=settings.STORAGE_AUDIT_GRACE_S)
    client = targets.client_for(target)
    keys, known_uploads = accounted(target)
    doomed = [
        item for item in _listing(client, target)
        if item["Key"] not in keys and item["LastModified"] <= cutoff
    ]  # fmt: skip
    for start in range(0, len(doomed), _BATCH):
        batch = [{"Key": item["Key"]} for item in doomed[start : start + _BATCH]]
        client.delete_objects(Bucket=target.bucket, Delete={"Objects": batch, "Quiet": True})
    gone = [item["Key"] for item in doomed]
    left = replica_objects.still_stored(client, target.bucket, gone)
    aborted = 0
    for upload in row.uploads:
        if upload["upload_id"] in known_uploads:
            continue
        client.abort_multipart_upload(
            Bucket=target.bucket, Key=upload["key"], UploadId=upload["upload_id"]
        )
        aborted += 1
    resent = replica_objects.reopen_copies_that_lost(
        target, set(gone), f"as orphans by the cleanup of storage audit {row.pk}", actor
    )
    freed = sum(item["Size"] for item in doomed) - sum(item["bytes"] for item in left)
    counts = {
        "objects": len(doomed) - len(left),
        "bytes": freed,
        "uploads": aborted,
        "still_stored": len(left),
        "replicas_sent_again": resent,
    }
    StorageAudit.objects.filter(pk=row.pk).update(
        cleaned_objects=counts["objects"], cleaned_bytes=freed, cleaned_uploads=aborted
    )
    Event.record(
        "storage.cleaned",
        project=target.project_id,
        actor=actor,
        message=(
            f"Storage target {target.name}: {counts['objects']:,} objects no record accounted "
            f"for deleted ({freed:,} bytes), {aborted} unfinished uploads aborted"
            + (f"; {len(left)} still listed after the delete" if left else "")
            + (f"; {resent} replicas claimed meanwhile sent again" if resent else "")
            + "."
        ),
        data={"scope": "storage", "target": target.name, "audit": row.pk, **counts},
    )
    return counts


def findings(project, limit: int = 20) -> dict:
    """What the storage page shows of the proofs: deletions the store has not carried
    out (replicas retention deleted whose objects are still listed), and each target's
    newest audit."""
    unconfirmed = (
        Replica.objects.filter(
            target__project=project, status=ReplicaStatus.DELETED, deleted_at__isnull=True
        )
        .exclude(last_error="")
        .select_related("checkpoint__run", "target")
        .order_by("-pk")
    )
    newest: dict[int, StorageAudit] = {}
    for row in StorageAudit.objects.filter(target__project=project).order_by(
        "target_id", "-started_at"
    ):
        newest.setdefault(row.target_id, row)
    return {
        "unconfirmed_total": unconfirmed.count(),
        "unconfirmed": list(unconfirmed[:limit]),
        "audits": [
            (target, newest.get(target.pk)) for target in project.storage_targets.order_by("name")
        ],
    }
