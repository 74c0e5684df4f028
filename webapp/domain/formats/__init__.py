"""Checkpoint formats: one module per format, and the registry FORMATS that everything
else iterates.

Adding a format (CONTRIBUTING.md, "Adding a checkpoint format") is one module here with a
Format subclass (base.py), one entry in FORMATS and its tests. The inspection child
(validation/inspect_child.py) hands each file to the first format that claims it and
runs every format's checks across files; the restore test's loader
(recovery/restore_load.py) loads each file with the first format that loads it; the
name a checkpoint gets when its files show several formats, and what a job's format hint
means, are read from here. The client's side of a format (what `lifeboat watch` takes for
a complete checkpoint) is lifeboat/formats.py; tests/test_formats.py checks that the two
name the same formats.

No torch and no Django here: the parent side of the load check reads this registry too.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import cast

from webapp.domain.child_payloads import Finding
from webapp.domain.formats.base import Format, Inspection
from webapp.domain.formats.dcp import Dcp
from webapp.domain.formats.deepspeed import DeepSpeed
from webapp.domain.formats.hf_trainer import HfTrainer
from webapp.domain.formats.lightning import Lightning
from webapp.domain.formats.safetensors import Safetensors
from webapp.domain.formats.torch_save import TorchSave

# The order is the order of claims: the first format that claims a file inspects it (a
# `.safetensors` file is safetensors' even if its bytes start like a torch zip), and the
# first that loads a file loads it. Naming a checkpoint goes by `precedence` instead.
FORMATS: tuple[Format, ...] = (
    Dcp(),
    HfTrainer(),
    Safetensors(),
    TorchSave(),
    Lightning(),
    DeepSpeed(),
)

# What a check's result says when no format recognised the files.
UNKNOWN = "unknown"


def names() -> list[str]:
    """The names a checkpoint's format can have, strongest first (without "unknown")."""
    return [f.name for f in _naming()]


def hinted_format(format_hint: str) -> str:
    """The format a job's hint means ("" when it names none of ours). Only formats that
    name a checkpoint count: a hint "deepspeed" for files reported as torch is no news."""
    hint = (format_hint or "").strip().lower()
    for fmt in _naming():
        if hint == fmt.name or hint in fmt.aliases:
            return fmt.name
    return ""


def strongest_format(found: Iterable[str]) -> str:
    """The name of a checkpoint whose files showed the formats `found`."""
    found = set(found)
    return next((f.name for f in _naming() if f.name in found), UNKNOWN)


def format_differs(format_hint: str, detected: str) -> list[Finding]:
    """An info finding when the job's format hint names another format than the files."""
    hinted = hinted_format(format_hint)
    if hinted and detected != UNKNOWN and hinted != detected:
        message = f"the job reported the format {format_hint!r}, but the files are {detected}"
        return [{"severity": "info", "code": "format_differs", "message": message}]
    return []


def import_child_halves() -> None:
    """Imports every format's child half: a warm helper calls it once, before it forks a
    child per check, so that no check pays for these imports."""
    for fmt in FORMATS:
        for module in fmt.child_modules:
            importlib.import_module(module)


def _naming() -> list[Format]:
    # Only formats with a precedence are sorted here.
    return sorted(
        (f for f in FORMATS if f.precedence is not None), key=lambda f: cast(int, f.precedence)
    )


__all__ = [
    "FORMATS",
    "UNKNOWN",
    "Format",
    "Inspection",
    "format_differs",
    "hinted_format",
    "import_child_halves",
    "names",
    "strongest_format",
]
