"""The load check's memory bound (VALIDATION_MEMORY_BYTES) holds through the validate task:
a checkpoint larger than the limit still verifies (its files are mapped, one at a time,
never read into memory), and a checkpoint whose inspection needs more than the limit is
`suspicious` with the reason, while the worker (here, this process) carries on."""

from __future__ import annotations

import os

import pytest
import torch
from django.test import override_settings

from bench import corpus as corpus_writer
from tests.support.events import saved
from webapp.domain.models import Checkpoint
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

# torch alone maps about 550 MiB in the child; 768 MiB leaves ~200 MiB for the check.
LIMIT = 768 << 20


def validated(api, token, project, location, run: str) -> Checkpoint:
    project.allowed_roots = [str(location.parent)]
    project.save()
    body = saved(run=run, step=1, location=str(location), files=corpus_writer.manifest(location))
    assert api.post_events(token, body).status_code == 202
    checkpoint = Checkpoint.objects.get(run__key=run, step=1)
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    return checkpoint


@override_settings(VALIDATION_MEMORY_BYTES=LIMIT)
def test_a_checkpoint_larger_than_the_memory_limit_verifies(api, token, project, tmp_path):
    location = corpus_writer.write("single", tmp_path, LIMIT + (128 << 20))
    assert os.path.getsize(location) > LIMIT

    checkpoint = validated(api, token, project, location, "big")

    assert checkpoint.status == "verified", checkpoint.status_message
    assert checkpoint.content["parameters"] * 4 > LIMIT


@override_settings(VALIDATION_MEMORY_BYTES=LIMIT)
def test_a_sharded_checkpoint_larger_than_the_limit_verifies_shard_by_shard(
    api, token, project, tmp_path
):
    location = corpus_writer.write("hf", tmp_path, LIMIT + (256 << 20), shards=4)

    checkpoint = validated(api, token, project, location, "sharded")

    assert checkpoint.status == "verified", checkpoint.status_message


@override_settings(VALIDATION_MEMORY_BYTES=LIMIT)
def test_a_checkpoint_whose_inspection_exceeds_the_limit_is_suspicious(
    api, token, project, tmp_path
):
    """30 million floats pickled one by one: a 270 MB file that unpickles into ~1 GB of
    Python objects, which no mapping avoids."""
    location = tmp_path / "ckpt" / "history.pt"
    location.parent.mkdir()
    torch.save({"weight": torch.ones(4, 4), "loss_history": [0.5] * 30_000_000}, location)

    checkpoint = validated(api, token, project, location, "heavy")

    assert checkpoint.status == "suspicious"
    assert "needed more than its 768.0 MiB memory limit" in checkpoint.status_message
    [finding] = checkpoint.validations.get().findings
    assert finding["code"] == "load_out_of_memory"
