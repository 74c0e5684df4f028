"""A plain PyTorch training loop watched by Lifeboat (docs/integrations/torch.md).

Run it twice with the same --run: the second start resumes from the newest checkpoint
Lifeboat has verified. It is also the training script of examples/slurm_job.sbatch.

    export LIFEBOAT_URL=http://127.0.0.1:8000 LIFEBOAT_TOKEN=lb_...
    python examples/torch_loop.py --run-name torch-demo --checkpoint-dir var/checkpoints
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import lifeboat  # noqa: E402
import lifeboat.torch  # noqa: E402
from lifeboat.restore import latest_info  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-name", default=os.environ.get("LIFEBOAT_RUN", "torch-demo"))
    parser.add_argument("--checkpoint-dir", default="var/checkpoints")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
    y = x.sum(dim=1, keepdim=True)

    # Resume from the newest checkpoint Lifeboat has verified, if the run has one.
    start, resumed_from = 0, None
    try:
        checkpoint = latest_info(args.run_name, lifeboat.Config.resolve())  # id, step, ...
        path = lifeboat.latest(args.run_name)  # a local path whose sha256 was checked
    except lifeboat.LatestError as exc:
        print(f"starting afresh: {exc}", flush=True)
    else:
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, resumed_from = state["step"], checkpoint["id"]
        print(f"resumed from {path} (step {start})", flush=True)

    folder = Path(args.checkpoint_dir).resolve() / args.run_name
    with lifeboat.Run(
        args.run_name,
        framework=f"torch {torch.__version__}",
        config=vars(args),
        resumed_from=resumed_from,
    ) as run:
        for step in range(start + 1, args.steps + 1):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            run.log(step, loss=loss.item())
            if step % args.save_every == 0:
                # Atomic (temporary file, fsync, rename), timed, reported and hashed.
                lifeboat.torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "step": step,
                    },
                    folder / f"step-{step:06d}.pt",
                    step=step,
                    metrics={"loss": loss.item()},
                )
                print(f"step {step}: saved, loss {loss.item():.4f}", flush=True)
            time.sleep(args.sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
