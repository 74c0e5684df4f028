"""DistributedDataParallel under torchrun, watched by Lifeboat
(docs/integrations/ddp.md). Rank 0 saves and reports; every rank resumes from the same
verified checkpoint.

    torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py --run-name ddp-demo
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import lifeboat  # noqa: E402
import lifeboat.torch  # noqa: E402
from lifeboat.restore import latest_info  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-name", default=os.environ.get("LIFEBOAT_RUN", "ddp-demo"))
    parser.add_argument("--checkpoint-dir", default="var/checkpoints")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # "nccl" on GPUs
    try:
        return train(args)
    finally:
        # The model's hooks hold the process group: free them (train's frame is gone,
        # its cycles go now) before the group is destroyed, while the interpreter is
        # whole. Left to the interpreter's exit, gloo's teardown aborted about 1 run
        # in 50 with torch 2.13 ("terminate called without an active exception").
        gc.collect()
        dist.destroy_process_group()


def train(args) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))[rank::world]
    y = x.sum(dim=1, keepdim=True)

    # Rank 0 asks Lifeboat for the newest verified checkpoint; every rank loads it.
    found = [None]
    if rank == 0:
        try:
            checkpoint = latest_info(args.run_name, lifeboat.Config.resolve())
            found = [(str(lifeboat.latest(args.run_name)), checkpoint["id"])]
        except lifeboat.LatestError as exc:
            print(f"starting afresh: {exc}", flush=True)
    dist.broadcast_object_list(found, src=0)
    start, resumed_from = 0, None
    if found[0] is not None:
        path, resumed_from = found[0]
        state = torch.load(path, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        if rank == 0:
            print(f"resumed from {path} (step {start})", flush=True)

    folder = Path(args.checkpoint_dir).resolve() / args.run_name
    # On ranks other than 0 the run is disabled: every call is a no-op.
    with lifeboat.Run(
        args.run_name,
        framework=f"torch {torch.__version__} ddp",
        world_size=world,
        resumed_from=resumed_from,
    ) as run:
        for step in range(start + 1, args.steps + 1):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # DDP averages the gradients of all ranks here
            optimizer.step()
            run.log(step, loss=loss.item())
            if step % args.save_every == 0:
                if rank == 0:  # the replicas are identical: one copy is the checkpoint
                    lifeboat.torch.save(
                        {
                            "model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "step": step,
                        },
                        folder / f"step-{step:06d}.pt",
                        step=step,
                        metrics={"loss": loss.item()},
                    )
                    print(f"step {step}: saved", flush=True)
                dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
