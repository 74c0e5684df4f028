"""A Lightning fit on 2 CPU processes whose strategy saves one file per rank into the
checkpoint folder (`rank-<n>.pt`), as DeepSpeed's and FSDP's sharded saves do (those
need GPUs), with the Lifeboat callback and LIFEBOAT_PARTS from the environment; and a
plain DDP save, one `.ckpt` file rank 0 writes alone. tests/test_client_parts.py runs
it under torchrun.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/support/jobs/lightning_parts_job.py RUN_KEY CHECKPOINT_DIR {sharded|file}
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy

from lifeboat.lightning import LifeboatCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run from a checkout
from examples.lightning_fit import Regression  # noqa: E402 (the example's model)


class PerRankSaves(DDPStrategy):
    """Every rank writes its own state into the folder the checkpoint path names."""

    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        os.makedirs(filepath, exist_ok=True)
        torch.save(checkpoint["state_dict"], os.path.join(filepath, f"rank-{self.global_rank}.pt"))
        self.barrier("saved")


def main() -> int:
    key, folder, layout = sys.argv[1:4]
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    strategy = PerRankSaves(process_group_backend="gloo") if layout == "sharded" else "ddp"
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(dirpath=folder, save_top_k=-1, every_n_epochs=1),
            LifeboatCallback(key=key),
        ],
    )
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=16))
    return 0


if __name__ == "__main__":
    sys.exit(main())
