"""The load check: real checkpoints made here with torch, each problem caught with its own
finding, and nothing from a pickle ever executed.

Most tests call the child's `inspect()` in this process (importing torch once); the tests
of the limits, the malicious pickles and the warm helper go through a real child process.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import shutil
import signal
import zipfile
from pathlib import Path

import pytest
import torch

from tests.fixtures_checkpoints import (
    AttributeDict,
    SystemOnLoad,
    TouchOnLoad,
    flip_byte,
    lightning_checkpoint,
    malicious_dcp_metadata,
    relative_files,
    safetensors_bytes,
    save_dcp,
    save_hf_trainer,
    save_torch,
    small_state_dict,
    torch_record_offset,
    truncate,
    write_safetensors,
)
from webapp.domain.validation import inspect_child, inspector
from webapp.domain.validation.inspector import inspect_checkpoint


def check(base: Path, files: list[str], format_hint: str = "") -> dict:
    """The child's check, run in this process."""
    request = {"base": str(base), "files": files, "single_file": len(files) == 1}
    return inspect_child.inspect({**request, "format_hint": format_hint})


def codes(result: dict) -> list[str]:
    return [f["code"] for f in result["findings"]]


def only(result: dict, code: str) -> dict:
    matching = [f for f in result["findings"] if f["code"] == code]
    assert len(matching) == 1, result["findings"]
    return matching[0]


# --------------------------------------------------------------------------- torch files


def test_a_good_state_dict_passes_with_its_counts(tmp_path):
    files = save_torch(tmp_path, "model.pt", small_state_dict())

    result = check(tmp_path, files)

    assert result["format"] == "torch"
    assert result["findings"] == []
    assert result["tensors"] == 4
    assert result["parameters"] == 4 * 3 + 3 + 2 * 4 + 2
    assert result["dtypes"] == {"float32": 4}
    assert result["keys"] == {
        "model.pt:layer1.weight": ["float32", [4, 3]],
        "model.pt:layer1.bias": ["float32", [3]],
        "model.pt:fc.weight": ["float32", [2, 4]],
        "model.pt:fc.bias": ["float32", [2]],
    }
    assert set(result["timings"]) == {"load_s", "scan_s"}


def test_nested_state_is_named_by_its_path(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    files = save_torch(
        tmp_path,
        "ckpt.pt",
        {"state_dict": model.state_dict(), "optimizers": [optimizer.state_dict()]},
    )

    keys = check(tmp_path, files)["keys"]

    # A dict key is one step even with dots in it; a list index is written [i].
    assert keys["ckpt.pt:state_dict/weight"] == ["float32", [2, 3]]
    assert keys["ckpt.pt:optimizers[0]/state/0/exp_avg"] == ["float32", [2, 3]]
    assert keys["ckpt.pt:optimizers[0]/state/1/exp_avg_sq"] == ["float32", [2]]
    assert "ckpt.pt:optimizers[0]/state/0/step" in keys


def test_a_legacy_torch_file_loads(tmp_path):
    files = save_torch(
        tmp_path, "model.pt", small_state_dict(), _use_new_zipfile_serialization=False
    )

    result = check(tmp_path, files)

    assert result["findings"] == []
    assert result["tensors"] == 4


@pytest.mark.parametrize("cut", [100, 0.5])
def test_a_truncated_torch_file_has_no_central_directory(tmp_path, cut):
    files = save_torch(tmp_path, "model.pt", small_state_dict())
    size = (tmp_path / "model.pt").stat().st_size
    truncate(tmp_path / "model.pt", size - cut if isinstance(cut, int) else int(size * cut))

    finding = only(check(tmp_path, files), "truncated_zip")

    assert finding["severity"] == "corrupt"
    assert finding["file"] == "model.pt"
    assert (
        "model.pt is truncated or not a torch file: no zip central directory"
        in (finding["message"])
    )
    assert "PytorchStreamReader failed finding central directory" in finding["message"]


def test_a_flipped_byte_in_the_pickle_is_a_damaged_file(tmp_path):
    files = save_torch(tmp_path, "model.pt", small_state_dict())
    flip_byte(tmp_path / "model.pt", torch_record_offset(tmp_path / "model.pt", "data.pkl") + 2)

    finding = only(check(tmp_path, files), "load_failed")

    assert finding["severity"] == "corrupt"
    assert finding["message"].startswith("model.pt could not be loaded: its pickle is damaged (")


def test_a_malicious_protocol_4_pickle_is_named_too(tmp_path):
    pwned = tmp_path / "pwned"
    files = save_torch(tmp_path, "model.pt", {"x": TouchOnLoad(str(pwned))}, pickle_protocol=4)

    finding = only(check(tmp_path, files), "unsafe_pickle")

    assert "the globals pathlib.Path.touch, pathlib.PosixPath, which Lifeboat" in finding["message"]
    assert not pwned.exists()


def test_a_torchscript_archive_is_not_loaded(tmp_path):
    # The records that torch.jit.save writes and torch.load recognises it by (made by hand:
    # scripting a module would take seconds).
    with zipfile.ZipFile(tmp_path / "model.pt", "w") as archive:
        for record in ("data.pkl", "constants.pkl", "code/__torch__.py", "version"):
            archive.writestr(f"model/{record}", b"\x80\x02N.")

    finding = only(check(tmp_path, ["model.pt"]), "torchscript_archive")

    assert finding["severity"] == "suspicious"


def test_a_zero_byte_file_is_empty(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")

    finding = only(check(tmp_path, ["model.pt"]), "empty_file")

    assert finding["severity"] == "corrupt"
    assert finding["message"] == "model.pt is empty (0 bytes)"


def test_a_file_named_pt_that_is_not_torch_is_corrupt(tmp_path):
    (tmp_path / "model.pt").write_text("<html>502 Bad Gateway</html>")

    finding = only(check(tmp_path, ["model.pt"]), "not_a_torch_file")

    assert finding["severity"] == "corrupt"


def test_other_files_are_skipped_unless_they_are_torch_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty.log").write_bytes(b"")
    torch.save({"cpu": torch.get_rng_state()}, tmp_path / "rng_state")  # no suffix: magic

    result = check(tmp_path, ["empty.log", "notes.txt", "rng_state"])

    assert result["findings"] == []
    assert list(result["keys"]) == ["rng_state:cpu"]


# --------------------------------------------------------------------------- content


def test_nan_and_inf_are_counted_and_named_in_one_finding(tmp_path):
    weights = small_state_dict()
    weights["layer1.weight"][0, 0] = math.nan
    weights["layer1.weight"][1, 2] = math.nan
    weights["fc.bias"][1] = math.inf
    files = save_torch(tmp_path, "model.pt", weights)

    finding = only(check(tmp_path, files), "nan_or_inf")

    assert finding["severity"] == "corrupt"
    assert finding["message"] == (
        "2 tensors hold NaN or Inf values: model.pt:layer1.weight (2 NaN, model weights), "
        "model.pt:fc.bias (1 Inf, model weights)"
    )
    assert finding["tensors"] == ["model.pt:layer1.weight", "model.pt:fc.bias"]


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn, torch.complex64]
)
def test_nan_is_found_in_every_floating_dtype(tmp_path, dtype):
    values = torch.zeros(8, 8)
    values[3, 4] = math.nan
    files = save_torch(tmp_path, "model.pt", {"w": values.to(dtype)})

    finding = only(check(tmp_path, files), "nan_or_inf")

    assert finding["tensors"] == ["model.pt:w"]
    assert "(1 NaN, " in finding["message"] or "(2 NaN, " in finding["message"]  # complex: 2


def test_a_long_list_of_nan_tensors_is_cut_short_in_the_message(tmp_path):
    files = save_torch(
        tmp_path, "model.pt", {f"w{i}": torch.full((2,), math.nan) for i in range(7)}
    )

    finding = only(check(tmp_path, files), "nan_or_inf")

    assert finding["message"].startswith(
        "7 tensors hold NaN or Inf values: model.pt:w0 (2 NaN, model weights)"
    )
    assert finding["message"].endswith(" and 2 more")
    assert len(finding["tensors"]) == 7


def test_an_all_zero_weight_matrix_is_suspicious_but_a_zero_bias_is_not(tmp_path):
    weights = small_state_dict()
    weights["fc.weight"] = torch.zeros(2, 4)
    files = save_torch(tmp_path, "model.pt", weights)

    result = check(tmp_path, files)

    finding = only(result, "all_zero")
    assert finding["severity"] == "suspicious"
    assert finding["tensors"] == ["model.pt:fc.weight"]  # not layer1.bias, also zero
    assert "model.pt:fc.weight (2×4, model weights)" in finding["message"]
    assert codes(result) == ["all_zero"]


def test_tied_weights_are_reported_under_each_name(tmp_path):
    shared = torch.full((3, 3), math.inf)
    files = save_torch(tmp_path, "model.pt", {"embed.weight": shared, "head.weight": shared})

    result = check(tmp_path, files)

    assert only(result, "nan_or_inf")["tensors"] == [
        "model.pt:embed.weight",
        "model.pt:head.weight",
    ]
    assert result["tensors"] == 2


# --------------------------------------------------------------------------- safetensors


def test_a_good_safetensors_file_passes(tmp_path):
    write_safetensors(tmp_path / "model.safetensors", small_state_dict())

    result = check(tmp_path, ["model.safetensors"])

    assert result["format"] == "safetensors"
    assert result["findings"] == []
    assert result["tensors"] == 4
    assert result["parameters"] == 25
    assert result["keys"]["model.safetensors:fc.weight"] == ["float32", [2, 4]]


def test_nan_in_a_safetensors_file_is_found(tmp_path):
    weights = small_state_dict()
    weights["fc.weight"][1, 1] = math.nan
    write_safetensors(tmp_path / "model.safetensors", weights)

    finding = only(check(tmp_path, ["model.safetensors"]), "nan_or_inf")

    assert finding["tensors"] == ["model.safetensors:fc.weight"]


FLOATS = bytes(16)  # four float32 zeros
ENTRY = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (
            safetensors_bytes({"a": ENTRY}, FLOATS, header_length=10_000),
            "the header length is 10000 bytes but the file has only",
        ),
        (
            safetensors_bytes(
                {
                    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [3], "data_offsets": [4, 16]},
                },
                FLOATS,
            ),
            "b (bytes 4-16) overlaps a (bytes 0-8)",
        ),
        (safetensors_bytes(b'{"a": {"dtype": "F32", ', FLOATS), "the header is not valid JSON"),
        (safetensors_bytes(b'["a"]', FLOATS), "the header is JSON but not an object"),
        (safetensors_bytes(b'{"a": 1}\xff', FLOATS), "the header is not UTF-8"),
        (
            safetensors_bytes(
                {"a": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 16]}}, FLOATS
            ),
            "a spans 16 bytes but its shape [2, 4] of F32 needs 32 bytes",
        ),
        (
            safetensors_bytes(
                {"a": {"dtype": "F33", "shape": [4], "data_offsets": [0, 16]}}, FLOATS
            ),
            "a has an unknown dtype 'F33'",
        ),
        (
            safetensors_bytes(
                {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, FLOATS[:8]
            ),
            "a ends at byte 16 of the data area, which has only 8 bytes",
        ),
        (
            safetensors_bytes(
                {"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, FLOATS
            ),
            "bytes 0-8 of the data area belong to no tensor",
        ),
        (
            safetensors_bytes(
                {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, FLOATS
            ),
            "the data area has 16 bytes but its tensors cover only 8",
        ),
        (
            safetensors_bytes(
                {"__metadata__": {"step": 5}, "a": ENTRY},
                FLOATS,
            ),
            "__metadata__ must map strings to strings",
        ),
        (b"\x01\x00", "too short for the 8-byte header length"),
    ],
)
def test_a_broken_safetensors_header_says_what_is_wrong(tmp_path, content, says):
    (tmp_path / "model.safetensors").write_bytes(content)

    finding = only(check(tmp_path, ["model.safetensors"]), "bad_safetensors_header")

    assert finding["severity"] == "corrupt"
    assert finding["message"].startswith("model.safetensors has a broken safetensors header: ")
    assert says in finding["message"]


def test_a_hand_made_safetensors_file_with_metadata_passes(tmp_path):
    header = {
        "__metadata__": {"format": "pt"},
        "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]},
        "a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]},
    }
    (tmp_path / "x.safetensors").write_bytes(safetensors_bytes(header, bytes(16)))

    result = check(tmp_path, ["x.safetensors"])

    assert result["findings"] == [
        {
            "severity": "suspicious",
            "code": "all_zero",
            "message": result["findings"][0]["message"],
            "tensors": ["x.safetensors:b"],
        }
    ]
    assert result["dtypes"] == {"bfloat16": 1, "int64": 1}


# --------------------------------------------------------------------------- DCP


def dcp_state(nan: bool = False) -> dict:
    weights = small_state_dict()
    if nan:
        weights["fc.weight"][0, 0] = math.nan
    return {"model": weights, "step": 7}


def test_a_dcp_directory_passes(tmp_path):
    files = save_dcp(tmp_path, dcp_state())

    result = check(tmp_path, files)

    assert ".metadata" in files and any(f.endswith(".distcp") for f in files)
    assert result["format"] == "dcp"
    assert result["findings"] == []
    assert result["tensors"] == 4
    assert result["parameters"] == 25
    assert result["keys"][".metadata:model.fc.weight"] == ["float32", [2, 4]]


def test_a_dcp_directory_missing_a_shard_is_corrupt(tmp_path):
    files = save_dcp(tmp_path, dcp_state())
    shard = next(f for f in files if f.endswith(".distcp"))
    (tmp_path / shard).unlink()

    finding = only(check(tmp_path, files), "missing_shard")

    assert finding["severity"] == "corrupt"
    assert finding["message"] == f"the DCP metadata names {shard}, which is missing"


def test_a_truncated_dcp_shard_is_corrupt(tmp_path):
    files = save_dcp(tmp_path, dcp_state())
    shard = next(f for f in files if f.endswith(".distcp"))
    truncate(tmp_path / shard, 100)

    finding = only(check(tmp_path, files), "truncated_shard")

    assert f"{shard} is 100 bytes but the DCP metadata needs" in finding["message"]


def test_dcp_shards_without_metadata_are_corrupt(tmp_path):
    files = save_dcp(tmp_path, dcp_state())
    (tmp_path / ".metadata").unlink()
    files.remove(".metadata")

    assert "no .metadata" in only(check(tmp_path, files), "missing_shard")["message"]


def test_nan_in_a_dcp_tensor_is_found(tmp_path):
    files = save_dcp(tmp_path, dcp_state(nan=True))

    finding = only(check(tmp_path, files), "nan_or_inf")

    assert finding["tensors"] == [".metadata:model.fc.weight"]


@pytest.mark.parametrize("payload", [TouchOnLoad, SystemOnLoad])
def test_malicious_dcp_metadata_is_named_and_never_executed(tmp_path, payload):
    checkpoint = tmp_path / "ckpt"
    files = save_dcp(checkpoint, dcp_state())
    pwned = tmp_path / "pwned"
    malicious_dcp_metadata(checkpoint / ".metadata", payload(str(pwned)))

    finding = only(check(checkpoint, files), "unsafe_pickle")

    assert finding["severity"] == "suspicious"
    expected = "pathlib.Path.touch" if payload is TouchOnLoad else "posix.system"
    assert finding["message"] == (
        f".metadata is not loadable safely: it needs the globals {expected}, which Lifeboat "
        "never executes"
    )
    assert not pwned.exists()


# --------------------------------------------------------------------------- HF Trainer


def test_an_hf_trainer_checkpoint_passes(tmp_path):
    files = save_hf_trainer(tmp_path / "checkpoint-10")

    result = check(tmp_path / "checkpoint-10", files, format_hint="hf")

    assert result["format"] == "hf-trainer"
    assert result["findings"] == []
    assert result["keys"]["model.safetensors:fc.weight"] == ["float32", [2, 4]]
    assert result["keys"]["optimizer.pt:state/0/exp_avg"] == ["float32", [2, 3]]


def test_a_sharded_hf_checkpoint_passes_and_fails_without_a_shard(tmp_path):
    base = tmp_path / "checkpoint-10"
    files = save_hf_trainer(base, sharded=True)
    assert check(base, files)["findings"] == []

    (base / "model-00002-of-00002.safetensors").unlink()
    finding = only(check(base, files), "missing_shard")

    assert finding["severity"] == "corrupt"
    assert finding["message"] == (
        "the index model.safetensors.index.json names model-00002-of-00002.safetensors, "
        "which is missing"
    )


def test_a_broken_trainer_state_is_bad_json(tmp_path):
    base = tmp_path / "checkpoint-10"
    files = save_hf_trainer(base)
    (base / "trainer_state.json").write_text('{"global_step": 10,')

    finding = only(check(base, files), "bad_json")

    assert finding["file"] == "trainer_state.json"
    assert finding["message"].startswith("trainer_state.json is not valid JSON")


# --------------------------------------------------------------------------- Lightning


def test_a_lightning_checkpoint_passes(tmp_path):
    files = save_torch(tmp_path, "last.ckpt", lightning_checkpoint())

    result = check(tmp_path, files, format_hint="lightning")

    assert result["format"] == "lightning"
    assert result["findings"] == []
    assert result["keys"]["last.ckpt:state_dict/model.fc.bias"] == ["float32", [2]]


@pytest.mark.parametrize(
    ("hparams", "needs", "severity"),
    [
        # A class of a library training jobs commonly use: noted.
        (argparse.Namespace(lr=0.01, layers=2), "argparse.Namespace", "info"),
        # A class from anywhere else: suspicious.
        (
            AttributeDict(lr=0.01, layers=2),
            "tests.fixtures_checkpoints.AttributeDict",
            "suspicious",
        ),
    ],
)
def test_lightning_hyper_parameters_objects_are_reported_and_left_out(
    tmp_path, hparams, needs, severity
):
    ckpt = lightning_checkpoint(hyper_parameters=hparams)
    ckpt["state_dict"]["model.fc.weight"][0, 0] = math.nan
    files = save_torch(tmp_path, "last.ckpt", ckpt)

    result = check(tmp_path, files)

    assert result["format"] == "lightning"
    unsafe = only(result, "unsafe_pickle")
    assert unsafe["severity"] == severity
    assert unsafe["message"] == (
        f"last.ckpt is not loadable safely: it needs the globals {needs}, which Lifeboat "
        "never executes (its tensors were scanned with those objects left out)"
    )
    assert only(result, "nan_or_inf")["tensors"] == ["last.ckpt:state_dict/model.fc.weight"]


def test_a_format_hint_that_disagrees_is_noted(tmp_path):
    files = save_torch(tmp_path, "model.pt", small_state_dict())

    finding = only(check(tmp_path, files, format_hint="safetensors"), "format_differs")

    assert finding["severity"] == "info"


# --------------------------------------------------------------------------- in a child process


def test_the_child_and_the_parent_import_no_django():
    from webapp.domain.validation import (
        checkpoint_walk,
        content_findings,
        formats,
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
    helpers += (torch_files,)
    helpers += (inspect_common, inspect_dcp, inspect_deepspeed, inspect_hf, formats)
    helpers += (inspect_safetensors, inspect_torch)
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
