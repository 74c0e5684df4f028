"""The load check through a real child process: the limits (time, memory), malicious
pickles never executed, the warm helper replaced when it dies, and how a child's end
becomes a finding. (tests/test_inspector.py checks the formats in this process.)
"""

from __future__ import annotations

import ast
import json
import math
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch

from tests.support.checkpoint_files import (
    SystemOnLoad,
    TouchOnLoad,
    relative_files,
    save_hf_trainer,
    save_torch,
    small_state_dict,
)
from tests.support.inspector import check, only
from webapp.domain.validation import inspect_child, inspector
from webapp.domain.validation.inspector import inspect_checkpoint


def test_the_child_and_the_parent_import_no_django():
    import importlib

    from webapp import domain
    from webapp.domain import child_payloads, formats
    from webapp.domain.formats import base as formats_base
    from webapp.domain.validation import (
        checkpoint_walk,
        content_findings,
        inspect_common,
        inspect_dcp,
        inspect_deepspeed,
        inspect_hf,
        inspect_safetensors,
        inspect_torch,
        pickle_policy,
        sandbox,
        tensor_places,
        torch_files,
    )

    helpers = (checkpoint_walk, content_findings, pickle_policy, tensor_places, sandbox)
    helpers += (child_payloads,)  # the typed payloads: standard library only
    helpers += (torch_files,)
    helpers += (inspect_common, inspect_dcp, inspect_deepspeed, inspect_hf, formats)
    helpers += (inspect_safetensors, inspect_torch)
    # The formats' registry, their modules and every module their child halves import.
    helpers += (formats, formats_base, *(sys.modules[type(f).__module__] for f in formats.FORMATS))
    helpers += tuple(importlib.import_module(m) for f in formats.FORMATS for m in f.child_modules)
    helpers = tuple(dict.fromkeys(helpers))
    for module in (inspect_child, inspector, *helpers):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = [
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        ] + [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        # The one webapp module allowed is the parent side, which imports only the stdlib.
        # The child's own helpers are checked by this same loop.
        # (`from webapp.domain.validation import torch_files` names the package, whose
        # __init__ is a docstring.)
        allowed = {"webapp.domain.validation.inspector", "webapp.domain.validation"}
        allowed |= {domain.__name__}  # `from webapp.domain import formats`: a docstring
        allowed |= {m.__name__ for m in helpers}
        assert not [
            name
            for name in imported
            if name.startswith(("django", "webapp")) and name not in allowed
        ]
    for parent_side in (inspector, sandbox):
        assert "torch" not in {
            alias.name
            for node in ast.walk(ast.parse(Path(parent_side.__file__).read_text()))
            if isinstance(node, ast.Import)
            for alias in node.names
        }
    assert inspector.EXIT_OUT_OF_MEMORY == inspect_child.EXIT_OUT_OF_MEMORY


@pytest.fixture(params=[False, True], ids=["fresh", "warm"])
def warm(request):
    return request.param


def test_a_good_checkpoint_passes_through_the_child(tmp_path):
    # Warm only: the fresh child's whole path is covered by the malicious, timeout and
    # memory tests below, and each fresh child costs an `import torch` (seconds).
    files = save_torch(tmp_path, "model.pt", small_state_dict())

    result = inspect_checkpoint(str(tmp_path), files, True, "torch", warm=True)

    assert result["findings"] == []
    assert result["tensors"] == 4
    assert result["keys"] == check(tmp_path, files)["keys"]


@pytest.mark.parametrize(
    ("payload", "warm"),
    [(TouchOnLoad, False), (TouchOnLoad, True), (SystemOnLoad, True)],
    ids=["path-touch-fresh", "path-touch-warm", "os-system-warm"],
)
def test_a_malicious_pickle_is_reported_and_never_executed(tmp_path, warm, payload):
    pwned = tmp_path / "pwned"
    files = save_torch(tmp_path, "model.pt", {"w": torch.ones(2), "x": payload(str(pwned))})

    result = inspect_checkpoint(str(tmp_path), files, True, warm=warm)

    finding = only(result, "unsafe_pickle")
    assert finding["severity"] == "suspicious"
    assert finding["message"].startswith("model.pt is not loadable safely: it needs the globals ")
    assert ("pathlib.Path" if payload is TouchOnLoad else "posix.system") in finding["message"]
    assert finding["message"].endswith(
        "which Lifeboat never executes (its tensors could not be scanned)"
    )
    assert not pwned.exists()


class CopyOnLoad:
    """A payload made of one plain global, which the placeholders stand in for: unpickling
    it for real would run shutil.copyfile(source, path)."""

    def __init__(self, source: str, path: str):
        self.source, self.path = source, path

    def __reduce__(self):
        return (shutil.copyfile, (self.source, self.path))


def test_tensors_beside_a_malicious_object_are_scanned_without_running_it(tmp_path):
    pwned = tmp_path / "pwned"
    weights = {"w": torch.full((2, 2), math.inf), "payload": CopyOnLoad(__file__, str(pwned))}
    files = save_torch(tmp_path, "model.pt", weights)

    result = inspect_checkpoint(str(tmp_path), files, True, warm=True)

    assert "the globals shutil.copyfile, which" in only(result, "unsafe_pickle")["message"]
    assert only(result, "nan_or_inf")["tensors"] == ["model.pt:w"]
    assert not pwned.exists()


def test_a_check_that_runs_too_long_is_stopped(tmp_path, warm):
    files = save_torch(tmp_path, "model.pt", small_state_dict())

    result = inspect_checkpoint(str(tmp_path), files, True, timeout_s=0.001, warm=warm)

    assert result["findings"] == [
        {
            "severity": "error",
            "code": "load_timeout",
            "message": "the load check did not finish within 0.001 s",
        }
    ]
    assert result["keys"] == {}


@pytest.mark.parametrize("limit", [32 << 20, 300 << 20], ids=["32MiB", "300MiB"])
def test_a_check_that_needs_more_memory_than_its_limit_is_stopped(tmp_path, warm, limit):
    files = save_torch(tmp_path, "model.pt", small_state_dict())

    result = inspect_checkpoint(str(tmp_path), files, True, memory_bytes=limit, warm=warm)

    expected = f"the load check needed more than its {limit >> 20:.1f} MiB memory limit"
    assert result["findings"] == [
        {"severity": "error", "code": "load_out_of_memory", "message": expected}
    ]


def test_a_dead_warm_helper_is_replaced(tmp_path):
    files = save_torch(tmp_path, "model.pt", small_state_dict())
    inspector.start_warm_inspector()
    helper = inspector._warm_helper()
    os.kill(helper._proc.pid, signal.SIGKILL)
    helper._proc.wait()

    result = inspect_checkpoint(str(tmp_path), files, True, warm=True)

    assert result["tensors"] == 4


@pytest.mark.parametrize(
    ("outcome", "code", "says"),
    [
        ({"returncode": -11, "stdout": "", "stderr": ""}, "load_crashed", "(killed by SIGSEGV)"),
        (
            {"returncode": 1, "stdout": "", "stderr": "Traceback\nRuntimeError: boom\n"},
            "load_crashed",
            "(exit status 1): RuntimeError: boom",
        ),
        ({"returncode": 0, "stdout": "{", "stderr": ""}, "load_crashed", "without a readable"),
        ({"returncode": 3, "stdout": "", "stderr": ""}, "load_out_of_memory", "8.0 GiB"),
        ({"returncode": -9, "stdout": "", "stderr": ""}, "load_out_of_memory", "8.0 GiB"),
        (
            {"returncode": -6, "stdout": "", "stderr": "terminate: std::bad_alloc"},
            "load_out_of_memory",
            "8.0 GiB",
        ),
    ],
)
def test_how_a_child_ended_becomes_an_error_finding(outcome, code, says):
    result = inspector.interpret(outcome, 600, 8 << 30, 1.0)

    (finding,) = result["findings"]
    assert (finding["severity"], finding["code"]) == ("error", code)
    assert says in finding["message"]
    assert result["keys"] == {} and result["format"] == "unknown"


def test_results_are_plain_json(tmp_path):
    files = save_hf_trainer(tmp_path)

    result = check(tmp_path, files)

    assert json.loads(json.dumps(result)) == result
    assert relative_files(tmp_path) == files


def test_an_unknown_binary_is_not_called_a_broken_torch_file(tmp_path):
    (tmp_path / "weights.bin").write_bytes(os.urandom(4096))
    (tmp_path / "pytorch_model.bin").write_bytes(os.urandom(4096))
    result = inspect_checkpoint(
        str(tmp_path), ["weights.bin", "pytorch_model.bin"], False, warm=True
    )
    flagged = {f["file"] for f in result["findings"] if f["severity"] == "corrupt"}
    assert flagged == {"pytorch_model.bin"}  # its name promises a torch file; the other's does not


class _FakeHyperParameters(dict):
    """Stands in for Lightning's AttributeDict: a dict subclass from a library module."""


_FakeHyperParameters.__module__ = "lightning.fabric.utilities.data"
_FakeHyperParameters.__qualname__ = "AttributeDict"


def test_library_objects_in_a_lightning_checkpoint_are_noted_not_flagged(tmp_path, monkeypatch):
    import sys
    import types

    # torch.save pickles the class by module and name, so that module must exist here.
    module = types.ModuleType("lightning.fabric.utilities.data")
    module.AttributeDict = _FakeHyperParameters
    for name in ("lightning", "lightning.fabric", "lightning.fabric.utilities"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "lightning.fabric.utilities.data", module)
    state = {
        "state_dict": {"fc.weight": torch.ones(2, 2)},
        "global_step": 10,
        "epoch": 1,
        "hyper_parameters": _FakeHyperParameters(lr=0.1),
    }
    torch.save(state, tmp_path / "last.ckpt")
    result = inspect_checkpoint(str(tmp_path), ["last.ckpt"], True, warm=True)
    [finding] = [f for f in result["findings"] if f["code"] == "unsafe_pickle"]
    assert finding["severity"] == "info"
    assert "lightning.fabric.utilities.data.AttributeDict" in finding["message"]
    assert result["tensors"] == 1
