"""The load phase of a restore test, in a child process (see restore_test.py).

Reads {"base": dir, "files": [relative paths], "device": "auto" | "cpu" | "cuda"} as JSON
on stdin and writes one JSON object on stdout:

    {"device": "cuda:0 (NVIDIA H200)" | "cpu", "tensors": int, "bytes": int,
     "load_s": float, "to_device_s": float | None, "peak_host_bytes": int,
     "peak_device_bytes": int | None, "loaded": [files], "skipped": [files],
     "error": str | None}

Each file is loaded by the first checkpoint format (webapp/domain/formats) that loads it,
a format's folders (DCP's) by that format: torch files with
torch.load(weights_only=True), so nothing is ever unpickled with arbitrary globals;
safetensors files with safetensors. Every tensor then goes to the
device (the GPU when there is one), synchronised, so `to_device_s` is the real
host-to-device time. This module imports torch, never Django.

With `--serve` it is the restore worker's warm loader instead (inspector.serve_forked):
torch imported once, then each request is loaded in a child forked for it, under the
same limits a fresh child gets, so a restore test does not pay for `import torch`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

from webapp.domain import formats
from webapp.domain.validation.inspector import serve_forked


def _tensors(obj, out: list) -> None:
    import torch  # torch loads only where a checkpoint is opened, never in the web

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for value in obj.values():
            _tensors(value, out)
    elif isinstance(obj, list | tuple):
        for value in obj:
            _tensors(value, out)


def load(request: dict) -> dict:
    """Loads the request's files and moves their tensors to the device; never raises for a
    file that does not load (the result's "error" says why)."""
    import torch  # torch loads only where a checkpoint is opened, never in the web

    wanted = request.get("device", "auto")
    use_cuda = torch.cuda.is_available() and wanted in ("auto", "cuda")
    device = torch.device("cuda:0" if use_cuda else "cpu")
    name = f"cuda:0 ({torch.cuda.get_device_name(0)})" if use_cuda else "cpu"
    result: dict[str, Any] = {
        "device": name,
        "tensors": 0,
        "bytes": 0,
        "loaded": [],
        "skipped": [],
        "load_s": 0.0,
        "to_device_s": None,
        "peak_device_bytes": None,
        "error": None,
    }
    started = time.perf_counter()
    to_device = 0.0
    if use_cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        # Shard by shard: a file's tensors are loaded (torch files memory-mapped), moved
        # to the device, counted and dropped before the next file, so a sharded
        # checkpoint restores within the child's memory limit whatever its total size.
        # A format's folders (DCP's) first, each loaded by its format chunk by chunk.
        files, in_folders = request["files"], set()
        for fmt in formats.FORMATS:
            for root in fmt.folders(files):
                to_device += fmt.load_folder(
                    request["base"], root, set(files), result, device, use_cuda
                )
            in_folders |= fmt.folder_files(files)
        for rel in files:
            if rel in in_folders:
                continue  # loaded above, with its folder
            full = os.path.join(request["base"], rel)
            loader = next((f for f in formats.FORMATS if f.loads(rel, full)), None)
            if loader is None:
                result["skipped"].append(rel)
                continue
            tensors: list = []
            _tensors(loader.load_file(full), tensors)
            result["loaded"].append(rel)
            result["tensors"] += len(tensors)
            result["bytes"] += sum(t.numel() * t.element_size() for t in tensors)
            moved = time.perf_counter()
            if use_cuda:
                on_device = [t.to(device, non_blocking=True) for t in tensors]
                torch.cuda.synchronize()
            else:
                # On the CPU the tensors are already where they will be used; touching
                # every byte reads a memory-mapped file whole.
                on_device = [t.sum() for t in tensors if t.numel() and t.is_floating_point()]
            del on_device, tensors
            to_device += time.perf_counter() - moved
        result["load_s"] = time.perf_counter() - started - to_device
        result["to_device_s"] = to_device
        if use_cuda:
            result["peak_device_bytes"] = torch.cuda.max_memory_allocated()
    except Exception as exc:  # noqa: BLE001 (reported to the parent, which decides)
        result["error"] = (
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:500] if str(exc) else ''}"
        )
    # ru_maxrss is in KiB on Linux. A forked child starts from its helper's resident size,
    # as a fresh one does once it has imported torch.
    result["peak_host_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        import torch  # noqa: F401 (once, here, before any child is forked)

        return serve_forked(load)
    json.dump(load(json.load(sys.stdin)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
