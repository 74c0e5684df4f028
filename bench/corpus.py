"""Real checkpoints of the shapes big training jobs write, at a size chosen by flag.

    .venv/bin/python bench/corpus.py dcp /tmp/corpus                 # small (CI size)
    .venv/bin/python bench/corpus.py hf /tmp/corpus --total 8GiB --shards 8
    .venv/bin/python bench/corpus.py all /tmp/corpus --total 64MiB

Shapes (`write(shape, root, total_bytes, **opts) -> Path`, the checkpoint's location):

  dcp         torch.distributed.checkpoint.save from a 4-rank process group (gloo,
              torch.multiprocessing spawn): every rank holds its dim-0 shard of each
              weight and of its Adam state as a DTensor, as FSDP2 does, and writes its own
              `__<rank>_0.distcp`; rank 0 writes `.metadata`. opts: ranks=4.
  hf          a Hugging Face folder: `model-0000i-of-0000n.safetensors` written by the
              safetensors library, one shard at a time (bounded memory), and
              `model.safetensors.index.json` with `metadata.total_size` and `weight_map`
              as transformers/huggingface_hub write it. opts: shards=4.
  deepspeed   a DeepSpeed ZeRO-2 folder: `latest` and `global_step<N>/` holding
              `mp_rank_00_model_states.pt` (module weights, param_shapes, ...) and one
              `zero_pp_rank_<r>_mp_rank_00_optim_states.pt` per rank (the flat fp32
              partition and its Adam state), written with torch.save in DeepSpeed's key
              layout (DeepSpeed itself does not install here). opts: ranks=4, step=100.
  single      one torch.save file of a state dict (`model.pt`); it is held in memory once.
  many_files  a folder of `files` small safetensors files (default 10,000) in 100
              sub-folders, one tensor each, as per-tensor distributed formats lay out.
              opts: files=10000.

Data is random float32 from a fixed seed; sizes are the tensor bytes (file sizes add a few
KiB of headers). Nothing is downloaded. `manifest(location)` lists a checkpoint's files
as a job reports them (path relative to the folder, size, sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
from pathlib import Path

SHAPES = ("dcp", "hf", "deepspeed", "single", "many_files")
SMALL = 8 << 20  # the default total: CI size
MAX_TENSOR = 64 << 20  # bytes per tensor at most, so no shape needs one huge allocation


def write(shape: str, root: Path, total_bytes: int = SMALL, **opts) -> Path:
    """Writes a checkpoint of `shape` under `root` (created if needed) holding about
    `total_bytes` of tensor data; returns its location (a folder; a file for "single")."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    return globals()[f"_write_{shape}"](root, int(total_bytes), **opts)


def manifest(location: Path) -> list[dict]:
    """The files of a checkpoint as a job reports them: path (relative to the folder, or
    the file's own name), size and sha256."""
    location = Path(location)
    base = location.parent if location.is_file() else location
    paths = [location] if location.is_file() else sorted(location.rglob("*"))
    out = []
    for path in paths:
        if not path.is_file():
            continue
        digest = hashlib.sha256()
        size = 0
        with path.open("rb", buffering=0) as handle:
            while chunk := handle.read(8 << 20):
                digest.update(chunk)
                size += len(chunk)
        out.append(
            {"path": str(path.relative_to(base)), "size": size, "sha256": digest.hexdigest()}
        )
    return out


def _tensor_sizes(total_bytes: int, multiple: int = 1, at_least: int = 1) -> list[int]:
    """Element counts of float32 tensors adding up to about total_bytes: at least
    `at_least` of them, each at most MAX_TENSOR bytes and a multiple of `multiple` (so
    they split evenly over ranks)."""
    elements = max(multiple * at_least, total_bytes // 4)
    count = max(at_least, -(-elements // (MAX_TENSOR // 4)))
    per = max(multiple, elements // count // multiple * multiple)
    return [per] * count


def _random(n: int, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=generator)


# --------------------------------------------------------------------------- single


def _write_single(root: Path, total_bytes: int) -> Path:
    import torch

    state = {f"layers.{i}.weight": _random(n, i) for i, n in enumerate(_tensor_sizes(total_bytes))}
    path = root / "model.pt"
    torch.save({"model": state, "step": 100}, path)
    return path


# --------------------------------------------------------------------------- hf


def _write_hf(root: Path, total_bytes: int, shards: int = 4) -> Path:
    from safetensors.torch import save_file

    folder = root / "hf"
    folder.mkdir(exist_ok=True)
    sizes = _tensor_sizes(total_bytes, at_least=shards)
    groups = [list(range(len(sizes)))[i::shards] for i in range(shards)]
    weight_map: dict[str, str] = {}
    total = 0
    for index, members in enumerate(groups, start=1):
        name = f"model-{index:05d}-of-{shards:05d}.safetensors"
        tensors = {f"model.layers.{i}.weight": _random(sizes[i], i) for i in members}
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        for key, tensor in tensors.items():
            weight_map[key] = name
            total += tensor.numel() * tensor.element_size()
        del tensors
    index_doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps({"model_type": "corpus", "layers": len(sizes)}))
    return folder


# --------------------------------------------------------------------------- many files


def _write_many_files(root: Path, total_bytes: int, files: int = 10_000) -> Path:
    import torch
    from safetensors.torch import save_file

    folder = root / "many_files"
    per = max(1, total_bytes // 4 // files)
    generator = torch.Generator().manual_seed(0)
    for i in range(files):
        sub = folder / f"{i // 100:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        tensor = torch.randn(per, generator=generator)
        save_file({f"t{i}": tensor}, str(sub / f"{i:05d}.safetensors"))
    return folder


# --------------------------------------------------------------------------- deepspeed


def _write_deepspeed(root: Path, total_bytes: int, ranks: int = 4, step: int = 100) -> Path:
    """ZeRO-2: the model states file holds the bf16/fp16 module weights (here float32, a
    quarter of the total) and the shapes; each rank's optimizer file its partition of the
    flat fp32 master weights and their Adam moments (the rest, split evenly)."""
    import torch

    folder = root / "deepspeed"
    tag = f"global_step{step}"
    (folder / tag).mkdir(parents=True, exist_ok=True)
    (folder / "latest").write_text(tag)
    sizes = _tensor_sizes(max(4, total_bytes // 4), ranks)
    module = {f"module.layers.{i}.weight": _random(n, i) for i, n in enumerate(sizes)}
    numel = sum(sizes)
    torch.save(
        {
            "module": module,
            "buffer_names": [],
            "optimizer": None,
            "param_shapes": [{k: list(v.shape) for k, v in module.items()}],
            "frozen_param_shapes": None,
            "shared_params": {},
            "frozen_param_fragments": None,
            "lr_scheduler": None,
            "data_sampler": None,
            "random_ltd": None,
            "sparse_tensor_module_names": [],
            "skipped_steps": 0,
            "global_steps": step,
            "global_samples": step * 8,
            "dp_world_size": ranks,
            "mp_world_size": 1,
            "ds_config": {"zero_optimization": {"stage": 2}, "train_batch_size": 8},
            "ds_version": "0.16.0",
        },
        folder / tag / "mp_rank_00_model_states.pt",
    )
    del module
    partition = max(1, (total_bytes - numel * 4) // 3 // 4 // ranks)
    for rank in range(ranks):
        _write_zero_partition(folder / tag, rank, ranks, partition, numel, step)
    return folder


def _write_zero_partition(
    folder: Path, rank: int, ranks: int, partition: int, numel: int, step: int
) -> None:
    import torch

    fp32 = _random(partition, 1000 + rank)
    state = {
        "optimizer_state_dict": {
            "loss_scaler": None,
            "dynamic_loss_scale": True,
            "overflow": False,
            "clip_grad": 1.0,
            "base_optimizer_state": {
                "state": {
                    0: {
                        "step": torch.tensor(float(step)),
                        "exp_avg": _random(partition, 2000 + rank) * 0.01,
                        "exp_avg_sq": _random(partition, 3000 + rank).abs() * 1e-4,
                    }
                },
                "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "params": [0]}],
            },
            "single_partition_of_fp32_groups": [fp32],
            "zero_stage": 2,
            "group_paddings": [max(0, partition * ranks - numel) if rank == ranks - 1 else 0],
            "partition_count": [ranks],
            "ds_version": "0.16.0",
        },
        "ds_config": {"zero_optimization": {"stage": 2}},
        "ds_version": "0.16.0",
    }
    torch.save(state, folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")


# --------------------------------------------------------------------------- dcp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_dcp(root: Path, total_bytes: int, ranks: int = 4) -> Path:
    import torch.multiprocessing as mp

    folder = root / "dcp"
    port = _free_port()
    # A third of the bytes are weights, two thirds their Adam moments (as in training).
    sizes = _tensor_sizes(max(4 * ranks, total_bytes // 3), ranks)
    mp.spawn(_dcp_rank, args=(ranks, port, str(folder), sizes), nprocs=ranks, join=True)
    return folder


def _dcp_rank(rank: int, ranks: int, port: int, folder: str, sizes: list[int]) -> None:
    """One rank of the save: a gloo group, a 1-D CPU device mesh, each weight a DTensor
    sharded on dim 0 (FSDP2's layout), and DCP's collective save."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        mesh = init_device_mesh("cpu", (ranks,))
        model, optim = {}, {}
        for i, n in enumerate(sizes):
            name = f"layers.{i}.weight"
            full = _random(n, i).view(ranks, -1)  # the same on every rank: seeded
            model[name] = distribute_tensor(full, mesh, [Shard(0)])
            optim[name] = {
                "exp_avg": distribute_tensor(full * 0.01, mesh, [Shard(0)]),
                "exp_avg_sq": distribute_tensor(full.abs() * 1e-4, mesh, [Shard(0)]),
                "step": torch.tensor(100.0),
            }
        dcp.save({"model": model, "optim": {"state": optim}}, checkpoint_id=folder)
        dist.barrier()
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- command line


def parse_size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}
    lowered = text.strip().lower()
    for unit, factor in units.items():
        if lowered.endswith(unit):
            return int(float(lowered[: -len(unit)]) * factor)
    return int(lowered)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=(*SHAPES, "all"))
    parser.add_argument("root", type=Path)
    parser.add_argument("--total", default=str(SMALL), help="tensor bytes, e.g. 64MiB, 8GiB")
    parser.add_argument("--ranks", type=int, help="dcp, deepspeed: ranks (default 4)")
    parser.add_argument("--shards", type=int, help="hf: shard files (default 4)")
    parser.add_argument("--files", type=int, help="many_files: files (default 10,000)")
    args = parser.parse_args(argv)
    total = parse_size(args.total)
    options = {"ranks": args.ranks, "shards": args.shards, "files": args.files}
    accepted = {"dcp": ("ranks",), "deepspeed": ("ranks",), "hf": ("shards",)}
    accepted["many_files"] = ("files",)
    for shape in SHAPES if args.shape == "all" else (args.shape,):
        opts = {k: options[k] for k in accepted.get(shape, ()) if options[k] is not None}
        location = write(shape, args.root, total, **opts)
        files = manifest(location)
        size = sum(f["size"] for f in files)
        print(f"{shape:<11} {location}  {len(files):,} files, {size / (1 << 20):,.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
