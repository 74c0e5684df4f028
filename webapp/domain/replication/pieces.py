"""Large files cut at tensor boundaries: a tensor that did not change is not sent again.

A checkpoint of one file (`torch.save`, Lightning) or one file per rank changes as a
whole the moment any tensor changes, so deduplication by file saves nothing between two
of them. Fine-tuning with frozen layers, or a LoRA model saved whole, changes a few
tensors and keeps the rest byte for byte: cut at tensor boundaries, the second copy
sends 3.5x to 44x fewer bytes (bench/dedup_tensors.py, docs/benchmarks.md).

A file of REPLICATION_PIECES_ABOVE bytes or more whose own header says where its tensors
are (safetensors; a torch zip, each storage a stored record, or a DCP shard, torch zips end
to end: zip_records.py) is sent as pieces: the
bytes between two consecutive cuts, each at most REPLICATION_PART_SIZE (a larger tensor
is cut every PART_SIZE from its start, so its pieces too are the same in the next
checkpoint). A piece is an object addressed by its own sha256, like any file
(`<prefix>/sha256/...`); the entry lists them in order ({key, size, sha256}), and a
restore writes them one after the other and checks the whole file's sha256.

Cutting costs a second read of the file and a request a piece, and pays only when
tensors stay the same between checkpoints, which full training never does: the run's
recent copies decide whether a copy cuts (worth_cutting). The first copy of a run on a
store is sent whole; then cutting is tried, and kept while it finds at least a quarter of
the bytes already stored.

The header is the job's, so it is not trusted: it only says where to cut. The pieces
cover every byte of the file once, in order, whatever it says; a header that cannot be
read, or that would cut the file into more than MAX_PIECES, leaves the file whole.

Two passes. The first reads the file and hashes every piece and the whole file (which
must be what validation recorded: SourceChanged otherwise); the row then names every
piece before anything is sent or looked at, as packs do, so retention, the storage
audit and the deleter's second look see them. The second sends the pieces no earlier
copy of the run on the same store names, each read again and checked against its
sha256 before its PUT; those an earlier copy names are looked at with a HEAD before the
manifest is written (replicate.send).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import struct
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from django.conf import settings

from webapp.domain.models import Replica
from webapp.domain.replication import targets, zip_records
from webapp.domain.replication.objects import keys_of
from webapp.domain.replication.upload import Budget, SourceChanged, Throttle, _mismatch, upload

log = logging.getLogger(__name__)

MAX_PIECES = 10_000  # per file
MAX_HEADER = 100 * 1024**2  # safetensors' own limit on its JSON header
MAX_DIRECTORY = 64 * 1024**2  # a zip's central directory, read to find its records
READ = 8 * 1024**2  # one read of the first pass
SMALLEST = 64 * 1024  # tiny spans side by side are one piece up to this
KEEP_CUTTING = 0.25  # of a cut copy's bytes found already stored: worth going on
WAKE_S = 0.25


def split(entries: list[dict], location: str, earlier) -> tuple[list[dict], list[dict]]:
    """(entries to cut, the rest): files large enough, on a local disk (the second pass
    reads a piece at its offset), when the run's copies say it is worth it.
    `earlier()`: the file lists of the run's recent copies on the store, newest first."""
    above = settings.REPLICATION_PIECES_ABOVE
    if not above or location.startswith("s3://"):
        return [], entries
    large = [e for e in entries if e["size"] >= above]
    if not large or not worth_cutting(list(earlier())):
        return [], entries
    chosen = {id(e) for e in large}
    return large, [e for e in entries if id(e) not in chosen]


def _cut_entries(files) -> list[dict]:
    return [e for e in files or [] if isinstance(e, dict) and "pieces" in e]


def worth_cutting(earlier: list) -> bool:
    """Whether this copy should cut its large files, from the run's recent copies on the
    store (newest first). Cutting costs a second read and a request a piece, and pays
    only when tensors stay the same between checkpoints (frozen layers, LoRA), which full
    training never does. So: the run's first copy is sent whole (there is nothing to share
    with yet); the next two are cut, the second of them measuring what cutting saves
    against the first; once a cut copy that followed a cut copy found less than
    KEEP_CUTTING of its bytes already stored, copies are sent whole until it leaves the
    window (DEDUP_LOOKBACK copies), and then cutting is tried again."""
    if not earlier:
        return False
    cut = [i for i, files in enumerate(earlier) if _cut_entries(files)]
    if not cut:
        return True
    newest = cut[0]
    if newest + 1 not in cut:
        return True  # the newest cut copy had nothing cut to share with: a trial
    entries = _cut_entries(earlier[newest])
    total = sum(int(e.get("size") or 0) for e in entries)
    reused = sum(int(e.get("reused") or 0) for e in entries)
    return total > 0 and reused >= KEEP_CUTTING * total


def cut_points(source, size: int) -> list[int]:
    """Where tensors' bytes begin and end, from the file's own header; [] when it is
    neither safetensors nor a zip, or its header cannot be read."""
    source.seek(0)
    head = source.read(8)
    try:
        if head[:4] == b"PK\x03\x04":
            return zip_records.cuts(source, size, MAX_PIECES, MAX_DIRECTORY)
        return _safetensors_cuts(source, size, head)
    except (ValueError, TypeError, KeyError, OSError, struct.error, RecursionError):
        return []


def _safetensors_cuts(source, size: int, head: bytes) -> list[int]:
    if len(head) < 8:
        return []
    length = int.from_bytes(head, "little")
    if not 2 <= length <= min(MAX_HEADER, size - 8):
        return []
    header = json.loads(source.read(length))
    if not isinstance(header, dict):
        return []
    data = 8 + length
    cuts = [data]
    for name, tensor in header.items():
        if name == "__metadata__" or not isinstance(tensor, dict):
            continue
        begin, end = tensor["data_offsets"]
        cuts += [data + int(begin), data + int(end)]
    return cuts


def spans(cuts: list[int], size: int, limit: int) -> list[tuple[int, int]]:
    """(start, length) of each piece: from one cut to the next, at most `limit` long;
    every byte of the file in exactly one, in order. Consecutive spans smaller than
    SMALLEST (a zip's record headers, biases, norms) are one piece up to SMALLEST: each
    piece is a PUT, or a HEAD when it is reused, and hundreds of tiny ones cost more time
    than their bytes; a large span is never joined to another."""
    points = sorted({c for c in cuts if isinstance(c, int) and 0 < c < size})
    found: list[tuple[int, int]] = []
    start = 0
    for end in [*points, size]:
        while end - start > limit:
            found.append((start, limit))
            start += limit
        if end <= start:
            continue
        length = end - start
        if found and length < SMALLEST and found[-1][1] + length <= SMALLEST:
            found[-1] = (found[-1][0], found[-1][1] + length)
        else:
            found.append((start, length))
        start = end
    return found


def _hash_pieces(source, entry: dict, cut: list[tuple[int, int]], progress) -> list[dict]:
    """The first pass: every piece's sha256 and the whole file's, in one read."""
    whole = hashlib.sha256()
    hashes = []
    source.seek(0)
    for _, length in cut:
        piece = hashlib.sha256()
        left = length
        while left:
            data = source.read(min(READ, left))
            if not data:
                break
            piece.update(data)
            whole.update(data)
            left -= len(data)
            progress.wake()
        hashes.append((length - left, piece.hexdigest()))
    total = sum(n for n, _ in hashes)
    extra = source.read(1)  # one byte more shows a grown file
    total += len(extra)
    whole.update(extra)
    if total != entry["size"] or whole.hexdigest() != entry["sha256"]:
        raise SourceChanged(
            _mismatch(entry["path"], entry["sha256"], entry["size"], whole.hexdigest(), total)
        )
    return [{"size": n, "sha256": sha} for n, sha in hashes]


def plan(
    replica, entries: list[dict], open_source, progress, earlier: list, record=None
) -> list[dict]:
    """Cut each entry where its header says; fills `pieces` (and drops the whole
    file's `key`) of those cut in more than one piece, and `reused`, the bytes of its
    pieces `earlier` copies name (what worth_cutting reads). `record()` writes them to
    the replica's row (by default its whole `files`; a host's leg merges its own,
    host_legs.py). Returns the entries cut."""
    target = replica.target
    known = set().union(*(keys_of(files) for files in earlier))
    limit = settings.REPLICATION_PART_SIZE
    cut_entries = []
    for entry in entries:
        with open_source(entry["path"]) as source:
            cut = spans(cut_points(source, entry["size"]), entry["size"], limit)
            if len(cut) < 2 or len(cut) > MAX_PIECES:
                continue
            pieces = _hash_pieces(source, entry, cut, progress)
        for piece in pieces:
            piece["key"] = targets.blob_key(target, piece["sha256"])
        entry.pop("key", None)
        entry.pop("offset", None)
        entry.pop("object_size", None)
        entry["pieces"] = [{k: p[k] for k in ("key", "size", "sha256")} for p in pieces]
        entry["reused"] = sum(p["size"] for p in pieces if p["key"] in known)
        cut_entries.append(entry)
    if cut_entries:
        # The row names every piece before any is sent or looked at (see above).
        if record is None:
            Replica.objects.filter(pk=replica.pk).update(files=replica.files)
        else:
            record()
    return cut_entries


def send(client, replica, entries: list[dict], open_source, progress, earlier) -> dict:
    """Send the pieces of `entries` (cut by `plan`) that no earlier copy names.
    `earlier`: the file lists of the run's recent copies on the same store.
    Returns {"sent": pieces sent, "reused": {key: size} to confirm with a HEAD}."""
    known = set().union(*(keys_of(files) for files in earlier))
    reused: dict[str, int] = {}
    wanted: dict[str, tuple[dict, int, dict]] = {}  # key -> (entry, offset, piece)
    for entry in entries:
        offset = 0
        for piece in entry["pieces"]:
            key = piece["key"]
            if key in known or key in reused:
                reused[key] = piece["size"]
                progress.tally.add(piece["size"], sent=False)
            elif key in wanted:  # the same bytes twice in this copy: sent once
                progress.tally.add(piece["size"], sent=False)
            else:
                wanted[key] = (entry, offset, piece)
            offset += piece["size"]
    if wanted:
        _send_wanted(client, replica, list(wanted.values()), open_source, progress)
    return {"sent": len(wanted), "reused": reused}


def _send_wanted(client, replica, wanted, open_source, progress) -> None:
    target, bucket = replica.target, replica.target.bucket
    limit = settings.REPLICATION_PART_SIZE
    budget = Budget(limit * settings.REPLICATION_CONCURRENCY)
    throttle = Throttle(settings.REPLICATION_MAX_BYTES_PER_S)
    opened: dict[str, io.RawIOBase] = {}

    def put(entry: dict, data: bytes, piece: dict, held: int) -> None:
        try:
            # upload() checks the bytes against the piece's sha256 before the PUT: a
            # file that changed since the first pass is refused (SourceChanged).
            upload(
                client, bucket, piece["key"], io.BytesIO(data),
                name=f"{entry['path']} (a piece of {len(data):,} bytes)",
                size=piece["size"], sha256=piece["sha256"], part_size=max(limit, len(data)),
                concurrency=1, storage_class=target.storage_class,
                progress=progress.tally.add, throttle=throttle,
                part_checksum=settings.REPLICATION_PART_CHECKSUM,
            )  # fmt: skip
        finally:
            budget.give(held)

    futures: set = set()
    pool = ThreadPoolExecutor(
        max_workers=settings.REPLICATION_CONCURRENCY, thread_name_prefix="pieces"
    )
    try:
        for entry, offset, piece in wanted:
            if entry["path"] not in opened:
                opened[entry["path"]] = open_source(entry["path"])
            held = budget.take(piece["size"])
            data = os.pread(opened[entry["path"]].fileno(), piece["size"], offset)
            futures.add(pool.submit(put, entry, data, piece, held))
            done = {f for f in futures if f.done()}
            futures -= done
            for future in done:
                future.result()  # the first failure stops the pieces not yet read
            progress.wake()
        while futures:
            done, futures = wait(futures, timeout=WAKE_S, return_when=FIRST_EXCEPTION)
            progress.wake()
            for future in done:
                future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for source in opened.values():
            source.close()
