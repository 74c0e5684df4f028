"""Small files sent as packs: many files in one object.

A checkpoint of 10,000 small files sent one object each is bound by requests, not bytes:
each PUT is a round trip and Python's cost per request (about 1.5 ms of a core) caps it
near 650 files a second, as rclone's. So files smaller than REPLICATION_PACK_BELOW are
concatenated into packs of up to REPLICATION_PART_SIZE (one PUT each), when a checkpoint
has at least PACK_MIN_FILES of them; a shard-sized checkpoint is sent as before.

A pack is content-addressed like any object (`<prefix>/sha256/<sha256 of the pack>`).
Each packed file's entry in the replica, the manifest and the API's file list keeps its
own path, size and sha256, and adds the pack's key, the file's `offset` in it and the
pack's `object_size`; a download reads it with one ranged GET per pack and checks every
file's sha256 (lifeboat/download.py). Deduplication still works by file: a small file of
an earlier copy of the same run on the same store, found by its sha256, points at the
pack that holds it and is not sent again (that pack is looked at with a HEAD before the
manifest is written). Retention deletes a pack when no live replica names it.

Every file's bytes are read once and checked against the sha256 validation recorded
before they go into a pack (SourceChanged otherwise); the replica's row names each pack
before its PUT, so a crash leaves nothing the storage audit would call an orphan.
"""

from __future__ import annotations

import hashlib
import io

from django.conf import settings

from webapp.domain.models import Replica
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.replication import targets
from webapp.domain.replication.upload import SourceChanged, Throttle, _mismatch, upload

PACK_MIN_FILES = 32  # fewer small files gain little from packing


def split(entries: list[dict]) -> tuple[list[dict], list[dict]]:
    """(entries to pack, entries to send as objects of their own)."""
    below = settings.REPLICATION_PACK_BELOW
    small = [e for e in entries if below and e["size"] < below]
    if len(small) < PACK_MIN_FILES:
        return [], entries
    packed = {id(e) for e in small}
    return small, [e for e in entries if id(e) not in packed]


def earlier_files(replica, lookback: int):
    """The file lists of the run's `lookback` newest live copies on the same store, other
    than this one: where an unchanged file may already be."""

    return (
        Replica.objects.filter(checkpoint__run_id=replica.checkpoint.run_id)
        .filter(**targets.same_store(replica.target))
        .exclude(pk=replica.pk)
        .exclude(status=ReplicaStatus.DELETED)
        .order_by("-pk")
        .values_list("files", flat=True)[:lookback]
    )


def known_locations(replica, lookback: int) -> dict[str, dict]:
    """sha256 -> where an earlier live copy of the same run, on the same store, holds
    that file in a pack: {key, offset, object_size}."""
    found: dict[str, dict] = {}
    for files in earlier_files(replica, lookback):
        for entry in files or []:
            if isinstance(entry, dict) and "offset" in entry:
                found.setdefault(entry["sha256"], {
                    "key": entry["key"], "offset": entry["offset"],
                    "object_size": entry["object_size"],
                })  # fmt: skip
    return found


def _read_checked(open_source, entry: dict) -> bytes:
    with open_source(entry["path"]) as source:
        data = source.read(entry["size"] + 1)  # one byte more shows a grown file
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"] or len(data) != entry["size"]:
        raise SourceChanged(
            _mismatch(entry["path"], entry["sha256"], entry["size"], digest, len(data))
        )
    return data


def send(
    client, replica, entries: list[dict], open_source, progress, lookback: int, record=None
) -> dict:
    """Send `entries` (small files of the replica) in packs, reusing the packs of earlier
    copies for files they hold; fills each entry's key, offset and object_size in place.
    `record()` writes them to the replica's row (by default its whole `files`; a host's
    leg merges its own entries, host_legs.py). Returns {"packs": sent, "reused": files
    not sent, "reused_keys": packs to confirm}."""

    def write_whole() -> None:
        Replica.objects.filter(pk=replica.pk).update(files=replica.files)

    record = record or write_whole

    target, bucket = replica.target, replica.target.bucket
    known = known_locations(replica, lookback)
    reused_keys: dict[str, int] = {}
    to_send = []
    for entry in entries:
        where = known.get(entry["sha256"])
        if where is None:
            to_send.append(entry)
            continue
        entry.update(where)
        reused_keys[where["key"]] = where["object_size"]
        progress.tally.add(entry["size"], sent=False)
    if reused_keys:
        # The row names the packs it points into before they are looked at again (a
        # HEAD in replicate.send): what a restore reads, retention keeps, and the
        # deleter's second look finds, even when no new pack follows.
        record()
    limit = settings.REPLICATION_PART_SIZE  # a pack is one PUT
    throttle = Throttle(settings.REPLICATION_MAX_BYTES_PER_S)
    sent = 0
    group: list[dict] = []
    buffer = io.BytesIO()

    def flush() -> None:
        nonlocal group, buffer, sent
        if not group:
            return
        body = buffer.getvalue()
        sha = hashlib.sha256(body).hexdigest()
        key = targets.blob_key(target, sha)
        for entry in group:
            entry["key"], entry["object_size"] = key, len(body)
        # The row names the pack before it is sent (a crash leaves no orphan).
        record()
        upload(
            client, bucket, key, io.BytesIO(body), name=f"pack of {len(group)} files",
            size=len(body), sha256=sha, part_size=max(limit, len(body)),
            concurrency=1, storage_class=target.storage_class,
            progress=progress.tally.add, throttle=throttle,
            part_checksum=settings.REPLICATION_PART_CHECKSUM,
        )  # fmt: skip
        progress.wake()
        sent += 1
        group, buffer = [], io.BytesIO()

    for entry in to_send:
        if group and buffer.tell() + entry["size"] > limit:
            flush()
        entry["offset"] = buffer.tell()
        buffer.write(_read_checked(open_source, entry))
        group.append(entry)
    flush()
    return {"packs": sent, "reused": len(entries) - len(to_send), "reused_keys": reused_keys}
