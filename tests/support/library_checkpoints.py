"""Checkpoints written by the real training libraries with their defaults: plain torch
(with an AMP GradScaler), Lightning (default ModelCheckpoint; monitored top-k with early
stopping), a transformers model's save_pretrained (.bin), HF Trainer, accelerate's
save_state, and torch.distributed.checkpoint. Tiny models built from configs, data made
in memory, nothing downloaded; a few seconds in all.

`plant_nan` puts one NaN into one tensor of a written checkpoint, re-saving the file with
the serializer that wrote it (torch.save, safetensors), so that everything else in it
stays as the library made it."""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

# transformers and accelerate must never reach the network here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@dataclass
class Written:
    """One checkpoint: `location` is a directory, or the one file of a one-file checkpoint."""

    location: Path

    @property
    def single_file(self) -> bool:
        return self.location.is_file()

    def files(self) -> list[Path]:
        if self.single_file:
            return [self.location]
        return sorted(p for p in self.location.rglob("*") if p.is_file())


def regression_data(n: int = 32) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def small_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 1)
    )


# --------------------------------------------------------------------------- plain torch


def plain_torch(base: Path) -> Written:
    """A hand-written loop's checkpoint: model, AdamW, an LR scheduler and the AMP
    GradScaler (torch.amp.GradScaler works on CPU with float16 autocast), as the PyTorch
    AMP recipe saves them."""
    model = small_net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    scaler = torch.amp.GradScaler("cpu")
    for x, y in torch.utils.data.DataLoader(regression_data(), batch_size=8):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        scheduler.step()
    path = base / "torch" / "step-4.pt"
    path.parent.mkdir(parents=True)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": 1,
        },
        path,
    )
    return Written(path)


# --------------------------------------------------------------------------- Lightning


def _lightning_module():
    import lightning.pytorch as pl

    class Regression(pl.LightningModule):
        def __init__(self, lr: float = 0.01):
            super().__init__()
            self.save_hyperparameters()
            self.net = small_net()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
            return {"optimizer": optimizer, "lr_scheduler": scheduler}

    return Regression()


def _fit(root: Path, callbacks, **options) -> None:
    import lightning.pytorch as pl

    loader = torch.utils.data.DataLoader(regression_data(), batch_size=8)
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        default_root_dir=str(root),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **options,
    )
    trainer.fit(_lightning_module(), loader, loader)


def lightning_default(base: Path) -> Written:
    """Trainer with its default ModelCheckpoint (kth_value = inf in its state)."""
    root = base / "lightning-default"
    _fit(root, None)
    [path] = sorted(root.rglob("*.ckpt"))
    return Written(path)


def lightning_monitored(base: Path) -> list[Written]:
    """ModelCheckpoint(monitor="val_loss", save_top_k=2, save_last=True) with EarlyStopping,
    in bf16 mixed precision (Lightning's "16-mixed" becomes bf16 on CPU, without a scaler)."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    root = base / "lightning-monitored"
    callbacks = [
        ModelCheckpoint(dirpath=root, monitor="val_loss", save_top_k=2, save_last=True),
        EarlyStopping(monitor="val_loss", patience=3),
    ]
    _fit(root, callbacks, precision="bf16-mixed")
    return [Written(p) for p in sorted(root.glob("*.ckpt"))]


# --------------------------------------------------------------------------- transformers


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        ids = (torch.arange(8) + i) % 32
        return {"input_ids": ids, "labels": ids}


def hf_pretrained_bin(base: Path) -> Written:
    """The legacy layout of save_pretrained: config.json and pytorch_model.bin. transformers
    5 writes only safetensors; 4.x wrote the .bin as torch.save(model.state_dict()), which
    is done here (tied lm_head/wte weights share one storage, as then)."""
    path = base / "hf-bin"
    model = tiny_gpt2()
    model.save_pretrained(path)
    (path / "model.safetensors").unlink()
    torch.save(model.state_dict(), path / "pytorch_model.bin")
    return Written(path)


def hf_trainer(base: Path) -> Written:
    """Trainer with save_steps: checkpoint-2/ with model.safetensors, optimizer.pt,
    scheduler.pt, rng_state.pth (numpy RNG state), training_args.bin, trainer_state.json."""
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(base / "hf-trainer"),
        per_device_train_batch_size=8,
        max_steps=2,
        save_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        logging_steps=1,
    )
    Trainer(model=tiny_gpt2(), args=args, train_dataset=Tokens()).train()
    return Written(base / "hf-trainer" / "checkpoint-2")


def accelerate_state(base: Path) -> Written:
    """Accelerator.save_state: model.safetensors, optimizer.bin, scheduler.bin and
    random_states_0.pkl (a torch.save'd dict with the numpy RNG state)."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = small_net()
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer)
    loader = torch.utils.data.DataLoader(regression_data(), batch_size=8)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    path = base / "accelerate"
    accelerator.save_state(str(path))
    return Written(path)


# --------------------------------------------------------------------------- DCP


def dcp_checkpoint(base: Path, *, nan_in: str = "") -> Written:
    """torch.distributed.checkpoint.save of {"model", "optim"} from one process; `nan_in`
    ("model" or "optim") plants a NaN before saving (DCP files are not re-saved by hand)."""
    import torch.distributed.checkpoint as dcp

    model = small_net()
    optimizer = torch.optim.Adam(model.parameters())
    x, y = regression_data()[:8]
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    if nan_in == "model":
        state["model"]["0.weight"][0, 0] = math.nan
    elif nan_in == "optim":
        state["optim"]["state"][0]["exp_avg"][0, 0] = math.nan
    path = base / f"dcp{'-' + nan_in if nan_in else ''}"
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return Written(path)


# --------------------------------------------------------------------------- faults


def copy_checkpoint(written: Written, target: Path) -> Written:
    target.mkdir(parents=True, exist_ok=True)
    if written.single_file:
        return Written(Path(shutil.copy2(written.location, target / written.location.name)))
    destination = target / written.location.name
    shutil.copytree(written.location, destination)
    return Written(destination)


def plant_nan(file: Path, path: tuple) -> None:
    """One NaN into the tensor at `path` (dict keys and list indices) of a torch file or
    (a one-step path) of a safetensors file, re-saved by the serializer that wrote it."""
    if file.suffix == ".safetensors":
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(str(file), "pt") as f:
            metadata = f.metadata()
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        tensors[path[0]].view(-1)[0] = math.nan
        save_file(tensors, str(file), metadata=metadata)
        return
    # Our own file, just written by the library: its pickle is trusted here.
    obj = torch.load(file, weights_only=False, map_location="cpu")
    target = obj
    for step in path:
        target = target[step]
    target.view(-1)[0] = math.nan
    torch.save(obj, file)
