"""DeepSpeed (ZeRO stage 1) watched by Lifeboat (docs/integrations/deepspeed.md). Every
rank writes its part of the checkpoint; rank 0 reports the tag's folder.

    torchrun --standalone --nproc-per-node 2 examples/deepspeed_zero.py --run-name deepspeed-demo
    # on CPU: DS_ACCELERATOR=cpu
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import lifeboat  # noqa: E402
from lifeboat.restore import latest_info  # noqa: E402

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 64,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 1},
    "zero_allow_untested_optimizer": True,  # a plain torch optimizer, for the example
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-name", default=os.environ.get("LIFEBOAT_RUN", "deepspeed-demo"))
    parser.add_argument("--checkpoint-dir", default="var/checkpoints")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()

    deepspeed.init_distributed()  # gloo on CPU, nccl on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        config=DS_CONFIG,
    )
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
        path, resumed_from = Path(found[0][0]), found[0][1]
        _, client_state = engine.load_checkpoint(str(path.parent), tag=path.name)
        start = client_state["step"]
        if rank == 0:
            print(f"resumed from {path} (step {start})", flush=True)

    folder = Path(args.checkpoint_dir).resolve() / args.run_name
    # On ranks other than 0 the run is disabled: every call is a no-op.
    with lifeboat.Run(
        args.run_name,
        framework=f"deepspeed {deepspeed.__version__}",
        world_size=world,
        resumed_from=resumed_from,
    ) as run:
        for step in range(start + 1, args.steps + 1):
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            run.log(step, loss=loss.item())
            if step % args.save_every == 0:
                tag = f"step-{step:06d}"
                run.checkpoint_started(step)
                # Collective: every rank writes its files under folder/tag/.
                engine.save_checkpoint(str(folder), tag=tag, client_state={"step": step})
                dist.barrier()  # every rank's files are written
                run.checkpoint(folder / tag, step=step, metrics={"loss": loss.item()})
                if rank == 0:
                    print(f"step {step}: saved {folder / tag}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
