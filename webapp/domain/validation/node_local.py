"""Checking a node-local checkpoint where its bytes are: each host's files by a worker on
that host (queue `validate.<host>`), never by a worker that cannot see them.

A project whose jobs write to each node's own disk (Project.node_local) has every rank
report its part with its host (webapp/domain/ingest/parts.py). Its validation fans out
by host (fanout.py): one ValidationPart per host with the files of the ranks that ran
there, routed to that host's queue. The verdict task merges the parts as for any
fanned-out validation, and needs no file.

Some checks look across files: a DCP shard's chunks are found through `.metadata`, an HF
shard through its index, and both are written by rank 0 on rank 0's host alone. So the
check runs in two phases. First rank 0's small shared files (SHARED_NAMES, at most
SHARED_MAX_BYTES in all) are checked on rank 0's host, and their bytes, once their
sha256 matched, are kept with that part. Then every host's part runs: its inspection
reads those shared bytes, and sees every other host's file as a sparse placeholder of
the reported size (never read: each host scans only its own files, and each placeholder's
real bytes are hashed by its own host's part). Every byte of the checkpoint is still read
and hashed once, on the host that holds it.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from lifeboat.parts import is_shared

# Rank 0's files that other hosts' inspections read (DCP metadata, HF indexes and
# configs: the client's rule, which also fetches them beside each rank's own share).
# Small by nature; over the cap they stay placeholders.
SHARED_MAX_BYTES = 16 << 20

PHASE_SHARED = 1
PHASE_HOSTS = 2


def applies(checkpoint) -> bool:
    return (
        checkpoint.project.node_local
        and checkpoint.world_size is not None
        and not checkpoint.location.startswith("s3://")
    )


def queue_for(host: str) -> str:
    """The queue of the validate worker on `host` (the plain queue when unknown)."""
    return f"validate.{host}" if host else "validate"


def plan(checkpoint) -> list[dict]:
    """The parts of a node-local checkpoint's validation, in publishing order:
    [{"host", "files", "bytes", "phase"}]. Rank 0's shared files first (phase 1), then
    one part per host with the rest of its files (phase 2)."""
    host_of_rank = dict(checkpoint.parts.values_list("rank", "host"))
    rows = checkpoint.files.order_by("path").values_list("path", "size", "rank")
    by_host: dict[str, list[tuple[str, int]]] = {}
    shared: list[tuple[str, int]] = []
    room = SHARED_MAX_BYTES
    for path, size, rank in rows:
        if is_shared(path, rank) and size <= room:
            shared.append((path, size))
            room -= size
            continue
        by_host.setdefault(host_of_rank.get(rank, ""), []).append((path, size))
    parts = []
    if shared:
        parts.append(
            {
                "host": host_of_rank.get(0, ""),
                "files": [p for p, _ in shared],
                "bytes": sum(s for _, s in shared),
                "phase": PHASE_SHARED,
            }
        )
    for host, files in sorted(by_host.items()):
        parts.append(
            {
                "host": host,
                "files": [p for p, _ in files],
                "bytes": sum(s for _, s in files),
                "phase": PHASE_HOSTS,
            }
        )
    return parts


def keep_shared(report, files: list[str]) -> dict[str, str]:
    """The shared files' bytes (base64) for the other hosts, read from the descriptors
    that integrity hashed; only when every one of them matched."""
    if not report.ok:
        return {}
    kept = {}
    for path in files:
        fd = report.handles.get(path)
        if fd is None:
            return {}
        kept[path] = base64.b64encode(os.pread(fd, SHARED_MAX_BYTES + 1, 0)).decode()
    return kept


def fill_view(view: str, specs: list, handles: dict[str, int], shared: dict[str, str]) -> None:
    """Give the inspection a whole checkpoint: the shared files' checked bytes, and a
    sparse placeholder for every file another host holds (the inspection scans only
    this host's files; each placeholder's bytes are hashed on its own host)."""
    folder = Path(view)
    for spec in specs:
        if spec.path in handles:
            continue
        entry = folder.joinpath(*spec.path.split("/"))
        entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(entry, "wb") as out:
            if spec.path in shared:
                out.write(base64.b64decode(shared[spec.path]))
            else:
                out.truncate(spec.size)
