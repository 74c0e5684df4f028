"""A Hugging Face Trainer run watched by Lifeboat (docs/integrations/hf-trainer.md). The
model is a tiny GPT-2 built from a config (nothing is downloaded); the callback reports
every checkpoint-N/ folder; a restart resumes from the newest verified one.

    python examples/hf_trainer.py --run-name hf-demo
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import lifeboat  # noqa: E402
from lifeboat.hf import LifeboatHFCallback  # noqa: E402
from lifeboat.restore import latest_info  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    """Random token sequences: enough for the Trainer to train and save."""

    def __init__(self, count=64, length=16, vocab=128):
        self.ids = torch.randint(vocab, (count, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-name", default=os.environ.get("LIFEBOAT_RUN", "hf-demo"))
    parser.add_argument("--checkpoint-dir", default="var/checkpoints")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)

    # Resume from the newest checkpoint Lifeboat has verified, if the run has one.
    path, resumed_from = None, None
    try:
        checkpoint = latest_info(args.run_name, lifeboat.Config.resolve())
        path, resumed_from = str(lifeboat.latest(args.run_name)), checkpoint["id"]
        print(f"resuming from {path}", flush=True)
    except lifeboat.LatestError as exc:
        print(f"starting afresh: {exc}", flush=True)

    training = TrainingArguments(
        output_dir=str(Path(args.checkpoint_dir).resolve() / args.run_name),
        max_steps=args.steps,
        save_steps=args.save_every,
        per_device_train_batch_size=8,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Tokens(),
        # Opens the run, reports each checkpoint-N/ once the Trainer has written it all.
        callbacks=[LifeboatHFCallback(key=args.run_name, resumed_from=resumed_from)],
    )
    trainer.train(resume_from_checkpoint=path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
