"""Time to recover a checkpoint from S3, beside plain boto3 + torch.load in the same run.

    .venv/bin/python bench/restore.py                 # a 1 GiB torch checkpoint, 3 rounds
    .venv/bin/python bench/restore.py --size-mib 256 --rounds 5
    .venv/bin/python bench/restore.py --shape dcp     # a DCP folder saved by 8 gloo ranks

Setup: a torch checkpoint of --size-mib MiB (a state dict of 64 MiB float32 tensors) is
written, recorded as a verified checkpoint (on a scratch SQLite) and replicated to the
S3 server at :8333 (S3_ENDPOINT_URL) by the real replicate task. Then, alternated round
by round:

  boto3      client.download_file(bucket, key, path) of the replica's object, then
             torch.load(path, weights_only=True): no checksum, nothing else. With
             --shape dcp (bench/corpus.py: .metadata and 8 .distcp shards), every object
             downloaded at once (TransferManager, 10 threads), then DCP's own loader in
             this process (no process group)
  lifeboat   a restore test as the restore worker runs it (webapp/domain/recovery/restore_test.py):
             the manifest read, every file downloaded and its sha256 checked in the same
             pass, the load in a child process (weights_only), every tensor moved to the
             device (the GPU when there is one), timings written to the database

The rounds measure a warm restore worker: its loader (restore_load --serve) has imported
torch already, as it has once the worker has started (worker_process_init) or has run one
restore test, and each load runs in a child forked from it. Before them, one cold round
(with its own boto3 round) measures a restore test that has to start the loader itself;
it is printed apart and is not in the medians.

The page cache is dropped of the downloaded file between phases (it is deleted). Target
(issue #6): lifeboat (warm) <= 1.3x boto3's time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MiB = 1024 * 1024


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--shape", choices=("torch", "dcp"), default="torch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    return parser.parse_args()


def configure(args: argparse.Namespace, work: Path) -> None:
    """The S3 settings and scratch folder, then Django on a scratch SQLite under work."""
    os.environ.setdefault("S3_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("S3_SECRET_ACCESS_KEY", "bench-secret")
    os.environ["S3_ENDPOINT_URL"] = args.endpoint
    # The targets made below name this endpoint; the outbound policy refuses loopback and
    # private endpoints unless the deployment allows them (webapp/domain/outbound.py).
    os.environ.setdefault("LIFEBOAT_OUTBOUND_ALLOW", urlsplit(args.endpoint).netloc)
    os.environ["LIFEBOAT_SCRATCH_DIR"] = str(work / "scratch")
    from bench.replicate import setup_django

    setup_django(work / "var")


def write_checkpoint(path: Path, size_mib: int) -> None:
    """A torch state dict of 64 MiB float32 tensors, size_mib MiB in all."""
    import torch

    print(f"writing a {size_mib} MiB torch checkpoint ...", flush=True)
    generator = torch.Generator().manual_seed(0)
    state = {
        f"layer{i}.weight": torch.randn(16 * MiB, generator=generator)
        for i in range(max(1, size_mib // 64))
    }
    torch.save(state, path)


def record_and_replicate(work: Path, location: Path, files: list[dict], bucket: str, endpoint):
    """The checkpoint at `location` (its files: path, size, sha256) recorded as verified
    and replicated by the real task; returns the checkpoint and each file's object key
    by path, or None when the replication failed."""
    from webapp.domain.models import (
        Checkpoint,
        CheckpointFile,
        Project,
        Replica,
        Run,
        StorageTarget,
    )
    from workers.replicate import replicate

    project = Project.objects.create(name="bench", slug="bench", allowed_roots=[str(work)])
    run = Run.objects.create(project=project, key="bench")
    checkpoint = Checkpoint.objects.create(
        project=project, run=run, step=1, location=str(location),
        total_size=sum(f["size"] for f in files), file_count=len(files), status="verified",
    )  # fmt: skip
    CheckpointFile.objects.bulk_create(
        CheckpointFile(checkpoint=checkpoint, path=f["path"], size=f["size"], sha256=f["sha256"])
        for f in files
    )
    target = StorageTarget.objects.create(
        project=project, name="bench", bucket=bucket, prefix="restore", endpoint_url=endpoint
    )
    replica = Replica.objects.create(checkpoint=checkpoint, target=target)
    print(f"replicating {len(files):,} file(s) ...", flush=True)
    started = time.perf_counter()
    if replicate(replica.pk) != "verified":
        replica.refresh_from_db()
        print(f"replication failed: {replica.last_error}")
        return None
    print(f"  replicated in {time.perf_counter() - started:.1f} s", flush=True)
    replica.refresh_from_db()
    # Objects are named by their content (<blobs>/ab/abcd...), as every replica's are.
    return checkpoint, {entry["path"]: entry["key"] for entry in replica.files}


def boto3_round(client, bucket: str, keys: dict[str, str], work: Path) -> float:
    """Every object downloaded (no checksum), then loaded: torch.load of the one file, or
    DCP's loader of the folder."""
    import torch
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    folder = work / "boto3"
    folder.mkdir(exist_ok=True)
    start = time.perf_counter()
    if len(keys) == 1:
        ((path, key),) = keys.items()
        client.download_file(bucket, key, str(folder / path))
        loaded = torch.load(folder / path, weights_only=True)
    else:
        config = TransferConfig(max_concurrency=10, multipart_chunksize=8 * MiB)
        with TransferManager(client, config) as manager:
            for path, key in keys.items():
                manager.download(bucket, key, str(folder / path))
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

        loaded = _load_state_dict_from_keys(checkpoint_id=str(folder))
    elapsed = time.perf_counter() - start
    del loaded
    shutil.rmtree(folder)
    return elapsed


def lifeboat_round(checkpoint) -> tuple[float, dict]:
    from webapp.domain.models import Validation
    from webapp.domain.recovery import restore_test

    validation = Validation.objects.create(checkpoint=checkpoint, kind="restore")
    start = time.perf_counter()
    outcome = restore_test.run(validation.pk)
    elapsed = time.perf_counter() - start
    validation.refresh_from_db()
    if outcome != "passed":
        raise SystemExit(f"the restore test did not pass: {validation.message}")
    return elapsed, {**validation.timings, "wall_s": elapsed, "device": validation.device}


@dataclass
class Rounds:
    boto3: list[float] = field(default_factory=list)
    lifeboat: list[float] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)  # each warm restore test's timings
    cold_boto3: float = 0.0
    cold: float = 0.0


def run_rounds(args, client, bucket: str, keys: dict, work: Path, checkpoint) -> Rounds:
    """One cold round (the restore test starts the loader), then the warm rounds."""
    from webapp.domain.recovery import restore_test
    from webapp.domain.validation.inspector import warm_helper

    rounds = Rounds()
    # Cold: no loader yet, so this restore test starts it (and imports torch).
    warm_helper(restore_test.LOADER_MODULE).stop()
    cold_boto3 = boto3_round(client, bucket, keys, work)
    cold, cold_timings = lifeboat_round(checkpoint)
    rounds.cold_boto3, rounds.cold = cold_boto3, cold
    print(f"cold round: boto3 {cold_boto3:.2f} s, lifeboat {cold:.2f} s "
          f"({cold / cold_boto3:.2f}x; load phase {cold_timings['load_s']:.2f} s, "
          f"total_s {cold_timings['total_s']:.2f} s)", flush=True)  # fmt: skip
    for round_ in range(args.rounds):
        rounds.boto3.append(boto3_round(client, bucket, keys, work))
        elapsed, timings = lifeboat_round(checkpoint)
        rounds.lifeboat.append(elapsed)
        rounds.phases.append(timings)
        print(
            f"round {round_ + 1}: boto3 {rounds.boto3[-1]:.2f} s, lifeboat "
            f"{elapsed:.2f} s ({timings['device']}, warm loader)",
            flush=True,
        )
    return rounds


def remove_bucket(client, bucket: str) -> None:
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=item["Key"])
        client.delete_bucket(Bucket=bucket)
    except Exception as exc:  # noqa: BLE001
        print(f"(could not remove the bench bucket: {exc})")


def print_results(args, size: int, rounds: Rounds, load_before, load_after) -> None:
    boto3_s = statistics.median(rounds.boto3)
    lifeboat_s = statistics.median(rounds.lifeboat)
    cold, cold_boto3, phases = rounds.cold, rounds.cold_boto3, rounds.phases
    print()
    print(f"{size / MiB:.0f} MiB {args.shape} checkpoint, {args.rounds} rounds, "
          f"S3 at {args.endpoint}, "
          f"{os.cpu_count()} CPUs; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after")  # fmt: skip
    print(f"{'':34} {'median s':>9} {'MiB/s':>7} {'x boto3':>8}")
    print(f"{'boto3 download + load':34} {boto3_s:9.2f} {size / MiB / boto3_s:7.0f} "
          f"{1.0:8.2f}")  # fmt: skip
    print(f"{'lifeboat restore test (warm)':34} {lifeboat_s:9.2f} "
          f"{size / MiB / lifeboat_s:7.0f} {lifeboat_s / boto3_s:8.2f}")  # fmt: skip
    for name in ("download_verify_s", "load_s", "to_device_s"):
        print(f"  {name:32} {statistics.median(p[name] for p in phases):9.2f}")
    # What the phases leave out: the manifest read and URLs before the download, the
    # fork of the load child and its answer, and the records written after it.
    rest = [p["wall_s"] - p["download_verify_s"] - p["load_s"] - p["to_device_s"] for p in phases]
    print(f"  {'rest (manifest, fork, records)':32} {statistics.median(rest):9.2f}")
    print(f"{'lifeboat restore test (cold)':34} {cold:9.2f} {size / MiB / cold:7.0f} "
          f"{cold / cold_boto3:8.2f}   (one round: the test starts the loader; "
          f"boto3 {cold_boto3:.2f} s beside it)")  # fmt: skip
    print("target: lifeboat (warm) <= 1.3x boto3's time")


def scratch_and_bucket(args, name: str):
    """A scratch folder under var/ (Django set up on a SQLite in it) and a new bucket on
    the S3 server: (folder, boto3 client, bucket). Both are the caller's to remove."""
    from bench.replicate import s3_client

    bucket = f"bench-{name}-{uuid.uuid4().hex[:6]}"
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"lifeboat-bench-{name}-", dir=ROOT / "var"))
    configure(args, work)
    client = s3_client(args.endpoint)
    client.create_bucket(Bucket=bucket)
    return work, client, bucket


def main() -> int:
    args = parse_args()
    work, client, bucket = scratch_and_bucket(args, "restore")
    directory = work / "ckpt"
    directory.mkdir()
    if args.shape == "dcp":
        import bench.corpus as corpus

        print(f"writing a {args.size_mib} MiB DCP checkpoint (8 ranks) ...", flush=True)
        location = corpus.write("dcp", directory, args.size_mib * MiB, ranks=8)
        files = corpus.manifest(location)
    else:
        location = directory / "model.pt"
        write_checkpoint(location, args.size_mib)
        from lifeboat.download import sha256_of

        files = [{"path": location.name, "size": location.stat().st_size,
                  "sha256": sha256_of(location)}]  # fmt: skip
    size = sum(f["size"] for f in files)
    recorded = record_and_replicate(work, location, files, bucket, args.endpoint)
    if recorded is None:
        return 1
    checkpoint, keys = recorded
    load_before = os.getloadavg()
    try:
        rounds = run_rounds(args, client, bucket, keys, work, checkpoint)
    finally:
        remove_bucket(client, bucket)
        shutil.rmtree(work, ignore_errors=True)
    print_results(args, size, rounds, load_before, os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
