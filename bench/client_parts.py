"""Rank 0's cost of reporting a checkpoint written by N ranks: before (rank 0 reports the
whole folder, so it hashes every rank's shard) and after (every rank reports its own
part, so rank 0 hashes its shard and the shared .metadata), same files, same run.

    .venv/bin/python bench/client_parts.py                       # 8, 16, 32 ranks
    .venv/bin/python bench/client_parts.py --ranks 8,16,32,64 --shard 32MiB --rounds 3

A folder laid out as torch.distributed.checkpoint's FileSystemWriter lays it out (rank r's
`__r_0.distcp` of --shard bytes, a `.metadata`) is written once per world size. Timed
for rank 0, with the client's own function (lifeboat.files.describe, what the report's
hash thread runs): the whole folder (before) and rank 0's files only (after, with `only=`
as lifeboat.parts.own_files gives them). Beside them, the floor: hashlib.sha256 of rank 0's
own bytes, read the same way. Warm page cache (each folder read once first): this
measures hashing, the cost that grows with the world size, not the disk.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from bench.corpus import parse_size  # noqa: E402
from lifeboat.files import describe  # noqa: E402
from lifeboat.parts import own_files  # noqa: E402


def write_folder(folder: Path, ranks: int, shard: int) -> None:
    folder.mkdir(parents=True)
    block = os.urandom(1 << 20)
    for rank in range(ranks):
        with open(folder / f"__{rank}_0.distcp", "wb") as out:
            for _ in range(shard >> 20):
                out.write(block)
    (folder / ".metadata").write_bytes(os.urandom(64 << 10))


def sha256_floor(paths: list[Path]) -> None:
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        digest.hexdigest()


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,16,32", help="world sizes, comma-separated")
    parser.add_argument("--shard", default="32MiB", help="bytes per rank's shard")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    shard = parse_size(args.shard)
    base = Path(tempfile.mkdtemp(prefix="lifeboat-bench-parts-"))
    print(f"{os.cpu_count()} cores; shard {shard >> 20} MiB per rank; median of {args.rounds}")
    print(f"{'ranks':>5} {'GiB':>6} {'before: rank 0 hashes all':>26} {'after: its part':>16} "
          f"{'floor: sha256 of its bytes':>27} {'after/floor':>11}")  # fmt: skip
    try:
        for ranks in [int(n) for n in args.ranks.split(",")]:
            folder = base / f"ranks-{ranks}"
            write_folder(folder, ranks, shard)
            location, mine = own_files(folder, 0, format="dcp")
            sha256_floor(sorted(folder.iterdir()))  # the page cache holds it all now
            before, after, floor = [], [], []
            for _ in range(args.rounds):
                before.append(timed(lambda: describe(folder)))  # noqa: B023
                after.append(timed(lambda: describe(location, only=mine)))  # noqa: B023
                floor.append(timed(lambda: sha256_floor([folder / m for m in mine])))  # noqa: B023
            b, a, f = (statistics.median(x) for x in (before, after, floor))
            total = sum(p.stat().st_size for p in folder.iterdir()) / (1 << 30)
            print(
                f"{ranks:>5} {total:>6.2f} {b:>24.3f} s {a:>14.3f} s {f:>25.3f} s {a / f:>10.2f}x"
            )
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
