"""The load check of one checkpoint, run in a child process (see inspector.py): it reads
the request, hands each file to the first checkpoint format that claims it, runs every
format's checks across files, and answers with one Report. The formats are the registry's
(webapp/domain/formats): this module knows none of them by name.

Reads one request as JSON on stdin: {"base": dir, "files": [relative paths],
"single_file": bool, "format_hint": str}; writes one JSON object on stdout (the shape is
documented in inspector.inspect_checkpoint). Exits with EXIT_OUT_OF_MEMORY when it runs
out of memory, so that the parent can say so. With `--serve` it is the warm helper
instead: torch imported once, one forked child per request (see serve()).

This module imports torch but never Django, and never unpickles anything with arbitrary
globals: torch files go through torch's weights_only unpickler, DCP metadata through a
restricted unpickler that turns DCP's own classes into inert stand-ins. Any other global
is named in an `unsafe_pickle` finding and never imported, let alone called.

Every tensor read is counted and scanned for NaN, Inf and all-zero, and what a finding
means depends on where the tensor lives (tensor_places).
"""

from __future__ import annotations

import gc
import json
import os
import sys

import torch

from webapp.domain import formats
from webapp.domain.child_payloads import InspectRequest, InspectResult
from webapp.domain.validation.content_findings import plural as plural
from webapp.domain.validation.inspect_common import (
    EXIT_OUT_OF_MEMORY,
    Report,
    first_line,
    raise_if_out_of_memory,
)
from webapp.domain.validation.sandbox import serve_forked
from webapp.domain.validation.torch_files import HEAD_BYTES

# --------------------------------------------------------------------------- the checkpoint


def inspect(request: InspectRequest) -> InspectResult:
    """The whole check of one checkpoint; never raises for a bad file (only MemoryError)."""
    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
    files = sorted(str(p) for p in request["files"])
    report = Report()

    def observe(rel: str, obj) -> None:
        for fmt in formats.FORMATS:
            fmt.observe(job, rel, obj)

    # One part of a checkpoint checked in parts (inspect_parts.inspect_in_parts): only
    # the files `only` have their contents read here; `files` is the whole checkpoint,
    # for the checks that look across files.
    job = formats.Inspection(
        base=request["base"],
        files=files,
        only=set(request.get("only") or files),
        report=report,
        observe=observe,
    )
    in_folders = set().union(*(fmt.folder_files(files) for fmt in formats.FORMATS))
    for rel in sorted(job.only - in_folders):  # a folder's files: checked with their folder
        try:
            inspect_file(job, rel)
        except Exception as exc:  # a gap in this checker, not in the file
            raise_if_out_of_memory(exc)
            report.add(
                "error",
                "inspect_failed",
                f"{rel} could not be inspected ({type(exc).__name__}: {first_line(exc)})",
                rel,
            )
    for fmt in formats.FORMATS:
        fmt.inspect_checkpoint(job)
    detected = formats.strongest_format(report.formats)
    result = report.as_dict(detected, bool(request.get("raw_values")))
    if not request.get("raw_values"):  # a part's is said once, by inspect_parts' merge
        result["findings"] += formats.format_differs(request.get("format_hint", ""), detected)
    return result


def inspect_file(job: formats.Inspection, rel: str) -> None:
    """One file, by the first format that claims it; a file no format claims is not a
    checkpoint file (a config, a README) and is left alone."""
    full = job.path(rel)
    size = os.path.getsize(full)
    with open(full, "rb") as f:
        head = f.read(HEAD_BYTES)
    fmt = next((f for f in formats.FORMATS if f.claims(rel, head)), None)
    if fmt is None:
        return
    if size == 0 and fmt.promised(rel):
        job.report.add("corrupt", "empty_file", f"{rel} is empty (0 bytes)", rel)
        return
    fmt.inspect_file(job, rel, size, head)


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
    """The warm helper (inspector.WarmHelper): torch and the formats' child halves are
    imported once, here; each request is checked in a child forked for it, under its
    limits (sandbox.serve_forked). This process itself never opens a checkpoint."""
    formats.import_child_halves()

    return serve_forked(inspect, out_of_memory_exit=EXIT_OUT_OF_MEMORY)


if __name__ == "__main__":
    sys.exit(main())
