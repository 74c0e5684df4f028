"""The load check: real checkpoints made here with torch, each problem caught with its own
finding, and nothing from a pickle ever executed.

Most tests call the child's `inspect()` in this process (importing torch once); the tests
of the limits, the malicious pickles and the warm helper go through a real child process.
"""

from __future__ import annotations

import math
import zipfile

import pytest
import torch

from tests.support.checkpoint_files import (
    TouchOnLoad,
    flip_byte,
    safetensors_bytes,
    save_torch,
    small_state_dict,
    torch_record_offset,
    truncate,
    write_safetensors,
)
from tests.support.inspector import check, only


def codes(result: dict) -> list[str]:
    return [f["code"] for f in result["findings"]]


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
