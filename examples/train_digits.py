"""A real training job watched by Lifeboat: a small CNN on scikit-learn's bundled digits
(8x8 images of handwritten digits; nothing is downloaded).

It checkpoints every epoch through the client (an atomic save, timed and reported with
the epoch's metrics), sends its per-step loss, can crash on purpose, and resumes from
the newest *verified* checkpoint that Lifeboat knows of:

    export LIFEBOAT_URL=http://127.0.0.1:8000 LIFEBOAT_TOKEN=lb_...   # from `make run`
    python examples/train_digits.py --run digits --crash-at-step 100  # dies at step 100
    python examples/train_digits.py --run digits --resume             # back from the last
                                                                      # verified epoch

A resume started by Lifeboat (a launch profile) passes the chosen checkpoint in
LIFEBOAT_CHECKPOINT, which --resume-from reads by default.

Training is deterministic (seeded, the data order of each epoch drawn from the epoch
number), so a resumed run repeats exactly the losses the first one reported for the
same steps; Lifeboat's replay check relies on that.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import lifeboat  # noqa: E402
import lifeboat.torch  # noqa: E402
from lifeboat.restore import latest_info  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x):
        return self.head(self.features(x))


def data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def build(seed: int):
    torch.manual_seed(seed)
    model = DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The order of an epoch depends only on the seed and the epoch: a resumed run sees
    the same batches as the original did."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))


def train_step(model, optimizer, x, y) -> float:
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def evaluate(model, x, y) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(1) == y).float().mean().item()
    model.train()
    return loss, accuracy


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default=os.environ.get("LIFEBOAT_RUN", "digits"))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint-dir",
        default=str(ROOT / "var" / "checkpoints"),
        help="under an allowed root of the project (make run's demo: var/checkpoints)",
    )
    parser.add_argument("--crash-at-step", type=int, help="raise an error at this step")
    parser.add_argument("--kill-at-step", type=int, help="SIGKILL itself at this step")
    parser.add_argument("--resume", action="store_true", help="start from lifeboat.latest")
    parser.add_argument(
        "--resume-from",
        default=os.environ.get("LIFEBOAT_CHECKPOINT"),
        help="start from this checkpoint file (a Lifeboat resume sets LIFEBOAT_CHECKPOINT)",
    )
    return parser.parse_args(argv)


def resume(args, model, optimizer) -> tuple[int, int | None]:
    """Load the model and optimizer state in place from the checkpoint asked for, if any.
    Returns the epoch to start at and, for a resume from lifeboat.latest, the id of that
    checkpoint (the new run records it as resumed_from)."""
    start_epoch, resumed_from = 0, None
    if args.resume_from:
        state = torch.load(args.resume_from, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
        print(
            f"resumed from {args.resume_from} (epoch {state['epoch']}, step {state['step']})",
            flush=True,
        )
    elif args.resume:
        try:
            path = lifeboat.latest(args.run)
            info = latest_info(args.run, lifeboat.Config.resolve())
        except lifeboat.LatestError as exc:
            print(f"no checkpoint to resume from ({exc}); starting afresh", flush=True)
        else:
            state = torch.load(path, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch, resumed_from = state["epoch"] + 1, info["id"]
            print(f"resumed from {path} (epoch {state['epoch']}, step {state['step']})", flush=True)
    return start_epoch, resumed_from


def main(argv=None) -> int:
    args = parse_args(argv)
    (x_train, y_train), (x_val, y_val) = data(args.seed)
    model, optimizer = build(args.seed)
    start_epoch, resumed_from = resume(args, model, optimizer)

    steps_per_epoch = (len(x_train) + args.batch_size - 1) // args.batch_size
    directory = Path(args.checkpoint_dir) / args.run
    with lifeboat.Run(
        args.run,
        name="digits CNN",
        framework=f"torch {torch.__version__}",
        config=vars(args),
        tags=["example"],
        resumed_from=resumed_from,
        expected_interval_s=60,
    ) as run:
        step = start_epoch * steps_per_epoch
        for epoch in range(start_epoch, args.epochs):
            started = time.perf_counter()
            order = epoch_order(len(x_train), args.seed, epoch)
            for first in range(0, len(x_train), args.batch_size):
                index = order[first : first + args.batch_size]
                loss = train_step(model, optimizer, x_train[index], y_train[index])
                step += 1
                run.log(step, loss=loss)
                if step == args.crash_at_step:
                    raise RuntimeError(f"crashing on purpose at step {step} (--crash-at-step)")
                if step == args.kill_at_step:
                    os.kill(os.getpid(), signal.SIGKILL)
            val_loss, accuracy = evaluate(model, x_val, y_val)
            lifeboat.torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "step": step,
                },
                directory / f"epoch-{epoch:03d}-step-{step}.pt",
                step=step,
                epoch=epoch,
                metrics={"loss": loss, "val_loss": val_loss, "val_accuracy": accuracy},
            )
            print(
                f"epoch {epoch}  step {step}  loss {loss:.4f}  val_loss {val_loss:.4f}  "
                f"val_accuracy {accuracy:.3f}  ({time.perf_counter() - started:.2f} s)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
