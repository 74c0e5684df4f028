"""Checkpoint format names, shared by the inspection child and the parent (no torch, no
Django): what a job may write as its format hint, and which detected format names the
checkpoint when its files have several."""

from __future__ import annotations

# What a job may write as its format hint, and the format name it means.
FORMAT_ALIASES = {
    "torch": "torch",
    "pytorch": "torch",
    "lightning": "lightning",
    "pytorch-lightning": "lightning",
    "safetensors": "safetensors",
    "dcp": "dcp",
    "torch.distributed.checkpoint": "dcp",
    "hf-trainer": "hf-trainer",
    "hf": "hf-trainer",
    "huggingface": "hf-trainer",
    "transformers": "hf-trainer",
}
# When a checkpoint's files show several formats, the first of these names it.
PRECEDENCE = ("dcp", "hf-trainer", "lightning", "torch", "safetensors")


def strongest_format(formats) -> str:
    for name in PRECEDENCE:
        if name in formats:
            return name
    return "unknown"


def format_differs(format_hint: str, detected: str) -> list[dict]:
    """An info finding when the job's format hint names another format than the files."""
    hinted = FORMAT_ALIASES.get((format_hint or "").strip().lower(), "")
    if hinted and detected != "unknown" and hinted != detected:
        message = f"the job reported the format {format_hint!r}, but the files are {detected}"
        return [{"severity": "info", "code": "format_differs", "message": message}]
    return []
