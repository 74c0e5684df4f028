"""The checkpoint formats' registry (webapp/domain/formats) is the one door: a format
registered there is claimed, inspected, named and loaded by validation and the restore
test without another line anywhere, no other list of format names is left on the server
side, and the client's table (lifeboat/formats.py) names the same formats."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from lifeboat import formats as client_formats
from webapp.domain import formats
from webapp.domain.formats import Format, Inspection
from webapp.domain.recovery import restore_load
from webapp.domain.validation import inspect_child
from webapp.domain.validation.inspect_parts import merge_parts

ROOT = Path(__file__).resolve().parent.parent


class Toy(Format):
    """A format of our own: a `.toy` file is one tensor `w`, written as numbers in text."""

    name = "toy"
    aliases = ("toy-format",)
    precedence = 5  # the strongest: a checkpoint with a .toy file is a toy checkpoint

    def __init__(self) -> None:
        self.observed: list[str] = []

    def claims(self, rel: str, head: bytes) -> bool:
        return rel.endswith(".toy")

    def promised(self, rel: str) -> bool:
        return rel.endswith(".toy")

    def inspect_file(self, job: Inspection, rel: str, size: int, head: bytes) -> None:
        from webapp.domain.validation.inspect_common import Scanner

        job.report.formats.add(self.name)
        Scanner(job.report).tensor(f"{rel}:w", _read(job.path(rel)))

    def inspect_checkpoint(self, job: Inspection) -> None:
        toys = [p for p in job.files if p.endswith(".toy")]
        job.report.add("info", "toy_count", f"{len(toys)} toy file(s)")

    def observe(self, job: Inspection, rel: str, obj) -> None:
        self.observed.append(rel)

    def loads(self, rel: str, full: str) -> bool:
        return rel.endswith(".toy")

    def load_file(self, full: str):
        return {"w": _read(full)}


def _read(full: str) -> torch.Tensor:
    return torch.tensor([float(v) for v in Path(full).read_text().split()])


@pytest.fixture
def toy(monkeypatch) -> Toy:
    fmt = Toy()
    monkeypatch.setattr(formats, "FORMATS", (fmt, *formats.FORMATS))
    return fmt


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    torch.save({"layer.weight": torch.ones(2, 2)}, tmp_path / "model.pt")
    (tmp_path / "weights.toy").write_text("1.0 2.0 nan")
    return tmp_path


def inspect(base: Path, files: list[str], format_hint: str = "", **more) -> dict:
    request = {"base": str(base), "files": files, "single_file": False}
    return inspect_child.inspect({**request, "format_hint": format_hint, **more})


def codes(result: dict) -> list[str]:
    return [f["code"] for f in result["findings"]]


# --------------------------------------------------------------------------- the one door


def test_a_registered_format_is_claimed_inspected_and_names_the_checkpoint(toy, checkpoint):
    result = inspect(checkpoint, ["model.pt", "weights.toy"], format_hint="toy-format")
    assert result["format"] == "toy"
    assert result["keys"]["weights.toy:w"] == ["float32", [3]]
    assert "model.pt:layer.weight" in result["keys"]  # the other formats still do their part
    nan = next(f for f in result["findings"] if f["code"] == "nan_or_inf")
    assert nan["tensors"] == ["weights.toy:w"]
    assert "toy_count" in codes(result)  # its checks across files ran
    assert toy.observed == ["model.pt"]  # it saw what the torch file loaded to
    assert "format_differs" not in codes(result)  # its alias means it


def test_a_registered_format_is_compared_with_the_hint(toy, checkpoint):
    result = inspect(checkpoint, ["model.pt", "weights.toy"], format_hint="pytorch")
    differs = next(f for f in result["findings"] if f["code"] == "format_differs")
    assert differs["message"].endswith("but the files are toy")
    assert formats.hinted_format(" Toy-Format ") == "toy"


def test_an_empty_file_its_name_promises_is_corrupt(toy, tmp_path):
    (tmp_path / "empty.toy").write_bytes(b"")
    result = inspect(tmp_path, ["empty.toy"])
    assert codes(result) == ["empty_file", "toy_count"]


def test_parts_of_a_registered_format_merge_under_its_name(toy, checkpoint):
    files = ["model.pt", "weights.toy"]
    parts = [inspect(checkpoint, files, only=[f], raw_values=True) for f in files]
    assert [p["format"] for p in parts] == ["torch", "toy"]
    assert merge_parts(parts, "")["format"] == "toy"


def test_the_restore_loader_loads_a_registered_format(toy, checkpoint):
    result = restore_load.load(
        {"base": str(checkpoint), "files": ["model.pt", "weights.toy"], "device": "cpu"}
    )
    assert result["error"] is None
    assert result["loaded"] == ["model.pt", "weights.toy"]
    assert result["tensors"] == 2
    assert result["bytes"] == 4 * 4 + 3 * 4


def test_without_the_registry_entry_nothing_knows_the_format(checkpoint):
    """The control for the tests above: no other place recognises a .toy file."""
    result = inspect(checkpoint, ["model.pt", "weights.toy"], format_hint="toy-format")
    assert result["format"] == "torch"
    assert not [k for k in result["keys"] if k.startswith("weights.toy")]
    loaded = restore_load.load(
        {"base": str(checkpoint), "files": ["model.pt", "weights.toy"], "device": "cpu"}
    )
    assert loaded["skipped"] == ["weights.toy"]


# --------------------------------------------------------------------------- the registry


def test_names_and_hints_are_unambiguous():
    names = [f.name for f in formats.FORMATS]
    hints = names + [a for f in formats.FORMATS for a in f.aliases]
    assert len(set(hints)) == len(hints)
    assert all(h == h.strip().lower() for h in hints)  # a hint is compared lowercased
    precedences = [f.precedence for f in formats.FORMATS if f.precedence is not None]
    assert len(set(precedences)) == len(precedences)


def test_the_strongest_format_names_a_mixed_checkpoint():
    # What a checkpoint has been called: a registry reordered by accident would rename them.
    assert formats.names() == ["dcp", "hf-trainer", "lightning", "torch", "safetensors"]
    assert formats.strongest_format({"torch", "safetensors", "hf-trainer"}) == "hf-trainer"
    assert formats.strongest_format(set()) == "unknown"
    assert formats.hinted_format("deepspeed") == ""  # it never names a checkpoint


# Strings outside webapp/domain/formats that equal a format's name or alias but are not
# one: (file, string) -> why.
NOT_FORMAT_NAMES = {
    ("webapp/domain/validation/inspect_dcp.py", "torch.distributed.checkpoint"): (
        "the package whose classes DCP pickles into .metadata"
    ),
    ("webapp/domain/validation/inspect_dcp.py", "torch"): "a pickle global's module",
}


def test_no_other_list_of_format_names_is_left_on_the_server_side():
    """A format's name or alias written anywhere else on the server (a table, an `if
    format == ...`) would be a second door that a new format has to find."""
    known = {h for f in formats.FORMATS for h in (f.name, *f.aliases)}
    found = {}
    for top in ("webapp", "workers"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel.startswith("webapp/domain/formats/") or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, str) and value.strip().lower() in known:
                    found[(rel, value)] = node.lineno
    assert sorted(set(found) - set(NOT_FORMAT_NAMES)) == []
    assert sorted(set(NOT_FORMAT_NAMES) - set(found)) == [], "gone: take it off the list"


# --------------------------------------------------------------------------- the client


def test_the_client_and_the_server_name_the_same_formats():
    """lifeboat/formats.py cannot import the server: this is what keeps the two in step.
    Every format that names a checkpoint has the client's completeness rules, and what
    `lifeboat watch` reports as its hint means that format to the server."""
    client = {f.name: f for f in client_formats.FORMATS}
    assert sorted(client) == sorted(formats.names())
    for name, fmt in client.items():
        assert formats.hinted_format(fmt.hint) == name
    assert formats.hinted_format(client_formats.DIRECTORY) == ""  # no format: no finding
