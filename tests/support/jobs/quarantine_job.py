"""A training job for tests/test_quarantine.py, reporting to Lifeboat with the real client.

    python tests/support/jobs/quarantine_job.py --fresh CKPT_DIR
        saves steps 10 and 20, then dies [--then-wait] (or waits for a signal)
    python tests/support/jobs/quarantine_job.py --step N --bad B
        resumed from step N (as launched by a resume): dies right after loading when N
        is B (or B is "all"), else trains a step and ends (and then dies, with "later")

The run key, token, URL and the checkpoint it was resumed from come from the environment
a launch gives a job (LIFEBOAT_RUN, LIFEBOAT_TOKEN, LIFEBOAT_URL, LIFEBOAT_RESUMED_FROM).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run from a checkout

import lifeboat  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fresh", metavar="CKPT_DIR")
    parser.add_argument("--step", type=int)
    parser.add_argument("--bad", default="")
    parser.add_argument("--then-wait", action="store_true")
    args = parser.parse_args()
    with lifeboat.Run() as run:
        if args.fresh:
            for step in (10, 20):
                path = Path(args.fresh) / f"step-{step}.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"w": torch.full((4,), float(step))}, path)
                run.log(step, loss=1.0 / step)
                run.checkpoint(path, step=step).wait(30)
            if args.then_wait:  # until the scheduler's signal (run.preempted)
                print("saved, waiting", flush=True)
                time.sleep(300)
            raise RuntimeError("the node was lost")
        if args.bad in (str(args.step), "all"):
            raise FloatingPointError(f"loss is nan right after loading step {args.step}")
        run.log(args.step + 1, loss=0.5)
        if args.bad == "later":  # gets somewhere, then fails
            time.sleep(0.5)
            raise RuntimeError(f"the node was lost after step {args.step + 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
