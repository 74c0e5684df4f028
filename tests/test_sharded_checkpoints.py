"""Sharded and many-file checkpoints written by bench/corpus.py with the real libraries (a
4-rank DCP save, HF safetensors shards with their index, a DeepSpeed ZeRO folder, one
torch file, a folder of many files) go through the real ingest and the real validate
task: every shape is verified. A shard damaged after the job reported it (truncated,
removed, one byte flipped) and a checkpoint written broken and reported as it is (a shard
cut short, a rank's shard never written, an index naming a tensor no shard holds) are
each caught, and the finding names the shard."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import corpus as corpus_writer
from tests.support.dcp_ranks import corpus_dcp
from tests.support.events import saved
from webapp.domain.models import Checkpoint
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

# The many-file shape at 1,000 files keeps this module's run short; bench/validate.py and
# `bench/corpus.py many_files` use 10,000.
OPTIONS = {"many_files": {"files": 1000}}
FORMATS = {"dcp": "dcp", "hf": "safetensors", "deepspeed": "torch", "single": "torch"}
FORMATS["many_files"] = "safetensors"
# One shard of each sharded shape, relative to the checkpoint's folder.
SHARD = {
    "dcp": "__2_0.distcp",
    "hf": "model-00002-of-00004.safetensors",
    "deepspeed": "global_step100/zero_pp_rank_2_mp_rank_00_optim_states.pt",
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """Each shape written once for the module, at the corpus's small (CI) size. The DCP
    save's 4 ranks run the corpus's own rank function, forked rather than spawned
    (tests/support/dcp_ranks.py): the same files, in a third of the CPU time."""
    base = tmp_path_factory.mktemp("corpus")
    return {
        shape: (
            corpus_dcp(base, 4 << 20)
            if shape == "dcp"
            else corpus_writer.write(shape, base, 4 << 20, **OPTIONS.get(shape, {}))
        )
        for shape in corpus_writer.SHAPES
    }


def copy_of(location: Path, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    if location.is_file():
        return Path(shutil.copy2(location, target / location.name))
    return Path(shutil.copytree(location, target / location.name))


def report(api, token, project, location: Path, shape: str) -> Checkpoint:
    """Reports the checkpoint's files as they are now, as a training job would."""
    project.allowed_roots = [str(location.parent)]
    project.save()
    body = saved(
        run=shape,
        step=1,
        location=str(location),
        files=corpus_writer.manifest(location),
        format=FORMATS[shape],
    )
    response = api.post_events(token, body)
    assert response.status_code == 202, response.content
    return Checkpoint.objects.get(run__key=shape, step=1)


def validated(checkpoint: Checkpoint) -> Checkpoint:
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    return checkpoint


def findings_about(checkpoint: Checkpoint, file: str) -> list[dict]:
    found = checkpoint.validations.get().findings
    return [f for f in found if f.get("file") == file and f["severity"] in ("corrupt", "missing")]


@pytest.mark.parametrize("shape", corpus_writer.SHAPES)
def test_every_shape_of_checkpoint_is_verified(api, token, project, written, shape, tmp_path):
    location = copy_of(written[shape], tmp_path)
    checkpoint = validated(report(api, token, project, location, shape))

    assert checkpoint.status == "verified", checkpoint.status_message
    doubtful = [f for f in checkpoint.validations.get().findings if f["severity"] != "info"]
    assert doubtful == []
    assert checkpoint.content["tensors"] >= len(corpus_writer.manifest(location)) // 2


def truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def flip_byte(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


DAMAGE = {"truncated": truncate, "missing": Path.unlink, "flipped": flip_byte}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("shape", list(SHARD))
def test_a_shard_damaged_after_the_report_is_caught_and_named(
    api, token, project, written, shape, damage, tmp_path
):
    location = copy_of(written[shape], tmp_path)
    checkpoint = report(api, token, project, location, shape)
    DAMAGE[damage](location / SHARD[shape])

    checkpoint = validated(checkpoint)

    assert checkpoint.status == ("missing" if damage == "missing" else "corrupt")
    assert findings_about(checkpoint, SHARD[shape]), checkpoint.validations.get().findings
    assert SHARD[shape] in checkpoint.status_message


@pytest.mark.parametrize("shape", list(SHARD))
def test_a_shard_written_short_and_reported_as_it_is_is_caught_and_named(
    api, token, project, written, shape, tmp_path
):
    """The job's own save was cut short (a full disk, a killed rank) and its client
    hashed what was there: integrity passes, the format's own structure does not."""
    location = copy_of(written[shape], tmp_path)
    truncate(location / SHARD[shape])

    checkpoint = validated(report(api, token, project, location, shape))

    assert checkpoint.status == "corrupt", checkpoint.status_message
    assert findings_about(checkpoint, SHARD[shape]), checkpoint.validations.get().findings


@pytest.mark.parametrize("shape", list(SHARD))
def test_a_shard_never_written_is_caught_and_named(api, token, project, written, shape, tmp_path):
    """A rank that died before writing: the job reports the files that exist, and the
    metadata, the index or the model states file names the one that does not."""
    location = copy_of(written[shape], tmp_path)
    (location / SHARD[shape]).unlink()

    checkpoint = validated(report(api, token, project, location, shape))

    assert checkpoint.status == "corrupt", checkpoint.status_message
    assert findings_about(checkpoint, SHARD[shape]), checkpoint.validations.get().findings


def test_an_index_naming_a_tensor_no_shard_holds_is_caught_and_named(
    api, token, project, written, tmp_path
):
    location = copy_of(written["hf"], tmp_path)
    index_path = location / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.99.weight"] = SHARD["hf"]
    index_path.write_text(json.dumps(index))

    checkpoint = validated(report(api, token, project, location, "hf"))

    assert checkpoint.status == "corrupt", checkpoint.status_message
    (finding,) = findings_about(checkpoint, SHARD["hf"])
    assert finding["code"] == "index_names_absent_tensor"
    assert finding["tensors"] == ["model.layers.99.weight"]
