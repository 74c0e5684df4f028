"""Restore of a many-file checkpoint from S3, beside rclone and boto3 in the same run.

    .venv/bin/python bench/restore_many.py                     # 10,000 files, 40 MiB, 3 rounds
    .venv/bin/python bench/restore_many.py --files 2000 --total 8MiB --rounds 1

Setup: the `many_files` tree of bench/corpus.py (--files safetensors files in folders of
100, --total bytes in all) is written, recorded as a verified checkpoint (on a scratch
SQLite) and replicated by the real replicate task to the S3 server at S3_ENDPOINT_URL
(default :8333). Then, alternated round by round, each into an empty folder:

  rclone xN  `rclone copy bench:<bucket>/baseline <folder> --transfers N` (each N of
             --rclone) of the same tree as rclone stores it (one object a file, under
             its path: uploaded once by rclone before the rounds, not timed), then every
             file loaded with safetensors.torch.load_file
  boto3 xN   s3transfer's TransferManager, max_concurrency N (each N of --boto3), of the
             same objects, then the same loads
  lifeboat   a restore test as the restore worker runs it (webapp/domain/recovery/
             restore_test.py): the manifest read and checked against the record, every
             file downloaded with its sha256 checked in the same pass, every file loaded
             in a child forked from the warm loader, timings written to the database

The baselines check no byte; the restore test checks every one. The figure is the
restore test's median beside the best baseline's. No target is set for this shape (the
single-file restore test's is <= 1.3x boto3); the phases say where the time goes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
MiB = 1024 * 1024


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--total", default="40MiB", help="bytes of the tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rclone", default="16,32", help="rclone --transfers values")
    parser.add_argument("--boto3", default="32", help="TransferManager concurrencies")
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    return parser.parse_args()


BASELINE = "baseline"  # where the tree is, one object a file, for rclone and boto3


def load_all(paths: list[Path]) -> None:
    from safetensors.torch import load_file

    for path in paths:
        load_file(str(path))


def rclone_round(args, bucket: str, keys: dict[str, str], folder: Path, transfers: int) -> float:
    """The tree as rclone stored it (one object a file, under its path), then each loaded."""
    from bench.replicate import rclone_env

    env = rclone_env(args.endpoint)
    started = time.perf_counter()
    subprocess.run(
        ["rclone", "copy", f"bench:{bucket}/{BASELINE}", str(folder), "--transfers",
         str(transfers), "--config", "/dev/null"],
        env=env, check=True,
    )  # fmt: skip
    load_all([folder / path for path in keys])
    return time.perf_counter() - started


def boto3_round(client, bucket: str, keys: dict[str, str], folder: Path, concurrency: int) -> float:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    started = time.perf_counter()
    for sub in {(folder / path).parent for path in keys}:
        sub.mkdir(parents=True, exist_ok=True)
    config = TransferConfig(max_concurrency=concurrency)
    with TransferManager(client, config) as manager:
        futures = [manager.download(bucket, key, str(folder / path)) for path, key in keys.items()]
        for future in futures:
            future.result()
    load_all([folder / path for path in keys])
    return time.perf_counter() - started


def measure(args, client, bucket, keys, work, checkpoint) -> dict[str, list]:
    from bench.restore import lifeboat_round
    from webapp.domain.recovery import restore_test

    restore_test.start_warm_loader()  # a worker's loader is warm once it has started
    phases = [f"rclone x{n}" for n in args.rclone.split(",") if n]
    phases += [f"boto3 x{n}" for n in args.boto3.split(",") if n]
    results: dict[str, list] = {name: [] for name in [*phases, "lifeboat"]}
    results["lifeboat phases"] = []
    for round_ in range(args.rounds):
        for name in [*phases, "lifeboat"]:
            folder = work / "restored"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            n = int(name.rpartition("x")[2]) if name != "lifeboat" else 0
            if name.startswith("rclone"):
                seconds = rclone_round(args, bucket, keys, folder, n)
            elif name.startswith("boto3"):
                seconds = boto3_round(client, bucket, keys, folder, n)
            else:
                seconds, timings = lifeboat_round(checkpoint)
                results["lifeboat phases"].append(timings)
            results[name].append(seconds)
            print(f"round {round_ + 1}: {name:<10} {seconds:7.2f} s", flush=True)
        shutil.rmtree(work / "restored", ignore_errors=True)
    return results


def report(args, results: dict[str, list], files: list[dict], load_before) -> None:
    size = sum(f["size"] for f in files)
    medians = {k: statistics.median(v) for k, v in results.items() if k != "lifeboat phases"}
    baselines = {k: v for k, v in medians.items() if k != "lifeboat"}
    best = min(baselines, key=baselines.get)
    print()
    print(f"{len(files):,} files, {size / MiB:,.1f} MiB, {args.rounds} rounds, S3 at "
          f"{args.endpoint}, {os.cpu_count()} CPUs; load average {load_before[0]:.2f} "
          f"before, {os.getloadavg()[0]:.2f} after")  # fmt: skip
    print(f"{'':40} {'median s':>9} {'files/s':>8} {'x best':>7}")
    for name, seconds in medians.items():
        what = "download + load each" if name != "lifeboat" else "restore test (warm loader)"
        print(f"{name + ', ' + what:40} {seconds:9.2f} {len(files) / seconds:8.0f} "
              f"{seconds / baselines[best]:7.2f}")  # fmt: skip
    phases = results["lifeboat phases"]
    for key in ("download_verify_s", "load_s"):
        print(f"  {key:38} {statistics.median(p[key] for p in phases):9.2f}")
    rest = [p["wall_s"] - p["download_verify_s"] - p["load_s"] for p in phases]
    print(f"  {'rest (manifest, records, scratch)':38} {statistics.median(rest):9.2f}")
    print(f"best baseline: {best}; lifeboat / best = {medians['lifeboat'] / baselines[best]:.2f}x"
          " (no target for this shape)")  # fmt: skip


def main() -> int:
    args = parse_args()
    import corpus

    from bench.restore import record_and_replicate, remove_bucket, scratch_and_bucket

    work, client, bucket = scratch_and_bucket(args, "restore-many")
    try:
        total = corpus.parse_size(args.total)
        print(f"writing {args.files:,} files, {total / MiB:,.0f} MiB ...", flush=True)
        location = corpus.write("many_files", work / "tree", total, files=args.files)
        files = corpus.manifest(location)
        recorded = record_and_replicate(work, location, files, bucket, args.endpoint)
        if recorded is None:
            return 1
        checkpoint, _ = recorded
        # The baselines' copy of the tree: one object a file, as rclone stores it.
        from bench.replicate import rclone_phase

        rclone_phase(args.endpoint, bucket, BASELINE, location, 32)
        keys = {f["path"]: f"{BASELINE}/{f['path']}" for f in files}
        load_before = os.getloadavg()
        results = measure(args, client, bucket, keys, work, checkpoint)
    finally:
        remove_bucket(client, bucket)
        shutil.rmtree(work, ignore_errors=True)
    report(args, results, files, load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
