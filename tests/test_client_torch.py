"""lifeboat.torch.save: atomic, timed, reported, for a file and for a directory."""

from __future__ import annotations

import hashlib

import pytest
import torch

import lifeboat
import lifeboat.torch as lbtorch
from webapp.domain.models import Checkpoint, Event

pytestmark = pytest.mark.django_db(transaction=True)


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("disk full (simulated by the object being saved)")


def test_a_failed_save_keeps_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "model.pt"
    lbtorch.save({"w": torch.ones(1000)}, path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="disk full"):
        lbtorch.save({"w": torch.zeros(1000), "bad": Unpicklable()}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no temporary left
    assert torch.equal(torch.load(path)["w"], torch.ones(1000))


def test_save_reports_a_timed_checkpoint_to_the_current_run(server, token, root, tmp_path):
    with lifeboat.Run(
        "torch-run", url=server.url, token=token, spool_dir=tmp_path / "spool", handle_signals=False
    ):
        report = lbtorch.save(
            {"w": torch.arange(10.0)},
            root / "step-3.pt",
            step=3,
            epoch=1,
            metrics={"loss": torch.tensor(0.5)},
        )
        event = report.wait(30)
    assert event["format"] == "torch" and event["save_seconds"] >= 0
    assert (
        event["files"][0]["sha256"] == hashlib.sha256((root / "step-3.pt").read_bytes()).hexdigest()
    )
    checkpoint = Checkpoint.objects.get(run__key="torch-run")
    assert (checkpoint.step, checkpoint.epoch, checkpoint.metrics) == (3, 1, {"loss": 0.5})
    assert checkpoint.save_seconds is not None
    types = list(
        Event.objects.filter(run__key="torch-run").order_by("time").values_list("type", flat=True)
    )
    assert types.index("checkpoint.started") < types.index("checkpoint.saved")


def test_a_directory_checkpoint_is_replaced_whole(server, token, root, tmp_path):
    target = root / "step-9"
    lbtorch.save({"model.pt": {"a": 1}, "optim.pt": {"b": 2}}, str(target) + "/")
    lbtorch.save({"model.pt": {"a": 3}}, target)  # an existing directory: replaced whole
    assert sorted(p.name for p in target.iterdir()) == ["model.pt"]
    assert torch.load(target / "model.pt") == {"a": 3}
    assert sorted(p.name for p in root.iterdir()) == ["step-9"]
    with pytest.raises(TypeError, match="mapping"):
        lbtorch.save(torch.ones(1), target)
    with lifeboat.Run(
        "dir-run", url=server.url, token=token, spool_dir=tmp_path / "spool", handle_signals=False
    ):
        event = lbtorch.save({"model.pt": {"a": 4}, "extra.pt": [1]}, target, step=9).wait(30)
    assert sorted(f["path"] for f in event["files"]) == ["extra.pt", "model.pt"]
    assert Checkpoint.objects.get(run__key="dir-run").location == str(target)


def test_a_failed_save_is_reported_as_checkpoint_failed(server, token, root, tmp_path):
    with (
        lifeboat.Run(
            "fail-run",
            url=server.url,
            token=token,
            spool_dir=tmp_path / "spool",
            handle_signals=False,
        ),
        pytest.raises(RuntimeError),
    ):
        lbtorch.save({"bad": Unpicklable()}, root / "step-1.pt", step=1)
    failed = Event.objects.get(run__key="fail-run", type="checkpoint.failed")
    assert "disk full" in failed.data["error"]
