"""Is this a torch file (webapp/domain/validation/torch_files.py): the bytes decide, the name only
promises; a `.bin` is torch when torch.save wrote it, whatever it is called. The
validation's inspector and the restore test's loader answer alike, on real files."""

from __future__ import annotations

import zipfile

import pytest
import torch

from webapp.domain import formats
from webapp.domain.recovery import restore_load
from webapp.domain.validation import torch_files


def _state():
    return {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}


# name -> (how it is written, torch by its bytes, promised by its name)
CASES = {
    "model.pt": ("zip", True, True),
    "legacy.pth": ("legacy", True, True),
    "pytorch_model.bin": ("zip", True, True),
    "training_args.bin": ("legacy", True, True),
    # accelerate writes these with torch.save under plain names.
    "optimizer.bin": ("zip", True, False),
    "rng_state": ("zip", True, False),
    # DeepSpeed's and other binaries: not torch, and nothing promised it.
    "mp_rank_00_states.bin": ("random", False, False),
    "notes.bin": ("plain zip", False, False),
    # The name promises torch, the bytes are not: a broken torch file.
    "pytorch_model-00001-of-00002.bin": ("random", False, True),
    "broken.ckpt": ("random", False, True),
}


@pytest.fixture
def files(tmp_path):
    for name, (how, _, _) in CASES.items():
        path = tmp_path / name
        if how == "zip":
            torch.save(_state(), path)
        elif how == "legacy":
            torch.save(_state(), path, _use_new_zipfile_serialization=False)
        elif how == "plain zip":
            with zipfile.ZipFile(path, "w") as archive:
                archive.writestr("readme.txt", "not a tensor")
        else:
            path.write_bytes(b"\x80\x02 not torch, only a pickle-looking start" * 10)
    return tmp_path


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_bytes_decide_and_the_name_promises(files, name):
    _, is_torch, promised = CASES[name]
    assert torch_files.is_torch_file(files / name) is is_torch
    assert torch_files.claimed(name) is promised


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_inspector_and_the_detector_agree(files, name):
    head = (files / name).read_bytes()[: torch_files.HEAD_BYTES]
    claimant = next(f for f in formats.FORMATS if f.name == "torch")
    assert (claimant.claims(name, head), claimant.promised(name)) == torch_files.candidate(
        name, head
    )


def test_the_restore_loader_loads_what_the_bytes_call_torch_and_skips_the_rest(files):
    names = sorted(CASES)
    result = restore_load.load({"base": str(files), "files": names, "device": "cpu"})
    assert result["error"] is None
    assert result["loaded"] == [n for n in names if CASES[n][1]]
    # A broken torch file is the validation's finding; the loader only leaves it alone.
    assert result["skipped"] == [n for n in names if not CASES[n][1]]
    assert result["tensors"] == len(result["loaded"])
