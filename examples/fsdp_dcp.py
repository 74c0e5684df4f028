"""FSDP (fully_shard) with torch.distributed.checkpoint, watched by Lifeboat
(docs/integrations/fsdp.md). Every rank writes its shard; rank 0 reports the folder, or
with --report-parts every rank reports its own shard (lifeboat.Run(parts=True)).

    torchrun --standalone --nproc-per-node 2 examples/fsdp_dcp.py --run-name fsdp-demo
    torchrun --standalone --nproc-per-node 4 examples/fsdp_dcp.py --report-parts
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import lifeboat  # noqa: E402
from lifeboat.restore import latest_info  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-name", default=os.environ.get("LIFEBOAT_RUN", "fsdp-demo"))
    parser.add_argument("--checkpoint-dir", default="var/checkpoints")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--report-parts", action="store_true", help="every rank reports its shard")
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
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))[rank::world]
    y = x.sum(dim=1, keepdim=True)

    # Rank 0 asks Lifeboat for the newest verified checkpoint; every rank loads that one.
    found = [None]
    if rank == 0:
        try:
            checkpoint = latest_info(args.run_name, lifeboat.Config.resolve())
            # With parts each rank fetches its own share below; else rank 0 the whole.
            path = None if args.report_parts else str(lifeboat.latest(args.run_name))
            found = [(path, checkpoint["id"], checkpoint["step"])]
        except lifeboat.LatestError as exc:
            print(f"starting afresh: {exc}", flush=True)
    dist.broadcast_object_list(found, src=0)
    start, resumed_from = 0, None
    if found[0] is not None:
        path, resumed_from, start = found[0]
        if path is None:  # its own shards and .metadata, of the checkpoint rank 0 chose
            shared = lifeboat.latest(
                args.run_name, checkpoint=resumed_from, rank=rank, world_size=world
            )
            path = str(shared)
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=path)  # each rank reads its own shards
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        if rank == 0:
            print(f"resumed from {path} (step {start})", flush=True)

    folder = Path(args.checkpoint_dir).resolve() / args.run_name
    # On ranks other than 0 the run is disabled (every call is a no-op), unless
    # --report-parts: then each rank reports its own shards, and rank 0 alone the run.
    with lifeboat.Run(
        args.run_name,
        framework=f"torch {torch.__version__} fsdp",
        world_size=world,
        resumed_from=resumed_from,
        parts=args.report_parts,
    ) as run:
        for step in range(start + 1, args.steps + 1):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            run.log(step, loss=loss.item())
            if step % args.save_every == 0:
                model_state, optimizer_state = get_state_dict(model, optimizer)
                target = folder / f"step-{step:06d}"
                run.checkpoint_started(step)
                dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=target)
                # dcp.save returns on every rank once .metadata is written: complete.
                # With parts, each rank's report holds its __<rank>_*.distcp (and
                # .metadata on rank 0), which this rank hashes alone.
                run.checkpoint(target, step=step, metrics={"loss": loss.item()}, format="dcp")
                if rank == 0:
                    print(f"step {step}: saved {target}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
