"""Checkpoints made by the real libraries with their defaults (tests/support/library_checkpoints.py)
go through the real validate task: every one is verified, with no corrupt or suspicious
finding; the same checkpoint with one NaN planted in a weight, or in optimizer state, is
corrupt and the finding names the tensor by its path."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.support import library_checkpoints as lib
from tests.support.events import saved
from webapp.domain.models import Checkpoint
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, lib.Written]:
    """Written once for the module: a few seconds of tiny training runs."""
    base = tmp_path_factory.mktemp("corpus")
    monitored = lib.lightning_monitored(base)
    return {
        "torch": lib.plain_torch(base),
        "lightning-default": lib.lightning_default(base),
        "lightning-top2-first": monitored[0],
        "lightning-top2-last": monitored[-1],
        "hf-pretrained-bin": lib.hf_pretrained_bin(base),
        "hf-trainer": lib.hf_trainer(base),
        "accelerate": lib.accelerate_state(base),
        "dcp": lib.dcp_checkpoint(base),
    }


FORMATS = {
    "torch": "torch",
    "lightning-default": "lightning",
    "lightning-top2-first": "lightning",
    "lightning-top2-last": "lightning",
    "hf-pretrained-bin": "torch",
    "hf-trainer": "hf-trainer",
    "accelerate": "torch",
    "dcp": "dcp",
}


def report_and_check(
    api, token, project, written: lib.Written, run: str, kind: str = ""
) -> Checkpoint:
    """Reports the checkpoint as a training job would, and runs the validate task."""
    project.allowed_roots = [str(written.location.parent)]
    project.save()
    base = written.location.parent if written.single_file else written.location
    files = []
    for path in written.files():
        data = path.read_bytes()
        files.append(
            {
                "path": str(path.relative_to(base)),
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    body = saved(
        run=run, step=1, location=str(written.location), files=files, format=FORMATS[kind or run]
    )
    response = api.post_events(token, body)
    assert response.status_code == 202, response.content
    checkpoint = Checkpoint.objects.get(run__key=run, step=1)
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    return checkpoint


def findings(checkpoint: Checkpoint) -> list[dict]:
    return checkpoint.validations.get().findings


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_checkpoint_written_by_the_library_is_verified(api, token, project, corpus, name):
    checkpoint = report_and_check(api, token, project, corpus[name], name)

    assert checkpoint.status == "verified", checkpoint.status_message
    doubtful = [f for f in findings(checkpoint) if f["severity"] in ("corrupt", "suspicious")]
    assert doubtful == []
    assert checkpoint.content["tensors"] > 0


def test_lightnings_default_checkpoint_is_the_latest_and_its_inf_score_is_a_note(
    api, token, project, corpus
):
    checkpoint = report_and_check(
        api, token, project, corpus["lightning-default"], "pl", "lightning-default"
    )

    [note] = [f for f in findings(checkpoint) if f["code"] == "bookkeeping_not_finite"]
    assert note["severity"] == "info"
    [name] = note["tensors"]
    assert name.startswith(f"{corpus['lightning-default'].location.name}:callbacks/ModelCheckpoint")
    assert name.endswith("/kth_value")
    latest = api.get(token, "/runs/pl/latest")
    assert latest.status_code == 200, latest.content
    assert latest.json()["step"] == 1


# Where one NaN goes in each checkpoint: (file, path in it, the name the finding must use).
WEIGHT = {
    "torch": ("", ("model", "0.weight"), "model/0.weight"),
    "lightning-default": ("", ("state_dict", "net.0.weight"), "state_dict/net.0.weight"),
    "lightning-top2-first": ("", ("state_dict", "net.0.weight"), "state_dict/net.0.weight"),
    "hf-pretrained-bin": (
        "pytorch_model.bin",
        ("transformer.h.0.attn.c_attn.weight",),
        "transformer.h.0.attn.c_attn.weight",
    ),
    "hf-trainer": (
        "model.safetensors",
        ("transformer.h.0.mlp.c_fc.weight",),
        "transformer.h.0.mlp.c_fc.weight",
    ),
    "accelerate": ("model.safetensors", ("0.weight",), "0.weight"),
}
OPTIMIZER = {
    "torch": ("", ("optimizer", "state", 0, "exp_avg"), "optimizer/state/0/exp_avg"),
    "lightning-default": (
        "",
        ("optimizer_states", 0, "state", 0, "exp_avg"),
        "optimizer_states[0]/state/0/exp_avg",
    ),
    "hf-trainer": ("optimizer.pt", ("state", 0, "exp_avg_sq"), "state/0/exp_avg_sq"),
    "accelerate": ("optimizer.bin", ("state", 2, "exp_avg"), "state/2/exp_avg"),
}
PLANTED = [("weight", n) for n in WEIGHT] + [("optimizer", n) for n in OPTIMIZER]


@pytest.mark.parametrize(("where", "name"), PLANTED)
def test_one_nan_planted_in_a_library_checkpoint_is_caught_and_named(
    api, token, project, corpus, tmp_path, where, name
):
    file, path, expected = (WEIGHT if where == "weight" else OPTIMIZER)[name]
    written = lib.copy_checkpoint(corpus[name], tmp_path / "planted")
    target = written.location if written.single_file else written.location / file
    lib.plant_nan(target, path)

    checkpoint = report_and_check(api, token, project, written, name)

    assert checkpoint.status == "corrupt", checkpoint.status_message
    [finding] = [f for f in findings(checkpoint) if f["code"] == "nan_or_inf"]
    assert finding["tensors"] == [f"{target.name}:{expected}"]
    role = "model weights" if where == "weight" else "optimizer state"
    assert f"{target.name}:{expected} (1 NaN, {role})" in checkpoint.status_message


@pytest.mark.parametrize("where", ["model", "optim"])
def test_one_nan_planted_in_a_dcp_checkpoint_is_caught_and_named(
    api, token, project, tmp_path, where
):
    written = lib.dcp_checkpoint(tmp_path, nan_in=where)

    checkpoint = report_and_check(api, token, project, written, "dcp")

    assert checkpoint.status == "corrupt", checkpoint.status_message
    expected = ".metadata:model.0.weight" if where == "model" else ".metadata:optim.state.0.exp_avg"
    [finding] = [f for f in findings(checkpoint) if f["code"] == "nan_or_inf"]
    assert finding["tensors"] == [expected]
    role = "model weights" if where == "model" else "optimizer state"
    assert f"{expected} (1 NaN, {role})" in checkpoint.status_message


def test_the_corpus_files_are_what_the_libraries_write(corpus):
    """The layouts the tests above rely on (so that a library change shows here first)."""
    names = {n: {p.name for p in w.files()} for n, w in corpus.items()}
    assert {"model.safetensors", "optimizer.pt", "rng_state.pth", "training_args.bin"} <= names[
        "hf-trainer"
    ]
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= names["accelerate"]
    assert {".metadata", "__0_0.distcp"} <= names["dcp"]
    assert "pytorch_model.bin" in names["hf-pretrained-bin"]
    assert Path(corpus["lightning-default"].location).suffix == ".ckpt"
