"""A torch.distributed.checkpoint folder written by N real ranks: N processes forked from
the test, joined by gloo through a file store, each saving its rows of every tensor as a
DTensor, as FSDP's sharded save does. The restore tests of another world size load it on M."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Tensors of several shapes and dtypes: rows that divide by 8 and rows that do not, a
    vector, a scalar, half precision."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "model.embed.weight": torch.randn(96, 16, generator=generator),
        "model.layers.0.weight": torch.randn(40, 24, generator=generator),
        "model.layers.1.weight": torch.randn(13, 7, generator=generator).to(torch.bfloat16),
        "model.layers.1.bias": torch.randn(13, generator=generator),
        "model.head.weight": torch.randn(8, 96, generator=generator).half(),
        "optim.step": torch.tensor(1234.0),
    }


def _save_rank(rank: int, world_size: int, folder: str, store: str, seed: int) -> None:
    code = 1
    try:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size
        )
        mesh = init_device_mesh("cpu", (world_size,))
        sharded = {
            fqn: distribute_tensor(t, mesh, [Shard(0) if t.dim() else Replicate()])
            for fqn, t in state(seed).items()
        }
        dcp.save(sharded, checkpoint_id=folder)
        dist.destroy_process_group()
        code = 0
    finally:
        os._exit(code)


def save_on_ranks(folder: Path, world_size: int, seed: int = 0) -> list[str]:
    """Writes state(seed) from `world_size` ranks into `folder`; returns its files. The
    ranks are forked from a fresh interpreter: forked from the test process, which has
    run torch's OpenMP code already, a rank can hang in it."""
    subprocess.run(
        [sys.executable, "-m", "tests.support.dcp_ranks", str(folder), str(world_size), str(seed)],
        cwd=Path(__file__).resolve().parents[2], check=True, timeout=300,
    )  # fmt: skip
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _save_here(folder: Path, world_size: int, seed: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    store = Path(tempfile.mkdtemp(prefix="dcp-store-")) / "store"
    context = multiprocessing.get_context("fork")
    ranks = [
        context.Process(target=_save_rank, args=(r, world_size, str(folder), str(store), seed))
        for r in range(world_size)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
    if any(p.exitcode != 0 for p in ranks):
        raise SystemExit(f"ranks exited with {[p.exitcode for p in ranks]}")


if __name__ == "__main__":
    _save_here(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
