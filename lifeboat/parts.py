"""A checkpoint written by many ranks, each rank reporting its own part:
`lifeboat.Run(parts=True)` or LIFEBOAT_PARTS=1 (docs/client.md, "Many ranks: every rank
reports its part").

Every rank's report names the same location, a directory, and only the files that rank
wrote, relative to it, with a `part` (its rank, the world size, its host). The server
joins the parts of (run, step) and checks the checkpoint once every rank below the world
size has reported (docs/api.md). So each rank hashes its own shards, at the same time as
the others, instead of rank 0 reading every rank's bytes.

Which files are this rank's (`own_files`): the ones `files=` names; else, for a folder
written by torch.distributed.checkpoint's FileSystemWriter, `__<rank>_*.distcp` and, on
rank 0, `.metadata` (the coordinator writes it); else, for a single file, that file, its
folder being the location. Anything else needs `files=`: a folder alone does not say
which rank wrote what.
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


def is_dcp_folder(folder: Path) -> bool:
    """torch.distributed.checkpoint's FileSystemWriter wrote it: `.metadata` and shards."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return ".metadata" in names and any(n.endswith(".distcp") for n in names)


def dcp_files(folder: Path, rank: int) -> list[str]:
    """The files of `rank` in a DCP folder: its shards `__<rank>_<n>.distcp` (the writer's
    names), and the coordinator's `.metadata` on rank 0."""
    shard = re.compile(rf"__{rank}_\d+\.distcp")
    names = sorted(n for n in os.listdir(folder) if shard.fullmatch(n))
    if rank == 0:
        names.insert(0, ".metadata")
    return names


def own_files(
    path: str | os.PathLike,
    rank: int,
    *,
    files=None,
    format: str | None = None,  # noqa: A002
) -> tuple[str, list[str]]:
    """(location, files): the folder all ranks report, and this rank's files in it.
    Raises ValueError when that cannot be told (a folder of no known layout and no
    `files=`), or when `files=` names a path outside the folder."""
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
    if format == "dcp" or is_dcp_folder(location):
        names = dcp_files(location, rank)
        if not [name for name in names if name != ".metadata"]:
            raise ValueError(
                f"{location} holds no __{rank}_*.distcp (torch.distributed.checkpoint's "
                f"name for rank {rank}'s shards): pass files= with this rank's files"
            )
        return str(location), names
    raise ValueError(
        f"which files of {location} did rank {rank} write? With parts on, pass "
        "files=[...] (paths inside that folder) to run.checkpoint()"
    )


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
