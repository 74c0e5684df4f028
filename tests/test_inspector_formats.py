"""The load check of DCP folders, Hugging Face Trainer and Lightning checkpoints: real
ones made here, each problem caught with its own finding. (tests/test_inspector.py: torch
files, content, safetensors; tests/test_inspector_child.py: through a real child.)
"""

from __future__ import annotations

import argparse
import math

import pytest

from tests.support.checkpoint_files import (
    AttributeDict,
    SystemOnLoad,
    TouchOnLoad,
    lightning_checkpoint,
    malicious_dcp_metadata,
    save_dcp,
    save_hf_trainer,
    save_torch,
    small_state_dict,
    truncate,
)
from tests.support.inspector import check, only

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
            "tests.support.checkpoint_files.AttributeDict",
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
