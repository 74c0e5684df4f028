"""Hugging Face folders in the inspection child: trainer_state.json and the
`*.index.json` of a sharded model parsed, every shard the index names present."""

from __future__ import annotations

import json
import os

from webapp.domain.validation.content_findings import plural as plural
from webapp.domain.validation.inspect_common import (
    Report,
    first_line,
    join,
    parent_dir,
    stays_inside,
)
from webapp.domain.validation.inspect_safetensors import HeaderError, read_safetensors_header

# --------------------------------------------------------------------------- HF Trainer


def is_hf_index(path: str) -> bool:
    return path.endswith(".index.json")


def inspect_hf_json(base: str, rel: str, files: set[str], report: Report) -> None:
    try:
        with open(os.path.join(base, rel), encoding="utf-8") as f:
            content = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        report.add("corrupt", "bad_json", f"{rel} is not valid JSON: {first_line(exc)}", rel)
        return
    if not is_hf_index(rel):
        return
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict):
        report.add("corrupt", "bad_json", f"{rel} has no weight_map object", rel)
        return
    folder = parent_dir(rel)
    for shard in sorted({str(v) for v in weight_map.values()}):
        path = join(folder, shard)
        if not stays_inside(shard):
            report.add("corrupt", "bad_json", f"{rel} names a shard outside the checkpoint", rel)
        elif path not in files or not os.path.isfile(os.path.join(base, path)):
            report.add(
                "corrupt", "missing_shard", f"the index {rel} names {path}, which is missing", path
            )
        elif path.endswith(".safetensors"):
            named = sorted(str(k) for k, v in weight_map.items() if str(v) == shard)
            check_index_names(base, rel, path, named, report)


def check_index_names(base: str, rel: str, path: str, named: list[str], report: Report) -> None:
    """Every tensor the index puts in a safetensors shard is in that shard's header, or
    transformers fails the load (or, with strict=False, leaves the weight initialised at
    random). A shard whose header is broken gets its own finding from its inspection."""
    full = os.path.join(base, path)
    try:
        _, entries = read_safetensors_header(full, os.path.getsize(full))
    except (HeaderError, OSError, ValueError):
        return
    held = {entry.name for entry in entries}
    absent = [name for name in named if name not in held]
    if absent:
        report.add(
            "corrupt",
            "index_names_absent_tensor",
            f"the index {rel} puts {len(absent)} tensor(s) in {path}, which does not hold "
            f"them: {', '.join(absent[:5])}{' …' if len(absent) > 5 else ''}",
            path,
            absent[:20],
        )
