"""A many-file checkpoint's load check in parts that run at the same time, each in its
own limited child (inspector.inspect_checkpoint with `only`), and their results merged
into one, as if one child had checked everything.

A part is a set of files whose contents one child reads; every child is told all the
checkpoint's files, for the checks that look across files (an HF index's shards, a
DeepSpeed folder's ranks). A DCP checkpoint is split by shard too: the part holding its
.metadata checks the metadata and every shard's presence, and each part scans the
chunks its shards hold, reading the (small) .metadata to find them. Parts are balanced
by bytes (largest file first into the lightest part). NaN/Inf and all-zero tensors come
back raw and are summarised once over all parts (content_findings), so the findings read
the same as from one child: a DCP tensor's NaN counts add up over the parts that hold
its chunks, and it is all zero only if no part saw a value that is not. No torch, no
Django here: it runs in the worker.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# By the module, not the name: a test replaces inspector.inspect_checkpoint.
import webapp.domain.validation.inspector as inspector
from webapp.domain.formats import format_differs, strongest_format
from webapp.domain.validation.content_findings import AllZero, NonFinite, value_findings


def split(files: list[str], sizes: dict[str, int], parts: int) -> list[list[str]]:
    """At most `parts` lists of files, balanced by bytes, none empty."""
    weights = [0] * max(1, parts)
    bins: list[list[str]] = [[] for _ in weights]
    for path in sorted(files, key=lambda p: (-sizes.get(p, 0), p)):
        index = min(range(len(bins)), key=lambda i: (weights[i], len(bins[i])))
        weights[index] += sizes.get(path, 0) + 1
        bins[index].append(path)
    return [sorted(members) for members in bins if members]


def inspect_in_parts(
    base: str, files: list[str], single_file: bool, format_hint: str, *, parts: int, **limits
) -> dict:
    """inspect_checkpoint over `parts` children at once (each under the limits, on its own
    warm helper slot when warm=True); one child when there is one part."""
    if len(files) <= 1 or parts <= 1:
        return inspector.inspect_checkpoint(base, files, single_file, format_hint, **limits)
    results = raw_parts(base, files, single_file, files, parts=parts, **limits)
    return merge_parts(results, format_hint)


def raw_parts(
    base: str, files: list[str], single_file: bool, only: list[str], *, parts: int, **limits
) -> list[dict]:
    """The unmerged results of inspecting the files `only` (of the checkpoint's `files`)
    in up to `parts` children at once; merge_parts makes one result of them (of these
    and of other workers' parts)."""
    sizes = {}
    for rel in only:
        try:
            sizes[rel] = os.path.getsize(os.path.join(base, rel))
        except OSError:
            sizes[rel] = 0
    groups = split(only, sizes, parts)

    threads = max(1, (os.cpu_count() or 1) // len(groups))

    def one(slot: int) -> dict:
        return inspector.inspect_checkpoint(
            base, files, single_file, "", only=groups[slot], raw_values=True, slot=slot,
            threads=threads, **limits,
        )  # fmt: skip

    if len(groups) == 1:
        return [one(0)]
    with ThreadPoolExecutor(len(groups), thread_name_prefix="lifeboat-inspect") as pool:
        return list(pool.map(one, range(len(groups))))


def merge_parts(results: list[dict], format_hint: str) -> dict:
    """One result from the parts' results (inspector.inspect_checkpoint's shape)."""
    merged: dict[str, Any] = {
        "tensors": 0,
        "parameters": 0,
        "dtypes": {},
        "keys": {},
        "findings": [],
    }
    nonfinite, zero, formats, nonzero, seen = [], [], set(), set(), set()
    timings = {"load_s": 0.0, "scan_s": 0.0}
    for result in results:
        formats.add(result.get("format", "unknown"))
        merged["tensors"] += result.get("tensors", 0)
        merged["parameters"] += result.get("parameters", 0)
        for dtype, count in result.get("dtypes", {}).items():
            merged["dtypes"][dtype] = merged["dtypes"].get(dtype, 0) + count
        merged["keys"].update(result.get("keys", {}))
        for finding in result.get("findings", []):
            # Parts of one DCP folder each check its metadata and shards: one of each.
            key = json.dumps(finding, sort_keys=True)
            if key not in seen:
                seen.add(key)
                merged["findings"].append(finding)
        values = result.get("values") or {}
        nonfinite += [NonFinite(**v) for v in values.get("nonfinite", [])]
        zero += [AllZero(**z) for z in values.get("zero", [])]
        nonzero.update(values.get("nonzero", []))
        for name in timings:
            # The parts ran at the same time: the check took as long as its slowest part.
            timings[name] = max(timings[name], result.get("timings", {}).get(name, 0.0))
    if any(f.get("severity") == "error" for f in merged["findings"]):
        merged["keys"] = {}  # a part that could not finish: the keys are not the whole
    merged["dtypes"] = dict(sorted(merged["dtypes"].items()))
    merged["format"] = strongest_format(formats)
    merged["findings"] += value_findings(_added_up(nonfinite), _all_zero(zero, nonzero))
    merged["findings"] += format_differs(format_hint, merged["format"])
    merged["timings"] = {k: round(v, 6) for k, v in timings.items()}
    return merged


def _added_up(nonfinite: list[NonFinite]) -> list[NonFinite]:
    """One entry per tensor: a DCP tensor's chunks may have been scanned by several parts."""
    totals: dict[tuple[str, str], list[int]] = {}
    for v in nonfinite:
        counts = totals.setdefault((v.name, v.role), [0, 0])
        counts[0] += v.nan
        counts[1] += v.inf
    return [NonFinite(name, nan, inf, role) for (name, role), (nan, inf) in totals.items()]


def _all_zero(zero: list[AllZero], nonzero: set[str]) -> list[AllZero]:
    """A tensor is all zero when every part that scanned some of it found only zeros."""
    seen: dict[str, AllZero] = {}
    for z in zero:
        if z.name not in nonzero:
            seen.setdefault(z.name, z)
    return list(seen.values())
