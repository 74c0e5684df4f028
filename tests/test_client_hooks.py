"""The Lightning and Hugging Face hooks, with the real libraries, report the checkpoints
their frameworks write, with checksums that match the files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

import lifeboat
from webapp.domain.models import Checkpoint, MetricPoint, Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def root(tmp_path, project):
    root = tmp_path / "out"
    root.mkdir()
    project.allowed_roots = [str(root)]
    project.save()
    return root


def file_checksums(base: Path) -> dict[str, str]:
    if base.is_file():
        return {base.name: hashlib.sha256(base.read_bytes()).hexdigest()}
    return {
        p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in base.rglob("*")
        if p.is_file()
    }


def stored_checksums(checkpoint: Checkpoint) -> dict[str, str]:
    return {f.path: f.sha256 for f in checkpoint.files.all()}


def data(n=64):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def test_the_lightning_callback_reports_every_checkpoint_lightning_writes(
    server, token, root, tmp_path, monkeypatch
):
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lifeboat.lightning import LifeboatCallback

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    # The callback opens its own run from the environment, as a user's job would.
    monkeypatch.setenv("LIFEBOAT_URL", server.url)
    monkeypatch.setenv("LIFEBOAT_TOKEN", token)
    monkeypatch.setenv("LIFEBOAT_RUN", "lightning-run")
    monkeypatch.setenv("LIFEBOAT_SPOOL_DIR", str(tmp_path / "spool"))
    callback = LifeboatCallback(handle_signals=False)
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        callbacks=[
            ModelCheckpoint(dirpath=root, save_top_k=-1, every_n_epochs=1),
            callback,
        ],
    )
    loader = torch.utils.data.DataLoader(data(), batch_size=16)
    trainer.fit(Regression(), loader)

    written = sorted(root.glob("*.ckpt"))
    assert [p.name for p in written] == [
        "epoch=0-step=4.ckpt",
        "epoch=1-step=8.ckpt",
        "epoch=2-step=12.ckpt",
    ]
    checkpoints = {c.step: c for c in Checkpoint.objects.filter(run__key="lightning-run")}
    assert sorted(checkpoints) == [4, 8, 12]
    for path in written:
        step = int(path.stem.rsplit("=", 1)[1])
        assert stored_checksums(checkpoints[step]) == file_checksums(path)
        assert checkpoints[step].location == str(path)
        assert "train_loss" in checkpoints[step].metrics
    run = Run.objects.get(key="lightning-run")
    assert run.status == "finished" and run.framework.startswith("lightning")
    assert MetricPoint.objects.filter(run=run).count() == 12


def test_the_hf_callback_reports_every_checkpoint_the_trainer_writes(server, token, root, tmp_path):
    from transformers import Trainer, TrainingArguments

    from lifeboat.hf import LifeboatHFCallback

    class Regression(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def forward(self, x, labels=None):
            out = self.layer(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    class Pairs(torch.utils.data.Dataset):
        def __init__(self):
            self.inner = data()

        def __len__(self):
            return len(self.inner)

        def __getitem__(self, i):
            x, y = self.inner[i]
            return {"x": x, "labels": y}

    run = lifeboat.Run(
        "hf-run", url=server.url, token=token, spool_dir=tmp_path / "spool", handle_signals=False
    ).start()
    args = TrainingArguments(
        output_dir=str(root),
        per_device_train_batch_size=16,
        num_train_epochs=2,
        save_strategy="steps",
        save_steps=3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    Trainer(
        model=Regression(), args=args, train_dataset=Pairs(), callbacks=[LifeboatHFCallback(run)]
    ).train()
    run.finish()

    written = sorted(root.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in written] == ["checkpoint-3", "checkpoint-6", "checkpoint-8"]
    checkpoints = {c.step: c for c in Checkpoint.objects.filter(run__key="hf-run")}
    assert sorted(checkpoints) == [3, 6, 8]
    for path in written:
        stored = checkpoints[int(path.name.split("-")[1])]
        assert stored_checksums(stored) == file_checksums(path)
        assert "trainer_state.json" in stored_checksums(stored)
        assert "loss" in stored.metrics
    assert MetricPoint.objects.filter(run__key="hf-run").count() >= 8
