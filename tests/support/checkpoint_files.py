"""Builders of real checkpoints for tests: torch files, safetensors, DCP directories,
HF Trainer and Lightning layouts, and malicious pickles. Each returns the list of file
paths (relative to the directory it wrote into), as a training job would report them."""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import pickle
import struct
import zipfile
from pathlib import Path

import torch


def relative_files(base: Path) -> list[str]:
    return sorted(
        str(p.relative_to(base)) for p in base.rglob("*") if p.is_file() and not p.is_symlink()
    )


def small_state_dict() -> dict[str, torch.Tensor]:
    """Two layers; 4×3 + 3 + 2×4 + 2 = 25 parameters, all float32 and finite."""
    generator = torch.Generator().manual_seed(0)
    return {
        "layer1.weight": torch.randn(4, 3, generator=generator),
        "layer1.bias": torch.zeros(3),  # zero biases are normal; never flagged
        "fc.weight": torch.randn(2, 4, generator=generator),
        "fc.bias": torch.randn(2, generator=generator),
    }


def save_torch(base: Path, name: str, obj, **kwargs) -> list[str]:
    path = base / name
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path, **kwargs)
    return [name]


def torch_record_offset(path: Path, suffix: str) -> int:
    """Where the bytes of a torch zip's record (e.g. "data.pkl") start in the file."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", f.read(4))
    return info.header_offset + 30 + name_length + extra_length


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0xFF]))


def truncate(path: Path, keep_bytes: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep_bytes)


# --------------------------------------------------------------------------- safetensors


def safetensors_bytes(header: dict | bytes, data: bytes, *, header_length: int | None = None):
    """A safetensors file built by hand, so that tests can break any part of it."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(raw) if header_length is None else header_length
    return struct.pack("<Q", length) + raw + data


SAFETENSORS_NAMES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A valid safetensors file, laid out as the library does (sorted names, contiguous
    data, header padded to 8 bytes), written without numpy, which safetensors.torch
    needs and this project does not install."""
    header: dict = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        data = ctypes.string_at(tensor.data_ptr(), tensor.nbytes)
        header[name] = {
            "dtype": SAFETENSORS_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(safetensors_bytes(raw, b"".join(chunks)))


# --------------------------------------------------------------------------- DCP


def save_dcp(base: Path, state_dict: dict) -> list[str]:
    """A torch.distributed.checkpoint directory, written by one process with no process
    group (`no_dist=True`)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state_dict, checkpoint_id=str(base), no_dist=True)
    return relative_files(base)


# --------------------------------------------------------------------------- HF Trainer


def save_hf_trainer(base: Path, *, sharded: bool = False) -> list[str]:
    """checkpoint-N/ as transformers' Trainer writes it: weights in safetensors (one file,
    or two shards and an index), optimizer.pt, scheduler.pt, trainer_state.json."""
    base.mkdir(parents=True, exist_ok=True)
    weights = small_state_dict()
    if sharded:
        first = {k: v for k, v in weights.items() if k.startswith("layer1")}
        second = {k: v for k, v in weights.items() if k.startswith("fc")}
        names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
        write_safetensors(base / names[0], first)
        write_safetensors(base / names[1], second)
        weight_map = {k: names[0] for k in first} | {k: names[1] for k in second}
        index = {"metadata": {"total_size": 100}, "weight_map": weight_map}
        (base / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        write_safetensors(base / "model.safetensors", weights)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), base / "optimizer.pt")
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    torch.save(scheduler.state_dict(), base / "scheduler.pt")
    state = {"global_step": 10, "epoch": 0.5, "log_history": [{"loss": 1.0, "step": 10}]}
    (base / "trainer_state.json").write_text(json.dumps(state))
    (base / "config.json").write_text(json.dumps({"hidden_size": 4}))
    return relative_files(base)


# --------------------------------------------------------------------------- Lightning


class AttributeDict(dict):
    """Like lightning.fabric.utilities.data.AttributeDict, which Lightning stores its
    hyper-parameters in: a dict subclass, so weights_only refuses it."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as missing:
            raise AttributeError(key) from missing


def lightning_checkpoint(hyper_parameters=None) -> dict:
    """What Lightning's Trainer.save_checkpoint writes (the parts that matter here)."""
    return {
        "epoch": 1,
        "global_step": 200,
        "pytorch-lightning_version": "2.5.0",
        "state_dict": {f"model.{k}": v for k, v in small_state_dict().items()},
        "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 1}}}},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None}},
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.01, "params": [0, 1]}]}],
        "lr_schedulers": [],
        "hyper_parameters": hyper_parameters if hyper_parameters is not None else {"lr": 0.01},
    }


# --------------------------------------------------------------------------- malicious


class TouchOnLoad:
    """Unpickling this creates `path`: the classic code-execution payload, made visible."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


class SystemOnLoad:
    """Unpickling this runs a shell command through os.system."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def malicious_dcp_metadata(path: Path, payload) -> None:
    """Replaces a DCP .metadata file by a pickle whose loading would run `payload`."""
    path.write_bytes(pickle.dumps(payload))
