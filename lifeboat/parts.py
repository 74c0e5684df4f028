"""A checkpoint written by many ranks, each rank reporting its own part:
`lifeboat.Run(parts=True)` or LIFEBOAT_PARTS=1 (docs/client.md, "Many ranks: every rank
reports its part").

Every rank's report names the same location, a directory, and only the files that rank
wrote, relative to it, with a `part` (its rank, the world size, its host). The server
joins the parts of (run, step) and checks the checkpoint once every rank below the world
size has reported (docs/api.md). So each rank hashes its own shards, at the same time as
the others, instead of rank 0 reading every rank's bytes.

Which files are this rank's (`own_files`): the ones `files=` names; else, for a single
file, that file, its folder being the location; else, in a folder, the files whose names
carry this rank (`rank_of_name`: DCP's `__<rank>_<n>.distcp`, the HF Trainer's
`rng_state_<rank>.pth`, DeepSpeed's `zero_pp_rank_<rank>_...`, `rank-<rank>...`) and, on
rank 0, every file whose name carries no rank (DCP's `.metadata`, an HF index, the
Trainer's model and state: the main process writes them). A folder where this rank has
no file needs `files=`: the folder alone does not say which rank wrote what.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from lifeboat.config import ConfigError, hostname, process_rank, process_world_size

_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_NOT_HOST = re.compile(r"[^A-Za-z0-9._-]")


def parts_from_env() -> bool:
    return os.environ.get("LIFEBOAT_PARTS", "").strip().lower() in ("1", "true", "yes")


def part_host(name: str | None = None) -> str:
    """The host a part's files are on: LIFEBOAT_HOST, else the machine's name. It names
    the queue of that node's worker for node-local projects (validate.<host>,
    docs/deployment.md), so LIFEBOAT_HOST is for nodes that know themselves by another
    name than the one their workers listen for. As the contract takes it (letters,
    digits, '.', '-', '_'; at most 255): other characters become '-', and what cannot
    start a name is dropped."""
    if name is None:
        name = os.environ.get("LIFEBOAT_HOST", "").strip() or hostname()
    name = _NOT_HOST.sub("-", name)[:255]
    name = name.lstrip("._-")
    return name if _HOST.match(name) else ""


@dataclass(frozen=True)
class Part:
    """Who reports: this process's rank, the job's world size, the host."""

    rank: int
    world_size: int
    host: str

    @classmethod
    def of_this_process(cls, world_size: int | None = None) -> Part:
        rank = process_rank()
        world = int(world_size) if world_size else process_world_size()
        if not 0 <= rank < world:
            raise ConfigError(
                f"parts: rank {rank} is not below the world size {world} (set WORLD_SIZE, "
                "or pass world_size= to lifeboat.Run)"
            )
        return cls(rank, world, part_host())

    def as_dict(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "host": self.host}


def _relative(name) -> str:
    try:
        text = os.fspath(name)
    except TypeError:
        text = None
    if not isinstance(text, str):
        raise ValueError(f"files=: {name!r} is not a path")
    path = PurePosixPath(text.replace(os.sep, "/"))
    if path.is_absolute() or ".." in path.parts or text in ("", ".") or "\x00" in text:
        raise ValueError(
            f"files=: {text!r} is not a path inside the checkpoint's folder "
            "(relative, without '..')"
        )
    return path.as_posix()


# A rank in a file's name, as the writers of sharded checkpoints put it there. With
# model parallelism DeepSpeed's `zero_pp_rank_<n>` is the data-parallel rank, not the
# global one: such jobs pass files= (docs/client.md).
_RANK_NAMES = (
    re.compile(r"__(\d+)_\d+\.distcp"),  # torch.distributed.checkpoint's FileSystemWriter
    re.compile(r"rng_state_(\d+)\.pth"),  # the HF Trainer, one per process
    re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?!\d)", re.I),  # rank-3.pt, zero_pp_rank_3_...
)


def rank_of_name(name: str) -> int | None:
    """The rank a file's name says wrote it, None when it names none."""
    for pattern in _RANK_NAMES:
        found = pattern.search(name)
        if found:
            return int(found.group(1))
    return None


def dcp_world_size(files: list[str], root: str = "") -> int | None:
    """The ranks that wrote a DCP folder's shards (`__<rank>_<n>.distcp` directly in
    `root`), None when no shard names one."""
    ranks = [
        rank_of_name(name)
        for f in files
        if f.endswith(".distcp") and (f.rpartition("/")[0] == root)
        for name in (f.rpartition("/")[2],)
    ]
    found = [r for r in ranks if r is not None]
    return max(found) + 1 if found else None


def files_by_rank(folder: Path) -> dict[int | None, list[str]]:
    """The files of `folder` (relative, '/'-separated) by the rank their names carry
    (the innermost name that carries one: `rank-3/model.pt` is rank 3's), None for those
    that carry none. The folder's own name is not looked at."""
    found: dict[int | None, list[str]] = {}
    for parent, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            relative = (Path(parent) / name).relative_to(folder).as_posix()
            tagged = [rank_of_name(piece) for piece in relative.split("/")]
            owner = next((r for r in reversed(tagged) if r is not None), None)
            found.setdefault(owner, []).append(relative)
    return found


def own_files(
    path: str | os.PathLike,
    rank: int,
    *,
    files=None,
    world_size: int | None = None,
) -> tuple[str, list[str]]:
    """(location, files): the folder all ranks report, and this rank's files in it (all
    of them when the world is this one rank). Raises ValueError when that cannot be told
    (a folder with no file of this rank and no `files=`), or when `files=` names a path
    outside the folder."""
    location = Path(os.path.abspath(os.fspath(path)))
    if files is not None:
        if isinstance(files, (str, bytes, os.PathLike)):
            raise ValueError("files= is a list of paths, not one path")
        names = sorted({_relative(name) for name in files})
        if not names:
            raise ValueError("files= is empty: a part names at least one file")
        if location.is_file():
            raise ValueError(f"files= names files inside a folder, and {location} is a file")
        return str(location), names
    if not location.is_dir():
        # A file; or nothing, taken for a file: hashing it then reports the save as
        # failed ("gone"), as without parts, rather than raising into the training loop.
        return str(location.parent), [location.name]
    by_rank = files_by_rank(location)
    if world_size == 1:
        return str(location), sorted(name for names in by_rank.values() for name in names)
    if not by_rank.get(rank):
        named = "" if set(by_rank) == {None} or not by_rank else f" for rank {rank}"
        raise ValueError(
            f"which files of {location} did rank {rank} write? No file there is named as "
            f"a rank's{named} (like __{rank}_0.distcp, rng_state_{rank}.pth or "
            f"rank-{rank}.pt): pass files=[...] (paths inside that folder) to "
            "run.checkpoint()"
        )
    names = by_rank[rank] + (by_rank.get(None, []) if rank == 0 else [])
    return str(location), sorted(names)


# Rank 0's files that every rank reads: DCP's `.metadata`, an HF index or config. The
# server lends their checked bytes to other hosts' checks (webapp/domain/validation/
# node_local.py), and a rank restoring its own part fetches them beside its shards.
SHARED_SUFFIXES = (".metadata", ".json")


def is_shared(path: str, rank: int | None) -> bool:
    return rank == 0 and path.endswith(SHARED_SUFFIXES)


def rank_share(checkpoint: dict, rank: int | None, world_size: int | None) -> dict | None:
    """The server's answer for a checkpoint, cut to what rank `rank` needs when the job
    runs on the same world size as the ranks that wrote it: that rank's files and the
    shared ones. None when it needs everything (no rank given, a checkpoint reported
    whole, or another world size: resharding reads every shard)."""
    written_by = checkpoint.get("world_size")
    if rank is None or not written_by or world_size != written_by:
        return None
    files = [
        spec
        for spec in checkpoint.get("files") or []
        if spec.get("rank") == rank or is_shared(spec["path"], spec.get("rank"))
    ]
    return {**checkpoint, "files": files}
