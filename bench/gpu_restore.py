"""The load phase of a restore test on a GPU, beside the plain way to load the same bytes.

    .venv/bin/python bench/gpu_restore.py --total 1GiB --rounds 3

For each of three checkpoints of the same tensors (one `torch.save` file, three
safetensors shards, a torch.distributed.checkpoint folder), each side runs in a fresh
interpreter, as a restore worker's fresh child does:
- Lifeboat: webapp/domain/recovery/restore_load.py, the restore test's loader (JSON request
  on stdin; each file loaded by its format with weights_only / safetensors, every tensor
  moved to the device and synchronised);
- baseline: `torch.load(weights_only=True, mmap=True)` / `safetensors.torch.load_file` /
  `dcp.load` and `.to("cuda")` of every tensor, then one synchronise.
The baseline's tensors, copied back from the device, are compared with the saved ones
(sha256 of each tensor's bytes), and the loader's count and bytes with what was saved.
Needs torch with CUDA (it runs on the CPU too, where the device phase is a read of every
byte); needs no Django, database or S3.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

BASELINE = r"""
import json, os, sys, time
import torch
request = json.load(sys.stdin)
device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
started = time.perf_counter()
kind, base = request["kind"], request["base"]
if kind == "torch":
    state = torch.load(os.path.join(base, "model.pt"), weights_only=True, mmap=True)
elif kind == "safetensors":
    from safetensors.torch import load_file
    state = {}
    for name in sorted(os.listdir(base)):
        state.update(load_file(os.path.join(base, name)))
else:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    reader = dcp.FileSystemReader(base)
    meta = reader.read_metadata()
    state = {k: torch.empty(v.size, dtype=v.properties.dtype)
             for k, v in meta.state_dict_metadata.items()
             if isinstance(v, TensorStorageMetadata)}
    dcp.load(state, checkpoint_id=base)
loaded = time.perf_counter()
on_device = {k: v.to(device, non_blocking=True) for k, v in state.items()}
if device.type == "cuda":
    torch.cuda.synchronize()
done = time.perf_counter()
import hashlib
digests = {k: hashlib.sha256(v.cpu().numpy().tobytes()).hexdigest() for k, v in on_device.items()}
print(json.dumps({"load_s": loaded - started, "to_device_s": done - loaded,
                  "tensors": len(on_device), "digests": digests}))
"""


def size(text: str) -> int:
    for unit, factor in UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def make_checkpoints(folder: Path, total: int) -> dict:
    """The same tensors three ways; returns each tensor's sha256 as saved."""
    import hashlib

    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    n = 16
    per = total // n // 4  # float32 elements per tensor
    generator = torch.Generator().manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(per, generator=generator) for i in range(n)}
    (folder / "torch").mkdir()
    torch.save(state, folder / "torch" / "model.pt")
    (folder / "safetensors").mkdir()
    names = list(state)
    for shard in range(3):
        part = {k: state[k] for k in names[shard::3]}
        save_file(part, str(folder / "safetensors" / f"model-{shard:05d}-of-00003.safetensors"))
    dcp.save(state, checkpoint_id=str(folder / "dcp"))
    return {k: hashlib.sha256(v.numpy().tobytes()).hexdigest() for k, v in state.items()}


def run_json(command: list[str], request: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run(
        command, input=json.dumps(request), capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"{command[-1]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout.strip().splitlines()[-1])


def lifeboat_load(base: Path) -> tuple[float, dict]:
    files = sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
    request = {"base": str(base), "files": files, "device": "auto"}
    return run_json([sys.executable, "-m", "webapp.domain.recovery.restore_load"], request)


def baseline_load(kind: str, base: Path) -> tuple[float, dict]:
    return run_json([sys.executable, "-c", BASELINE], {"kind": kind, "base": str(base)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", default="1GiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="where to write the checkpoints (default: a temp dir)")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"torch {torch.__version__}, {gpu}, {os.cpu_count()} CPUs", flush=True)
    if not torch.cuda.is_available():
        print("no GPU: the loader reads every byte, the baseline's .to('cpu') none; no ratio")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        saved = make_checkpoints(folder, size(args.total))
        expected = len(saved) * (size(args.total) // len(saved) // 4) * 4
        print(f"{len(saved)} tensors, {args.total} each way", flush=True)
        # The restore loader answers counts and bytes (checked here against the saved
        # ones); the baseline answers each tensor's sha256 after its trip to the device.
        # The ratio compares load + to device, measured inside each child: the wall times
        # add the interpreter's start, and the baseline's its sha256 check after the trip.
        print("kind         lifeboat: load + to device (wall)   baseline: load + to device   ratio")
        for kind in ("torch", "safetensors", "dcp"):
            ours, theirs = [], []
            for _ in range(args.rounds):
                wall, out = lifeboat_load(folder / kind)
                if out["error"] or (out["tensors"], out["bytes"]) != (len(saved), expected):
                    raise SystemExit(f"lifeboat's load of {kind}: {out}")
                ours.append((wall, out["load_s"], out["to_device_s"], out["device"]))
                wall, out = baseline_load(kind, folder / kind)
                if out["digests"] != saved:
                    raise SystemExit(f"baseline {kind}: the tensors differ from the saved ones")
                theirs.append((wall, out["load_s"], out["to_device_s"]))
            o = [statistics.median(x) for x in list(zip(*ours, strict=True))[:3]]
            t = [statistics.median(x) for x in zip(*theirs, strict=True)]
            print(
                f"{kind:12} {o[1]:.2f} + {o[2]:.2f} s ({o[0]:5.2f} s)          "
                f"{t[1]:.2f} + {t[2]:.2f} s               "
                f"{(o[1] + o[2]) / (t[1] + t[2]):.2f}x   [{ours[0][3]}]",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
