"""The load check of one checkpoint, run in a child process (see inspector.py): it reads
the request, sends each file to its format's inspector (inspect_torch, inspect_safetensors,
inspect_dcp, inspect_hf, inspect_deepspeed) and answers with one Report.

Reads one request as JSON on stdin: {"base": dir, "files": [relative paths],
"single_file": bool, "format_hint": str}; writes one JSON object on stdout (the shape is
documented in inspector.inspect_checkpoint). Exits with EXIT_OUT_OF_MEMORY when it runs
out of memory, so that the parent can say so. With `--serve` it is the warm helper
instead: torch imported once, one forked child per request (see serve()).

This module imports torch but never Django, and never unpickles anything with arbitrary
globals: torch files go through torch's weights_only unpickler, DCP metadata through a
restricted unpickler that turns DCP's own classes into inert stand-ins. Any other global
is named in an `unsafe_pickle` finding and never imported, let alone called.

Per file: torch files (.pt .pth .bin .ckpt, or zip / legacy torch magic) get their zip
directory checked, then torch.load(weights_only=True, mmap=True); safetensors files get
their header validated against the format and the file length, then are mapped; DCP
directories get their .metadata read and every shard it names checked for presence and
length; HF Trainer indexes and trainer_state.json are parsed and every indexed shard
must be present. Every tensor read is counted and scanned for NaN, Inf and all-zero, and
what a finding means depends on where the tensor lives (tensor_places).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import PurePosixPath

import torch

from webapp.domain.validation.content_findings import plural as plural
from webapp.domain.validation.inspect_common import (
    EXIT_OUT_OF_MEMORY,
    LEGACY_TORCH_MAGIC,
    Report,
    first_line,
    join,
    parent_dir,
    raise_if_out_of_memory,
)

# --------------------------------------------------------------------------- the checkpoint
from webapp.domain.validation.inspect_dcp import inspect_dcp, scan_dcp_part
from webapp.domain.validation.inspect_deepspeed import check_folders
from webapp.domain.validation.inspect_hf import inspect_hf_json, is_hf_index
from webapp.domain.validation.inspect_safetensors import inspect_safetensors_file
from webapp.domain.validation.inspect_torch import inspect_torch_file, is_torch_candidate


def inspect(request: dict) -> dict:
    """The whole check of one checkpoint; never raises for a bad file (only MemoryError)."""
    base = request["base"]
    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
    files = sorted(str(p) for p in request["files"])
    report = Report()
    file_set = set(files)
    # One part of a checkpoint checked in parts (inspector.inspect_in_parts): only these
    # files' contents are read here; `files` is the whole checkpoint, for the checks
    # that look across files. A DCP checkpoint's .metadata is checked by the part that
    # holds it; each of its shards is scanned by the part that holds the shard.
    only = set(request.get("only") or files)
    dcp_roots = sorted({parent_dir(p) for p in only if PurePosixPath(p).name == ".metadata"})
    all_dcp_roots = sorted({parent_dir(p) for p in files if PurePosixPath(p).name == ".metadata"})
    shard_roots = sorted(
        {parent_dir(p) for p in only if p.endswith(".distcp")} & set(all_dcp_roots)
    )
    for rel in sorted(only):
        try:
            inspect_file(base, rel, file_set, all_dcp_roots, report)
        except Exception as exc:  # a gap in this checker, not in the file
            raise_if_out_of_memory(exc)
            report.add(
                "error",
                "inspect_failed",
                f"{rel} could not be inspected ({type(exc).__name__}: {first_line(exc)})",
                rel,
            )
    for root in sorted(set(dcp_roots) | set(shard_roots)):
        try:
            if root in dcp_roots:
                inspect_dcp(base, root, file_set, report, scan=only)
            else:
                scan_dcp_part(base, root, file_set, report, scan=only)
        except Exception as exc:
            raise_if_out_of_memory(exc)
            report.add(
                "error",
                "inspect_failed",
                f"the DCP checkpoint in {root or '.'} could not be inspected "
                f"({type(exc).__name__}: {first_line(exc)})",
            )
    check_orphan_dcp_shards(sorted(only), all_dcp_roots, report)
    check_folders(files, report)
    if any(PurePosixPath(p).name == "trainer_state.json" for p in files):
        report.formats.add("hf-trainer")
    return report.as_dict(request.get("format_hint", ""), bool(request.get("raw_values")))


def inspect_file(base: str, rel: str, files: set[str], dcp_roots: list[str], report) -> None:
    name = PurePosixPath(rel).name
    if name == ".metadata" or (rel.endswith(".distcp") and parent_dir(rel) in dcp_roots):
        return  # checked with their DCP checkpoint
    full = os.path.join(base, rel)
    size = os.path.getsize(full)
    if name == "trainer_state.json" or is_hf_index(rel):
        inspect_hf_json(base, rel, files, report)
        return
    with open(full, "rb") as f:
        head = f.read(len(LEGACY_TORCH_MAGIC))
    is_safetensors = rel.endswith(".safetensors")
    is_torch, claimed_torch = is_torch_candidate(rel, head)
    if size == 0:
        if is_safetensors or claimed_torch:
            report.add("corrupt", "empty_file", f"{rel} is empty (0 bytes)", rel)
        return
    if is_safetensors:
        inspect_safetensors_file(full, rel, size, report)
    elif is_torch:
        inspect_torch_file(full, rel, size, head, report)
        # Drop the mapping of this file before the next one: under the address-space limit
        # only one file at a time should be mapped.
        gc.collect()


def check_orphan_dcp_shards(files: list[str], dcp_roots: list[str], report: Report) -> None:
    orphans = sorted(
        {parent_dir(p) for p in files if p.endswith(".distcp") and parent_dir(p) not in dcp_roots}
    )
    for folder in orphans:
        report.formats.add("dcp")
        where = folder or "the checkpoint"
        report.add(
            "corrupt",
            "missing_shard",
            f"{where} holds .distcp shards but no .metadata, without which DCP cannot load them",
            join(folder, ".metadata"),
        )


# --------------------------------------------------------------------------- entry point


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        return serve()
    # Everything printed by torch or this code goes to stderr; stdout carries the result.
    result_fd = os.dup(1)
    os.dup2(2, 1)
    gc.freeze()  # torch's objects, out of the collector's sight (see serve_forked)
    try:
        request = json.load(sys.stdin)
        result = inspect(request)
    except MemoryError:
        os._exit(EXIT_OUT_OF_MEMORY)
    with os.fdopen(result_fd, "w", encoding="utf-8") as out:
        json.dump(result, out)
    return 0


# --------------------------------------------------------------------------- warm helper


def serve() -> int:
    """The warm helper (inspector.WarmHelper): torch is imported once, here; each request
    is checked in a child forked for it, under its limits (sandbox.serve_forked). This
    process itself never opens a checkpoint."""
    from webapp.domain.validation.sandbox import serve_forked

    return serve_forked(inspect, out_of_memory_exit=EXIT_OUT_OF_MEMORY)


if __name__ == "__main__":
    sys.exit(main())
