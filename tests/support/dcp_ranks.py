"""torch.distributed.checkpoint folders written by N real ranks: N processes forked from a
fresh interpreter, joined by gloo, each saving its rows of every tensor as a DTensor, as
FSDP's sharded save does.

* save_on_ranks: tensors of several shapes and dtypes (state()); the restore tests of
  another world size load it on M.
* corpus_dcp: bench/corpus.py's "dcp" shape, each rank running the corpus's own rank
  function (bench.corpus._dcp_rank), forked here instead of started by torch's
  mp.spawn.
* parts_dcp: the 2-rank save of tests/test_inspection_parts.py (parts_state()).

Forked rather than spawned: a spawned rank is a new interpreter that imports torch and
torch.distributed again, 3-4 s of CPU each (15 s for the corpus's 4 ranks on two cores);
a forked one starts with them imported. The parent is a fresh interpreter, not the test
process: forked from a process that has run torch's OpenMP code already, a rank can hang
in it. Importing torch.distributed runs none of it."""

from __future__ import annotations

import math
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import torch

from bench import corpus

ROOT = Path(__file__).resolve().parents[2]


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


def parts_state() -> dict[str, torch.Tensor]:
    """4x8 tensors whose halves (one per rank of 2) differ: zero in one half only, a NaN
    in each half, zero in both."""
    plain = torch.arange(1.0, 33.0).view(4, 8)
    zero_in_one = plain.clone()
    zero_in_one[:2] = 0  # rank 0's half is zero, rank 1's is not
    nan_in_both = plain.clone()
    nan_in_both[0, 0] = nan_in_both[3, 7] = math.nan  # one NaN in each half
    return {
        "plain": plain,
        "zero_in_one": zero_in_one,
        "zero_everywhere": torch.zeros(4, 8),
        "nan_in_both": nan_in_both,
    }


def _save_rank(rank: int, world_size: int, folder: str, store: str, kind: str, seed: int):
    # torch.distributed only in the fresh interpreter: the test processes that import this
    # module (to collect a test module) need not pay for it.
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    tensors = state(seed) if kind == "state" else parts_state()
    sharded = {
        fqn: distribute_tensor(t, mesh, [Shard(0) if t.dim() else Replicate()])
        for fqn, t in tensors.items()
    }
    dcp.save(sharded if kind == "state" else {"model": sharded}, checkpoint_id=folder)
    dist.destroy_process_group()


def _corpus_rank(rank: int, world_size: int, port: int, folder: str, total_bytes: int):
    # The sizes as bench/corpus.py's _write_dcp chooses them, for its own rank function.
    sizes = corpus._tensor_sizes(max(4 * world_size, total_bytes // 3), world_size)
    corpus._dcp_rank(rank, world_size, port, folder, sizes)


def _run(rank: int, target, args) -> None:
    code = 1
    try:
        target(rank, *args)
        code = 0
    except BaseException:  # noqa: BLE001 (said on stderr; the exit code fails the save)
        traceback.print_exc()
    finally:
        os._exit(code)  # no atexit handlers of the parent's, no second teardown of gloo


def _fork_ranks(world_size: int, target, args: tuple) -> None:
    # What every rank imports, imported once before the fork (docstring), here and not at
    # the top for the reason _save_rank gives.
    import torch._dynamo  # noqa: F401 (distribute_tensor imports it: 230 modules, 0.5 s)
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.device_mesh  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=_run, args=(r, target, args)) for r in range(world_size)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
    if any(p.exitcode != 0 for p in ranks):
        raise SystemExit(f"ranks exited with {[p.exitcode for p in ranks]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_fresh_interpreter(*args: object) -> None:
    subprocess.run(
        [sys.executable, "-m", "tests.support.dcp_ranks", *map(str, args)],
        cwd=ROOT, check=True, timeout=300,
    )  # fmt: skip


def save_on_ranks(folder: Path, world_size: int, seed: int = 0) -> list[str]:
    """Writes state(seed) from `world_size` ranks into `folder`; returns its files."""
    _in_fresh_interpreter("state", folder, world_size, seed)
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def corpus_dcp(root: Path, total_bytes: int, ranks: int = 4) -> Path:
    """What bench/corpus.py's write("dcp", root, total_bytes, ranks=ranks) writes: its
    folder, root/dcp."""
    _in_fresh_interpreter("corpus", root / "dcp", ranks, total_bytes)
    return root / "dcp"


def parts_dcp(folder: Path) -> Path:
    """parts_state() saved by 2 ranks into `folder`, under the key "model"."""
    _in_fresh_interpreter("parts", folder, 2, 0)
    return folder


def main(kind: str, folder: Path, world_size: int, extra: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "corpus":
        # The corpus's rank function meets the other ranks at a port (MASTER_PORT).
        port = _free_port()
        _fork_ranks(world_size, _corpus_rank, (world_size, port, str(folder), extra))
        return
    store = Path(tempfile.mkdtemp(prefix="dcp-store-")) / "store"
    _fork_ranks(world_size, _save_rank, (world_size, str(folder), str(store), kind, extra))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
