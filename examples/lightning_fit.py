"""A Lightning fit watched by Lifeboat (docs/integrations/lightning.md): the callback
reports every file ModelCheckpoint writes; a restart resumes from the newest verified one.

    python examples/lightning_fit.py --run-name lightning-demo
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import lifeboat  # noqa: E402
from lifeboat.lightning import LifeboatCallback  # noqa: E402
from lifeboat.restore import latest_info  # noqa: E402


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-name", default=os.environ.get("LIFEBOAT_RUN", "lightning-demo"))
    parser.add_argument("--checkpoint-dir", default="var/checkpoints")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=64)

    # Resume from the newest checkpoint Lifeboat has verified, if the run has one.
    path, resumed_from = None, None
    try:
        checkpoint = latest_info(args.run_name, lifeboat.Config.resolve())
        path, resumed_from = lifeboat.latest(args.run_name), checkpoint["id"]
        print(f"resuming from {path}", flush=True)
    except lifeboat.LatestError as exc:
        print(f"starting afresh: {exc}", flush=True)

    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        log_every_n_steps=1,
        callbacks=[
            ModelCheckpoint(
                dirpath=Path(args.checkpoint_dir).resolve() / args.run_name,
                save_top_k=-1,
                every_n_epochs=1,
            ),
            # Opens the run for the fit, reports each checkpoint file, closes the run.
            LifeboatCallback(key=args.run_name, resumed_from=resumed_from),
        ],
    )
    trainer.fit(Regression(), loader, ckpt_path=path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
