"""The load phase of a restore test, in a child process (see restore_test.py).

Reads {"base": dir, "files": [relative paths], "device": "auto" | "cpu" | "cuda"} as JSON
on stdin and writes one JSON object on stdout:

    {"device": "cuda:0 (NVIDIA H200)" | "cpu", "tensors": int, "bytes": int,
     "load_s": float, "to_device_s": float | None, "peak_host_bytes": int,
     "peak_device_bytes": int | None, "loaded": [files], "skipped": [files],
     "error": str | None}

Torch files are read with torch.load(weights_only=True): nothing is ever unpickled with
arbitrary globals. Safetensors files with safetensors. Every tensor then goes to the
device (the GPU when there is one), synchronised, so `to_device_s` is the real
host-to-device time. This module imports torch, never Django.

With `--serve` it is the restore worker's warm loader instead (inspector.serve_forked):
torch imported once, then each request is loaded in a child forked for it, under the
same limits a fresh child gets, so a restore test does not pay for `import torch`.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
import zipfile

from webapp.domain.validation.torch_files import is_torch_file


def _tensors(obj, out: list) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for value in obj.values():
            _tensors(value, out)
    elif isinstance(obj, list | tuple):
        for value in obj:
            _tensors(value, out)


def _name(rel: str) -> str:
    return rel.rsplit("/", 1)[-1]


def _parent(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else ""


def _load_dcp(base: str, root: str, files: set[str], result: dict, device, use_cuda: bool) -> float:
    """A DCP folder, chunk by chunk: a .distcp shard is a run of torch.save archives, one
    per chunk, that torch.load cannot read whole. Its .metadata goes through validation's
    restricted unpickler and each chunk through the same reader validation scans with
    (inspect_dcp), one shard mapped at a time. Returns the seconds spent moving tensors
    to the device; raises RuntimeError for a chunk that does not load."""
    import torch

    from webapp.domain.validation.inspect_common import Report, join
    from webapp.domain.validation.inspect_dcp import (
        check_dcp_shards,
        dcp_chunks,
        read_dcp_metadata,
    )

    report = Report()
    meta_rel = join(root, ".metadata")
    metadata = read_dcp_metadata(os.path.join(base, meta_rel), meta_rel, report)
    # Its shards named inside the folder, present and long enough (a copy of a verified
    # checkpoint always passes; a .metadata naming "../x" is never followed).
    if metadata is None or not check_dcp_shards(base, root, metadata, files, report):
        raise RuntimeError(report.findings[0]["message"] if report.findings else meta_rel)
    moving, loaded = 0.0, set()
    with contextlib.closing(dcp_chunks(base, root, metadata, report)) as chunks:
        for _, info, tensor in chunks:
            if tensor is None:
                if report.findings:  # it does not load: say why
                    raise RuntimeError(report.findings[0]["message"])
                continue  # a transformed (compressed) chunk: not read here
            loaded.add(join(root, info.relative_path))
            result["tensors"] += 1
            result["bytes"] += tensor.numel() * tensor.element_size()
            started = time.perf_counter()
            if use_cuda:
                tensor.to(device, non_blocking=True)
                torch.cuda.synchronize()
            elif tensor.numel() and tensor.is_floating_point():
                tensor.sum()  # every byte read, as for the other formats
            moving += time.perf_counter() - started
            del tensor
    result["loaded"] += [meta_rel, *sorted(loaded)]
    return moving


def load(request: dict) -> dict:
    """Loads the request's files and moves their tensors to the device; never raises for a
    file that does not load (the result's "error" says why)."""
    import torch

    wanted = request.get("device", "auto")
    use_cuda = torch.cuda.is_available() and wanted in ("auto", "cuda")
    device = torch.device("cuda:0" if use_cuda else "cpu")
    name = f"cuda:0 ({torch.cuda.get_device_name(0)})" if use_cuda else "cpu"
    result = {
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
        dcp_roots = {_parent(rel) for rel in request["files"] if _name(rel) == ".metadata"}
        for root in sorted(dcp_roots):
            to_device += _load_dcp(
                request["base"], root, set(request["files"]), result, device, use_cuda
            )
        for rel in request["files"]:
            full = os.path.join(request["base"], rel)
            tensors: list = []
            if _parent(rel) in dcp_roots and (_name(rel) == ".metadata" or rel.endswith(".distcp")):
                continue  # loaded above, chunk by chunk
            if rel.endswith(".safetensors"):
                from safetensors.torch import load_file

                _tensors(load_file(full, device="cpu"), tensors)
            elif is_torch_file(full):  # by its bytes, whatever its name (torch_files.py)
                # Memory-mapped where the format allows (zip, torch >= 1.6); a legacy
                # pickle-stream file can only be read whole.
                mmap = zipfile.is_zipfile(full)
                _tensors(
                    torch.load(full, map_location="cpu", weights_only=True, mmap=mmap), tensors
                )
            else:
                result["skipped"].append(rel)
                continue
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

        from webapp.domain.validation.inspector import serve_forked

        return serve_forked(load)
    json.dump(load(json.load(sys.stdin)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
