"""The `reshard` level of a restore test, in a child process: a torch.distributed.checkpoint
folder saved by N ranks is loaded by M ranks, and every rank's share of every tensor is
compared bit for bit with the tensor as it was saved (docs/restore.md, "On another world
size"). This module imports torch, never Django.

Reads {"base": dir, "root": the DCP folder relative to base, "files": [relative paths],
"world_sizes": [M, ...], "timeout_s": float} as JSON on stdin and writes one JSON object:

    {"saved_world_size": N, "tensors": int, "bytes": int,
     "results": [{"world_size": M, "ok": bool, "seconds": float, "message": str}],
     "chunks": [[fqn, offsets, relative_path, offset, length, sha256], ...],
     "error": str | None}

The M ranks are processes forked from this one, joined by gloo through a file store in a
folder of their own (no port to pick or to collide on). Each loads the tensors with DCP's
own load planner (which is what resharding is: each rank asks for its rows, DCP finds the
saved chunks that hold them) as DTensors sharded by rows, and sends back, per tensor, its
rows' place and the sha256 of their bytes. The reference is built apart from DCP: the
saved chunks read by the reader validation scans with (inspect_dcp.load_dcp_chunk), placed
by their offsets into the whole tensor, one tensor at a time; a tensor whose saved chunks
leave a gap or overlap is named too (a resharded load would fill the gap with zeros and
say nothing).

DCP's own reader unpickles `.metadata` with pickle.load: here it goes through
SafeDcpReader, whose unpickler admits DCP's metadata classes and nothing else, after the
folder passed validation's restricted reading (read_dcp_metadata, check_dcp_shards: no
shard outside the folder). Only tensors are asked for: the pickled Python objects a DCP
folder may also hold are never loaded.

`chunks` lists every saved chunk's place in its shard and the sha256 of its stored bytes,
recorded by the caller after a pass, so that a shard altered later is named down to the
tensor (restore_test.altered_tensors).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from typing import TYPE_CHECKING, cast

import torch

from lifeboat.parts import dcp_world_size
from webapp.domain.child_payloads import ReshardRequest, ReshardResult
from webapp.domain.validation.inspect_common import Report, join
from webapp.domain.validation.inspect_dcp import (
    DCP_PACKAGE,
    DcpMetadataUnpickler,
    ShardReader,
    check_dcp_shards,
    load_dcp_chunk,
    read_dcp_metadata,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer

# DCP writes these classes into .metadata; the real ones are built for DCP's planner.
_DCP_METADATA_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.storage",
)


class _RealDcpUnpickler(DcpMetadataUnpickler):
    """What DcpMetadataUnpickler admits, with DCP's own metadata classes (plain data
    classes and one enum) in place of the inert records, since DCP's planner needs them."""

    def find_class(self, module: str, name: str):
        if module == DCP_PACKAGE or module.startswith(DCP_PACKAGE + "."):
            if module in _DCP_METADATA_MODULES and name.isidentifier():
                found = getattr(importlib.import_module(module), name, None)
                if isinstance(found, type):
                    return found
            raise pickle.UnpicklingError(f"{module}.{name} is not DCP metadata")
        return super().find_class(module, name)


def _safe_reader(path: str):
    # torch.distributed loads only when a DCP folder is read, not with this module
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeDcpReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            with open(os.path.join(path, ".metadata"), "rb") as f:
                metadata = _RealDcpUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeDcpReader(path)


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().contiguous().reshape(-1)
    # An ndarray is a buffer; numpy's stubs say so (__buffer__) only for Python 3.12 on.
    return (
        memoryview(cast("Buffer", flat.view(torch.uint8).numpy()))
        if flat.numel()
        else memoryview(b"")
    )


def _sha(tensor: torch.Tensor) -> str:
    return hashlib.sha256(_bytes_of(tensor)).hexdigest()


def _tensor_items(metadata) -> dict:
    """fqn -> (size, dtype) of the tensors .metadata describes (records, not DCP's)."""
    found = {}
    for fqn, item in metadata.state_dict_metadata.items():
        size, properties = getattr(item, "size", None), getattr(item, "properties", None)
        if size is not None and properties is not None and properties.dtype is not None:
            found[fqn] = (list(size), properties.dtype)
    return found


# --------------------------------------------------------------------------- one rank


def _rank_main(rank: int, world_size: int, folder: str, store: str, tensors: dict, out: str):
    """One of the M ranks: load its rows of every tensor through DCP, report their place and
    sha256 to `out` (JSON), or the error."""
    result: dict = {"rank": rank, "shares": {}, "error": None}
    try:
        # torch.distributed loads only in the ranks, inside the try that reports its failure
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor import zeros as dtensor_zeros
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size
        )
        mesh = init_device_mesh("cpu", (world_size,))
        state = {}
        for fqn, (size, dtype) in tensors.items():
            placements = [Shard(0) if size else Replicate()]
            state[fqn] = dtensor_zeros(size, dtype=dtype, device_mesh=mesh, placements=placements)
        dcp.load(state, storage_reader=_safe_reader(folder))
        for fqn, value in state.items():
            shape, offset = compute_local_shape_and_global_offset(
                value.shape, mesh, value.placements
            )
            result["shares"][fqn] = [list(offset), list(shape), _sha(value.to_local())]
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, which says it)
        line = str(exc).strip().splitlines()[:1] or [""]
        result["error"] = f"{type(exc).__name__}: {line[0][:400]}"
        result["trace"] = traceback.format_exc()[-2000:]
    with open(out, "w") as f:
        json.dump(result, f)
    os._exit(0)  # no atexit handlers of the parent's, no second teardown of gloo


def _load_on(world_size: int, folder: str, tensors: dict, timeout_s: float) -> list[dict]:
    """The M ranks' reports, in rank order; RuntimeError when one did not report."""
    scratch = tempfile.mkdtemp(prefix="lifeboat-reshard-")
    context = multiprocessing.get_context("fork")
    try:
        store = os.path.join(scratch, "store")
        outs = [os.path.join(scratch, f"rank-{r}.json") for r in range(world_size)]
        ranks = [
            context.Process(
                target=_rank_main, args=(r, world_size, folder, store, tensors, outs[r])
            )
            for r in range(world_size)
        ]
        for process in ranks:
            process.start()
        deadline = time.monotonic() + timeout_s
        for process in ranks:
            process.join(max(0.1, deadline - time.monotonic()))
        late = [r for r, process in enumerate(ranks) if process.is_alive()]
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join()
        if late:
            raise RuntimeError(f"rank {late[0]} did not finish within {timeout_s:g} s")
        reports = []
        for rank, out in enumerate(outs):
            if not os.path.exists(out):
                raise RuntimeError(f"rank {rank} died (exit code {ranks[rank].exitcode})")
            with open(out) as f:
                reports.append(json.load(f))
        return reports
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------- the reference


def _rows(offset: list[int], shape: list[int]) -> str:
    if not shape:
        return "the whole value"
    return f"rows {offset[0]}–{offset[0] + shape[0] - 1}" if shape[0] else "no rows"


def _saved_tensors(base: str, root: str, metadata, tensors: dict, report: Report, chunks: list):
    """Yields (fqn, the whole tensor as saved, or a str saying why there is none), one
    tensor at a time, and appends every chunk's place and stored bytes' sha256 to
    `chunks`."""
    by_fqn: dict[str, list] = {}
    for index, info in metadata.storage_data.items():
        if getattr(index, "fqn", None) in tensors:
            by_fqn.setdefault(index.fqn, []).append((index, info))
    shard = ShardReader(base, root)
    try:
        for fqn, (size, dtype) in tensors.items():
            whole = torch.zeros(size, dtype=dtype)
            seen = torch.zeros(size, dtype=torch.bool)
            item = metadata.state_dict_metadata[fqn]
            problem = None
            for index, info in sorted(by_fqn.get(fqn, []), key=lambda c: list(c[0].offset)):
                offsets = [int(o) for o in index.offset]
                sizes = next(
                    (list(c.sizes) for c in item.chunks if list(c.offsets) == offsets), None
                )
                shard.open(info.relative_path)
                stored = shard.read(int(info.offset), int(info.length))
                chunks.append([
                    fqn, offsets, join(root, str(info.relative_path)), int(info.offset),
                    int(info.length), hashlib.sha256(stored).hexdigest(),
                ])  # fmt: skip
                tensor = load_dcp_chunk(shard, index, info, item, report)
                if sizes is None or tensor is None:
                    problem = problem or (
                        report.findings[-1]["message"]
                        if report.findings
                        else f"its chunk at {offsets} cannot be read"
                    )
                    continue
                place = tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))
                if seen[place].any():
                    problem = problem or f"its saved chunks overlap at {offsets}"
                seen[place] = True
                whole[place] = tensor.reshape(sizes)
            if problem is None and not bool(seen.all()):
                missing = int(seen.numel() - seen.sum())
                problem = f"{missing:,} of its {seen.numel():,} elements are in no saved chunk"
            yield fqn, problem or whole
    finally:
        shard.close()


def _compare(fqn: str, whole, reports: list[dict], saved_n: int, world_size: int) -> str | None:
    """What is wrong with the M ranks' shares of `fqn`, or None."""
    where = f"saved by {saved_n} rank{'s' * (saved_n != 1)}, loaded by {world_size}"
    if isinstance(whole, str):
        return f"{fqn} ({where}): {whole}"
    covered = 0
    for report in reports:
        offset, shape, sha = report["shares"][fqn]
        place = tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))
        expected = whole[place] if shape else whole
        if _sha(expected) != sha:
            return (
                f"{fqn} ({where}): rank {report['rank']}'s share ({_rows(offset, shape)}) "
                "differs from the saved tensor"
            )
        covered += math.prod(shape) if shape else 0
    if whole.dim() and covered != whole.numel():
        return f"{fqn} ({where}): the ranks' shares hold {covered:,} of {whole.numel():,} elements"
    return None


# --------------------------------------------------------------------------- the check


def check(request: ReshardRequest) -> ReshardResult:
    base, root, files = request["base"], request.get("root", ""), set(request["files"])
    result: ReshardResult = {"saved_world_size": None, "tensors": 0, "bytes": 0,
                             "results": [], "chunks": [], "error": None}  # fmt: skip
    report = Report()
    meta_rel = join(root, ".metadata")
    metadata = read_dcp_metadata(os.path.join(base, meta_rel), meta_rel, report)
    if metadata is None or not check_dcp_shards(base, root, metadata, files, report):
        result["error"] = report.findings[0]["message"] if report.findings else meta_rel
        return result
    tensors = _tensor_items(metadata)
    # Every rank allocates its share of every tensor .metadata describes, and the reference
    # each whole tensor: sizes that the shards cannot hold (a lie, or compressed chunks)
    # would have the worker allocate what the job chose. Refused before any allocation.
    claimed = sum(math.prod(size) * dtype.itemsize for size, dtype in tensors.values())
    stored = sum(
        os.path.getsize(os.path.join(base, f))
        for f in files
        if f.endswith(".distcp") and f.rpartition("/")[0] == root
    )
    if claimed > stored:
        result["error"] = (
            f"{meta_rel} describes {claimed:,} bytes of tensors but its shards hold "
            f"{stored:,}: not loaded on another world size"
        )
        return result
    saved_n = dcp_world_size(sorted(files), root) or 1
    result["saved_world_size"] = saved_n
    folder = os.path.join(base, root)
    # Every world size's ranks are forked before this process runs any torch computation:
    # a rank forked after torch's OpenMP threads have worked can hang in them. The
    # reference is built after.
    loads = {}
    for world_size in request["world_sizes"]:
        started = time.perf_counter()
        try:
            reports = _load_on(world_size, folder, tensors, float(request.get("timeout_s", 600)))
        except RuntimeError as exc:
            reports = [{"rank": None, "error": str(exc)}]
        failed = next((r for r in reports if r.get("error")), None)
        loads[world_size] = (reports, failed, time.perf_counter() - started)
    # The reference, one tensor at a time, against every world size's shares.
    wrong: dict[int, str] = {}
    for fqn, whole in _saved_tensors(base, root, metadata, tensors, report, result["chunks"]):
        if not isinstance(whole, str):
            result["tensors"] += 1
            result["bytes"] += whole.numel() * whole.element_size()
        for world_size, (reports, failed, _) in loads.items():
            if failed is None and world_size not in wrong:
                found = _compare(fqn, whole, reports, saved_n, world_size)
                if found:
                    wrong[world_size] = found
    for world_size, (_, failed, seconds) in loads.items():
        if failed is not None:
            who = f"rank {failed['rank']}" if failed["rank"] is not None else "a rank"
            message = (
                f"saved by {saved_n}, loading on {world_size} failed: {who}: {failed['error']}"
            )
        else:
            message = wrong.get(world_size) or (
                f"saved by {saved_n} rank{'s' * (saved_n != 1)}, loaded by {world_size}: "
                f"{result['tensors']:,} tensors identical bit for bit"
            )
        result["results"].append({
            "world_size": world_size, "ok": failed is None and world_size not in wrong,
            "seconds": round(seconds, 3), "message": message,
        })  # fmt: skip
    return result


def main() -> int:
    json.dump(check(json.load(sys.stdin)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
