"""The inspection child as the tests call it: `check` a folder, `only` the findings of one
kind."""

from __future__ import annotations

from pathlib import Path

from webapp.domain.validation import inspect_child


def check(base: Path, files: list[str], format_hint: str = "") -> dict:
    """The child's check, run in this process."""
    request = {"base": str(base), "files": files, "single_file": len(files) == 1}
    return inspect_child.inspect({**request, "format_hint": format_hint})


def only(result: dict, code: str) -> dict:
    matching = [f for f in result["findings"] if f["code"] == code]
    assert len(matching) == 1, result["findings"]
    return matching[0]
