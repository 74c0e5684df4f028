"""The restore test's `reshard` level beside DCP's own load on the same world size.

    .venv/bin/python bench/reshard.py                       # 512 MiB saved by 8 ranks, on 2 and 4
    .venv/bin/python bench/reshard.py --total 1GiB --rounds 3 --world-sizes 2 4

Setup: a DCP folder of --total bytes saved by --ranks gloo ranks (bench/corpus.py: FSDP2's
layout, weights and their Adam moments). Then, alternated round by round, for each world
size M:

  dcp        a fresh interpreter that forks M processes, joined by gloo, each loading its
             rows of every tensor with torch.distributed.checkpoint.load: DCP's own
             resharded load and nothing else (no comparison, no safe unpickler)
  lifeboat   `python -m webapp.domain.recovery.reshard_load`, as the restore worker runs
             it: the same M-rank load through the restricted .metadata reader, each rank's
             share hashed, then the reference built from the saved chunks and every share
             compared with it

Both pay for one `import torch` in a fresh interpreter, as on the worker. (Fresh, because
ranks forked from a process that has already run torch's OpenMP code can hang in it.)

Both read the files from the page cache (they were just written). Prints the medians and
the ratio; the figure is in docs/benchmarks.md. No target was set by an issue.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import corpus  # noqa: E402
from webapp.domain.recovery import reshard_load  # noqa: E402


def _dcp_rank(rank: int, world_size: int, folder: str, store: str, tensors: dict) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor import zeros as dtensor_zeros

    code = 1
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size
        )
        mesh = init_device_mesh("cpu", (world_size,))
        state = {
            fqn: dtensor_zeros(
                size, dtype=dtype, device_mesh=mesh, placements=[Shard(0) if size else Replicate()]
            )
            for fqn, (size, dtype) in tensors.items()
        }
        dcp.load(state, storage_reader=dcp.FileSystemReader(folder))
        dist.destroy_process_group()
        code = 0
    finally:
        os._exit(code)


def dcp_load(folder: Path, world_size: int, tensors: dict) -> float:
    scratch = tempfile.mkdtemp(prefix="bench-reshard-")
    started = time.perf_counter()
    context = multiprocessing.get_context("fork")
    ranks = [
        context.Process(
            target=_dcp_rank,
            args=(r, world_size, str(folder), os.path.join(scratch, "store"), tensors),
        )
        for r in range(world_size)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch, ignore_errors=True)
    assert all(p.exitcode == 0 for p in ranks), [p.exitcode for p in ranks]
    return seconds


def _tensors(folder: Path) -> dict:
    from webapp.domain.validation.inspect_common import Report
    from webapp.domain.validation.inspect_dcp import read_dcp_metadata

    metadata = read_dcp_metadata(str(folder / ".metadata"), ".metadata", Report())
    return reshard_load._tensor_items(metadata)


def fresh(*args: str, stdin: str = "") -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args], input=stdin, capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    return time.perf_counter() - started, done.stdout


def main() -> int:
    if sys.argv[1:2] == ["--dcp-child"]:  # the baseline, in a fresh interpreter
        folder, world_size = Path(sys.argv[2]), int(sys.argv[3])
        dcp_load(folder, world_size, _tensors(folder))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", default="512MiB")
    parser.add_argument("--ranks", type=int, default=8, help="the world size that saves")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-reshard-"))
    try:
        folder = corpus._write_dcp(root, corpus.parse_size(args.total), ranks=args.ranks)
        files = sorted(p.name for p in folder.iterdir())
        size = sum(p.stat().st_size for p in folder.iterdir())
        tensors = _tensors(folder)
        print(f"{size / 2**20:.0f} MiB saved by {args.ranks} ranks, {len(tensors)} tensors")
        for world_size in args.world_sizes:
            ours, theirs = [], []
            for _ in range(args.rounds):
                seconds, _ = fresh(__file__, "--dcp-child", str(folder), str(world_size))
                theirs.append(seconds)
                request = {"base": str(folder), "files": files, "world_sizes": [world_size]}
                seconds, out = fresh(
                    "-m", "webapp.domain.recovery.reshard_load", stdin=json.dumps(request)
                )
                ours.append(seconds)
                result = json.loads(out)
                assert result["results"][0]["ok"], result
            a, b = statistics.median(ours), statistics.median(theirs)
            print(
                f"on {world_size} ranks: lifeboat {a:.2f} s, dcp.load {b:.2f} s, "
                f"{a / b:.2f}x (rounds {', '.join(f'{x:.2f}' for x in ours)} / "
                f"{', '.join(f'{x:.2f}' for x in theirs)})"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
