"""The inspection reads the very files integrity checked: a checkpoint folder swapped for
a symlink out of the roots between the two steps (the worst moment for Lifeboat) changes
nothing. Real files, a real symlink, the real inspection child."""

from __future__ import annotations

import os

import pytest
import torch

from tests.support.validation import check, report, small_model, write_state
from webapp.domain.validation import inspector

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_folder_swapped_after_the_hash_is_not_what_the_inspection_reads(
    api, token, root, tmp_path, monkeypatch
):
    write_state(root / "step-1" / "model.pt", small_model())
    checkpoint = report(api, token, root / "step-1", 1)
    outside = tmp_path / "outside"
    poisoned = torch.randn(64, 32)
    poisoned[0, 0] = float("nan")
    write_state(outside / "model.pt", small_model(**{"layer1.weight": poisoned}))
    real_inspect = inspector.inspect_checkpoint

    def swap_then_inspect(*args, **kwargs):
        # After integrity hashed the good file, before the child loads it.
        os.rename(root / "step-1", root / "step-1.away")
        os.symlink(outside, root / "step-1")
        return real_inspect(*args, **kwargs)

    monkeypatch.setattr(inspector, "inspect_checkpoint", swap_then_inspect)
    checkpoint = check(checkpoint)
    assert checkpoint.status == "verified", checkpoint.status_message
    assert "NaN" not in checkpoint.status_message
    assert checkpoint.content["tensors"] == 3
    assert os.path.islink(root / "step-1")  # the swap did happen
