"""The load check in parts (inspect_parts). A DCP checkpoint's shards are split between
parts, each part scans the chunks its shards hold, and the merged result reads as one
child's. The checkpoint is a real 2-rank save (gloo), each tensor sharded on dim 0 so
that its chunks sit in both ranks' shards (its tensors: parts_state() in
tests/support/dcp_ranks.py); the parts run the child's own function in this process, as
each limited child would."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from tests.support.dcp_ranks import parts_dcp
from webapp.domain.validation import inspect_child
from webapp.domain.validation.inspect_parts import merge_parts, split
from webapp.domain.validation.sandbox import child_env

SHARDS = ["__0_0.distcp", "__1_0.distcp"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """dcp_ranks.parts_state() saved by 2 ranks (tests/support/dcp_ranks.py)."""
    folder = parts_dcp(tmp_path_factory.mktemp("dcp2") / "ckpt")
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", *SHARDS]
    return folder


def files_of(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def whole(folder: Path) -> dict:
    """One child's check of the whole checkpoint."""
    request = {"base": str(folder), "files": files_of(folder), "single_file": False}
    return inspect_child.inspect(request)


def in_parts(folder: Path, parts: list[list[str]]) -> dict:
    files = files_of(folder)
    results = [
        inspect_child.inspect(
            {"base": str(folder), "files": files, "single_file": False, "only": part}
            | {"raw_values": True}
        )
        for part in parts
    ]
    return merge_parts(results, "dcp")


def problems(result: dict) -> dict[str, list]:
    return {f["code"]: f.get("tensors", f.get("file")) for f in result["findings"]}


def test_the_parts_split_a_dcp_folder_by_shard(saved):
    sizes = {name: (saved / name).stat().st_size for name in files_of(saved)}

    parts = split(files_of(saved), sizes, 2)

    assert sorted(len([f for f in p if f.endswith(".distcp")]) for p in parts) == [1, 1]


@pytest.mark.parametrize(
    "parts",
    [[[".metadata", SHARDS[0]], [SHARDS[1]]], [[".metadata"], [SHARDS[0]], [SHARDS[1]]]],
    ids=["metadata-with-a-shard", "metadata-alone"],
)
def test_parts_find_what_one_child_finds(saved, parts):
    one = whole(saved)
    merged = in_parts(saved, parts)

    # A tensor whose chunks are zero in one shard only is not all zero; the NaNs of two
    # shards add up in one finding; nothing is counted twice.
    assert (
        problems(merged)
        == problems(one)
        == {
            "nan_or_inf": [".metadata:model.nan_in_both"],
            "all_zero": [".metadata:model.zero_everywhere"],
        }
    )
    nan = next(f for f in merged["findings"] if f["code"] == "nan_or_inf")
    assert (
        nan["message"] == next(f for f in one["findings"] if f["code"] == "nan_or_inf")["message"]
    )
    assert "2 NaN" in nan["message"]
    assert (
        (merged["tensors"], merged["parameters"]) == (one["tensors"], one["parameters"]) == (4, 128)
    )
    assert merged["format"] == "dcp"


def test_a_truncated_shard_is_named_once_by_the_part_holding_the_metadata(saved, tmp_path):
    folder = Path(shutil.copytree(saved, tmp_path / "ckpt"))
    with (folder / SHARDS[1]).open("r+b") as f:
        f.truncate(100)

    merged = in_parts(folder, [[".metadata", SHARDS[0]], [SHARDS[1]]])

    truncated = [f for f in merged["findings"] if f["code"] == "truncated_shard"]
    assert [f["file"] for f in truncated] == [SHARDS[1]]
    assert merged["findings"] == whole(folder)["findings"]


def test_a_shard_cut_after_the_metadata_part_ran_is_named_not_skipped(saved, tmp_path):
    """Parts may run at different times (on different workers): the part that scans a
    shard checks it again and says what is wrong, rather than skipping its chunks."""
    folder = Path(shutil.copytree(saved, tmp_path / "ckpt"))
    files = files_of(folder)

    def part(only: list[str]) -> dict:
        request = {"base": str(folder), "files": files, "single_file": False}
        return inspect_child.inspect(request | {"only": only, "raw_values": True})

    first = part([".metadata", SHARDS[0]])
    with (folder / SHARDS[1]).open("r+b") as f:
        f.truncate(100)
    merged = merge_parts([first, part([SHARDS[1]])], "dcp")

    truncated = [f.get("file") for f in merged["findings"] if f["code"] == "truncated_shard"]
    assert truncated == [SHARDS[1]]


def test_unsafe_metadata_is_named_once_and_no_part_scans_by_it(saved, tmp_path):
    folder = Path(shutil.copytree(saved, tmp_path / "ckpt"))
    (folder / ".metadata").write_bytes(pickle.dumps(os.system, protocol=4))

    merged = in_parts(folder, [[".metadata"], [SHARDS[0]], [SHARDS[1]]])

    assert [f["code"] for f in merged["findings"]] == ["unsafe_pickle"]
    assert merged["tensors"] == 0


def test_each_part_scans_the_chunks_of_its_own_shards_only(saved):
    def values(part: list[str]) -> dict:
        request = {"base": str(saved), "files": files_of(saved), "single_file": False}
        return inspect_child.inspect(request | {"only": part, "raw_values": True})["values"]

    metadata_only, second_shard = values([".metadata"]), values([SHARDS[1]])

    assert metadata_only == {"nonfinite": [], "zero": [], "nonzero": []}
    assert second_shard["nonfinite"] == [
        {"name": ".metadata:model.nan_in_both", "nan": 1, "inf": 0, "role": "model"}
    ]
    # Rank 1's half of zero_in_one is not zero, so no part may call that tensor all zero.
    assert ".metadata:model.zero_in_one" in second_shard["nonzero"]


def test_inspection_children_sleep_rather_than_spin_when_idle(monkeypatch):
    """Parts and workers on one host share its cores: spinning OpenMP threads of one
    child would steal the others' time (an 8 GiB DCP scan took 13x longer)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert child_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # a deployment's own choice is kept
    assert child_env()["OMP_WAIT_POLICY"] == "ACTIVE"
