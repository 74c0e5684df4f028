"""A node-local checkpoint copied where its bytes are: each host's worker sends its share.

A node-local checkpoint's files are on its hosts' own disks (validation/node_local.py),
so no one worker can read them all. A claimed replica of one is split into legs, one per
host, each a task on that host's queue `replicate.<host>` that sends the files of the
ranks that ran there (the same fanout.send_files as any replica: content-addressed
objects, a file already on the target is not sent again; the host's small files go in
packs of its own, packs.py, and its large files are cut at their tensors, pieces.py). The
legs run at once, on their hosts. When the last is done, a task on the plain `replicate`
queue confirms every object with a HEAD and writes the manifest, last, as for any
replica: a manifest on the target still means a complete copy.

Each leg renews the replica's lease as it sends, and writes its open multipart uploads
into the replica's `uploads` beside the other legs' (under the row lock), so the next
attempt aborts what a leg killed mid-upload left before it splits into new legs (any
worker reaches S3; that needs no host's disk). A leg whose host has no worker lets the
lease lapse; the sweeper then sends the replica again (a new attempt, new legs), and the
hosts whose worker is alive skip what they sent; `no worker for host X` is shown meanwhile
(health/live_workers.py). A leg's failure is the replica's: recorded by replicate.py's
record_* functions, retried as a whole.
"""

from __future__ import annotations

import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from webapp.domain import publish
from webapp.domain.locks import for_update
from webapp.domain.models import Replica
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.replication import fanout, packs, pieces, targets
from webapp.domain.replication.objects import objects_of
from webapp.domain.replication.replicate import (
    DEDUP_LOOKBACK,
    Claim,
    abort_stale_uploads,
    on_target_all,
    owned_lock,
    record_verified,
    send_entries,
    write_manifest,
)
from webapp.domain.replication.sources import sources


def queue_for(host: str) -> str:
    return f"replicate.{host}" if host else "replicate"


def host_of_files(checkpoint) -> dict[str, str]:
    host_of_rank = dict(checkpoint.parts.values_list("rank", "host"))
    return {
        path: host_of_rank.get(rank, "")
        for path, rank in checkpoint.files.values_list("path", "rank")
    }


def fan_out(claimed: Claim) -> list[str]:
    """Abort the uploads an earlier attempt's legs left open, then split the claimed
    replica into one leg per host, sent after commit; the hosts. Raises what an abort
    raises (the attempt is retried)."""

    if claimed.stale_uploads:
        replica = Replica.objects.select_related("target").get(pk=claimed.replica_id)
        client = targets.client_for(replica.target)
        abort_stale_uploads(client, replica.target.bucket, replica, claimed)
    with transaction.atomic():
        replica = owned_lock(claimed)
        if replica is None:
            return []
        hosts = sorted(set(host_of_files(replica.checkpoint).values()))
        replica.legs = {host: "queued" for host in hosts}
        replica.save(update_fields=["legs"])
        transaction.on_commit(lambda: _publish(claimed, hosts))
    return hosts


def _publish(claimed: Claim, hosts: list[str]) -> None:
    for host in hosts:
        publish.send(
            "workers.replicate.replicate_leg",
            (claimed.replica_id, claimed.attempt, host),
            queue=queue_for(host),
        )


class LegProgress:
    """Adds this leg's bytes to the replica's (other hosts add theirs), writes its open
    multipart uploads beside theirs, and renews the lease: the uploads as soon as they
    change, the rest about once a second."""

    def __init__(self, replica_id: int):
        self.replica_id = replica_id
        self.tally = fanout.Tally()
        self.written_done = self.written_sent = 0
        self.ours: set[str] = set()  # the upload keys this leg has written to the row
        self.last = time.monotonic()

    def wake(self) -> None:
        if self.tally.uploads_changed or time.monotonic() - self.last >= 1.0:
            self.flush()

    def flush(self) -> None:
        with self.tally.lock:
            done, sent = self.tally.done, self.tally.sent
            uploads, changed = dict(self.tally.uploads), self.tally.uploads_changed
            self.tally.uploads_changed = False
        fields = {
            "bytes_done": F("bytes_done") + (done - self.written_done),
            "bytes_sent": F("bytes_sent") + (sent - self.written_sent),
            "lease_until": timezone.now() + timedelta(seconds=settings.REPLICATION_LEASE_S),
        }
        with transaction.atomic():
            if changed:
                # Other legs write theirs into the same column: merged under the lock.
                row = for_update(Replica.objects).only("uploads").get(pk=self.replica_id)
                others = {k: v for k, v in row.uploads.items() if k not in self.ours}
                fields["uploads"] = {**others, **uploads}
                self.ours = set(uploads)
            Replica.objects.filter(pk=self.replica_id).update(**fields)
        self.written_done, self.written_sent = done, sent
        self.last = time.monotonic()


def send_leg(claimed: Claim, host: str) -> str:
    """Send this host's files; raises what replicate.send raises. Returns "sent", or
    "superseded" when a later attempt owns the replica."""

    replica = Replica.objects.select_related(
        "checkpoint__project", "checkpoint__run", "target"
    ).get(pk=claimed.replica_id)
    if replica.status != ReplicaStatus.UPLOADING or replica.attempts != claimed.attempt:
        return "superseded"
    if replica.legs.get(host) == "done":
        return "sent"
    mine = host_of_files(replica.checkpoint)
    entries = [e for e in replica.files if mine.get(e["path"]) == host]
    client = targets.client_for(replica.target)
    packed, alone = packs.split(entries)

    def earlier():
        return packs.earlier_files(replica, DEDUP_LOOKBACK)

    cut, alone = pieces.split(alone, replica.checkpoint.location, earlier)
    progress = LegProgress(replica.pk)
    try:
        with sources(replica.checkpoint) as open_source:
            if packed:  # this host's small files, in packs of its own
                packs.send(
                    client, replica, packed, open_source, progress, DEDUP_LOOKBACK,
                    record=lambda: _record_entries(claimed, packed),
                )  # fmt: skip
            if cut:  # its large files, at their tensors' boundaries
                recent = list(earlier())
                cut_now = pieces.plan(
                    replica, cut, open_source, progress, recent,
                    record=lambda: _record_entries(claimed, cut),
                )  # fmt: skip
                pieces.send(client, replica, cut_now, open_source, progress, recent)
                cut_ids = {id(e) for e in cut_now}
                alone += [e for e in cut if id(e) not in cut_ids]  # no tensors found: whole
        send_entries(client, replica, claimed, alone, progress)
    except Superseded:
        return "superseded"
    finally:
        progress.flush()
    return "sent"


class Superseded(Exception):
    """A later attempt owns the replica: this leg stops before it sends another pack."""


def _record_entries(claimed: Claim, entries: list[dict]) -> None:
    """Write this leg's entries (where its packs put its files) into the replica's
    `files`, under the row lock: the other hosts' legs write theirs into the same list."""
    by_path = {e["path"]: e for e in entries}
    with transaction.atomic():
        row = owned_lock(claimed)
        if row is None:
            raise Superseded
        row.files = [by_path.get(e["path"], e) for e in row.files]
        row.save(update_fields=["files"])


def leg_done(claimed: Claim, host: str) -> None:
    """Note this host's leg done; the last one sends the manifest task (after commit)."""
    with transaction.atomic():
        replica = owned_lock(claimed)
        if replica is None:
            return
        replica.legs = {**replica.legs, host: "done"}
        replica.save(update_fields=["legs"])
        if all(state == "done" for state in replica.legs.values()):
            transaction.on_commit(
                lambda: publish.send(
                    "workers.replicate.finish_legs", (claimed.replica_id, claimed.attempt)
                )
            )


def finish(claimed: Claim) -> str:
    """Every leg done: confirm every object, write the manifest, record it verified."""

    replica = Replica.objects.select_related(
        "checkpoint__project", "checkpoint__run", "target"
    ).get(pk=claimed.replica_id)
    if replica.status != ReplicaStatus.UPLOADING or replica.attempts != claimed.attempt:
        return "superseded"
    if not replica.legs or any(state != "done" for state in replica.legs.values()):
        return "waiting"
    client, bucket = targets.client_for(replica.target), replica.target.bucket
    # Every object the replica names, each once: a file's own, or the pack that holds it
    # (a content address: its name is its sha256).
    named = {key: (size, e["path"]) for e in replica.files for key, size in objects_of(e)}
    looks = [(key, key.rsplit("/", 1)[-1], size, path) for key, (size, path) in named.items()]
    for (*_, path), there in zip(looks, on_target_all(client, bucket, looks), strict=True):
        if not there:
            raise ConnectionError(f"{path} is not on the target after its host sent it")
    manifest_key = write_manifest(client, replica.target, replica.checkpoint, replica)
    with transaction.atomic():
        locked = for_update(Replica.objects).get(pk=replica.pk)
        done, sent = locked.bytes_done, locked.bytes_sent
    return record_verified(
        claimed,
        {
            "manifest_key": manifest_key,
            "bytes_done": done,
            "bytes_sent": sent,
            "files_sent": len(replica.files),
            "files": len(replica.files),
        },
    )
