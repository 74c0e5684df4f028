"""Replication throughput of a whole checkpoint folder, beside boto3's TransferManager
(s3transfer) with tuned concurrency and `rclone copy` with its best --transfers, over
the same tree, to the same S3 server, in the same run.

    .venv/bin/python bench/replicate.py                         # hf8 1 GiB + 10,000 files
    .venv/bin/python bench/replicate.py --shape hf8 --total 2GiB --rounds 3
    .venv/bin/python bench/replicate.py --shape many_files --many-total 256MiB
    .venv/bin/python bench/replicate.py --size-mib 256 --rounds 5   # one file
    S3_ENDPOINT_URL=http://host:9000 .venv/bin/python bench/replicate.py

Trees (bench/corpus.py): `hf8`, a Hugging Face folder of 8 safetensors shards with its
index; `many_files`, 10,000 small safetensors files in 100 folders; `single`, one file.
Phases, alternated round by round over the same tree (warm in the page cache, as it is
when a worker copies a checkpoint the job has just written and validation has read):

  boto3 xN    s3transfer.TransferManager(TransferConfig(max_concurrency=N, 16 MiB
              parts)): every file submitted at once, then waited for; no sha256
  rclone xN   `rclone copy <tree> bench:<bucket>/<prefix> --transfers N` (its default
              --checkers 8, 5 MiB parts; an S3 remote set by RCLONE_CONFIG_BENCH_*)
  lifeboat    the replicate task as a worker runs it (workers.replicate.replicate, with
              its database writes on a scratch SQLite): sha256 of every file in the same
              pass as the upload, a CRC32 on every part checked by the server, a HEAD of
              every object before it is sent (deduplication), the manifest last

  lifeboat/N  (--split N) the tree's files cut into N checkpoints, replicated at once by N
              processes, each running the replicate task on its share: what a replica
              spread over N worker processes could reach at best (not how Lifeboat
              sends one replica, which is one task in one process)

Each phase writes under a fresh prefix (nothing is skipped as already there) and the
prefix is deleted after. Target (issue #20): lifeboat >= 0.9x the best baseline.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MiB = 1024 * 1024


def setup_django(var: Path) -> None:
    os.environ.update(
        DEBUG="1", LIFEBOAT_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="webapp.settings"
    )
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def start_bench(name: str, endpoint: str, bucket: str):
    """A scratch folder under var/ with Django on a SQLite of its own, and the bench's
    bucket on the S3 server at `endpoint`: (the folder, a boto3 client)."""
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"lifeboat-bench-{name}-", dir=ROOT / "var"))
    os.environ.setdefault("S3_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("S3_SECRET_ACCESS_KEY", "bench-secret")
    os.environ["S3_ENDPOINT_URL"] = endpoint
    # The targets made name this endpoint; the outbound policy refuses loopback and
    # private endpoints unless the deployment allows them (webapp/domain/outbound.py).
    os.environ.setdefault("LIFEBOAT_OUTBOUND_ALLOW", urlsplit(endpoint).netloc)
    setup_django(work / "var")
    client = s3_client(endpoint)
    client.create_bucket(Bucket=bucket)
    return work, client


def end_bench(work: Path, client, bucket: str) -> None:
    """Remove what start_bench made: the bucket and its objects, the scratch folder."""
    try:
        delete_prefix(client, bucket, "")
        client.delete_bucket(Bucket=bucket)
    except Exception as exc:  # noqa: BLE001
        print(f"(could not remove the bench bucket: {exc})")
    shutil.rmtree(work, ignore_errors=True)


def s3_client(endpoint: str):
    """A plain boto3 client of the bench's S3 server (the baselines' and the setup's), with
    connections enough for the baselines' threads."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=os.environ["S3_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["S3_SECRET_ACCESS_KEY"],
        config=Config(max_pool_connections=64),
    )  # fmt: skip


def rclone_env(endpoint: str) -> dict[str, str]:
    """rclone's remote `bench:` for the bench's S3 server, set by variables (no config file)."""
    env = {
        **os.environ,
        "RCLONE_CONFIG_BENCH_TYPE": "s3",
        "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
        "RCLONE_CONFIG_BENCH_ENDPOINT": endpoint,
        "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": os.environ["S3_ACCESS_KEY_ID"],
        "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": os.environ["S3_SECRET_ACCESS_KEY"],
        "RCLONE_CONFIG_BENCH_REGION": "us-east-1",
    }
    # rclone cannot load a custom CA bundle into its transport, and the endpoint is http.
    env.pop("AWS_CA_BUNDLE", None)
    return env


def delete_prefix(client, bucket: str, prefix: str) -> None:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def make_tree(shape: str, root: Path, total: int) -> Path:
    import corpus

    if shape == "hf8":
        return corpus.write("hf", root, total, shards=8)
    return corpus.write(shape, root, total)


def boto3_phase(client, bucket, prefix, location: Path, files, concurrency: int) -> None:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    config = TransferConfig(
        max_concurrency=concurrency, multipart_chunksize=16 * MiB, multipart_threshold=16 * MiB
    )
    with TransferManager(client, config) as manager:
        futures = [
            manager.upload(str(location / f["path"]), bucket, f"{prefix}/{f['path']}")
            for f in files
        ]
        for future in futures:
            future.result()


def rclone_phase(endpoint, bucket, prefix, location: Path, transfers: int) -> None:
    env = rclone_env(endpoint)
    subprocess.run(
        ["rclone", "copy", str(location), f"bench:{bucket}/{prefix}", "--transfers",
         str(transfers), "--s3-no-check-bucket", "--config", "/dev/null"],
        env=env, check=True,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", choices=("hf8", "many_files", "single"))
    parser.add_argument("--total", default="1GiB", help="bytes per tree (hf8, single)")
    parser.add_argument("--many-total", default="160MiB", help="bytes of the many_files tree")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--size-mib", type=int, help="one file of this many MiB (the shape `single`)"
    )
    parser.add_argument("--boto3", default="10,32", help="TransferManager concurrencies")
    parser.add_argument("--rclone", default="4,16,32", help="rclone --transfers values")
    parser.add_argument(
        "--split", default="", help="also lifeboat/N: the files in N replicas at once (2,3)"
    )
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    parser.add_argument("--bucket", default=f"bench-replicate-{uuid.uuid4().hex[:6]}")
    args = parser.parse_args()
    import corpus

    if args.size_mib:
        args.shape, args.total = args.shape or ["single"], f"{args.size_mib}MiB"
    shapes = args.shape or ["hf8", "many_files"]
    work, client = start_bench("replicate", args.endpoint, args.bucket)
    try:
        for shape in shapes:
            total = corpus.parse_size(args.many_total if shape == "many_files" else args.total)
            print(f"writing {shape} ({total / MiB:,.0f} MiB) ...", flush=True)
            location = make_tree(shape, work / "trees" / shape, total)
            files = corpus.manifest(location)
            if location.is_file():
                location = location.parent
            report(shape, measure(args, client, location, files), files, args)
            shutil.rmtree(work / "trees" / shape, ignore_errors=True)
    finally:
        end_bench(work, client, args.bucket)
    return 0


def measure(args, client, location: Path, files: list[dict]) -> dict[str, list[float]]:
    from django.conf import settings

    from webapp.domain.models import Project, Replica, Run
    from workers.replicate import replicate

    project, _ = Project.objects.get_or_create(
        slug="bench", defaults={"name": "bench", "allowed_roots": [str(location.parent)]}
    )
    project.allowed_roots = [str(location.parent)]
    project.save()
    run, _ = Run.objects.get_or_create(project=project, key="bench")
    # An empty list (--boto3 "") leaves that baseline out.
    phases = [f"boto3 x{n}" for n in args.boto3.split(",") if n]
    phases += [f"rclone x{n}" for n in args.rclone.split(",") if n]
    phases.append("lifeboat")
    phases += [f"lifeboat/{n}" for n in args.split.split(",") if n]
    results: dict[str, list[float]] = {name: [] for name in phases}
    size = sum(f["size"] for f in files)
    for round_ in range(args.rounds):
        # Alternated: odd rounds run the phases in reverse order.
        for name in phases if round_ % 2 == 0 else phases[::-1]:
            prefix = f"{uuid.uuid4().hex[:8]}"
            start = time.perf_counter()
            if name.startswith("boto3"):
                n = int(name.split("x")[1])
                boto3_phase(client, args.bucket, prefix, location, files, n)
            elif name.startswith("rclone"):
                n = int(name.split("x")[1])
                rclone_phase(args.endpoint, args.bucket, prefix, location, n)
            elif name.startswith("lifeboat/"):
                n = int(name.split("/")[1])
                shares = [files[i * len(files) // n : (i + 1) * len(files) // n] for i in range(n)]
                replicas = [
                    record(project, run, location, share, args, f"{prefix}-{i}")
                    for i, share in enumerate(shares)
                ]
                start = time.perf_counter()
                replicate_at_once(replicas)
            else:
                replica_id = record(project, run, location, files, args, prefix)
                start = time.perf_counter()
                outcome = replicate(replica_id)
                if outcome != "verified":
                    error = Replica.objects.get(pk=replica_id).last_error
                    raise SystemExit(f"replication did not verify: {error}")
            results[name].append(time.perf_counter() - start)
            delete_prefix(client, args.bucket, prefix)  # and prefix-0/, prefix-1/...
        print(
            f"round {round_ + 1}: "
            + ", ".join(
                f"{k} {size / MiB / v[-1]:.1f} MiB/s ({len(files) / v[-1]:.0f} files/s)"
                for k, v in results.items()
            ),
            flush=True,
        )
    print(
        f"lifeboat: {settings.REPLICATION_FILES_AT_ONCE} files at once, parts of "
        f"{settings.REPLICATION_PART_SIZE // MiB} MiB, {settings.REPLICATION_CONCURRENCY} "
        "parts in memory at most"
    )
    return results


def record(project, run, location: Path, files: list[dict], args, prefix: str) -> int:
    """`files` of `location` as a verified checkpoint with a replica to make; its id."""
    from webapp.domain.models import Checkpoint, CheckpointFile, Replica, StorageTarget

    checkpoint = Checkpoint.objects.create(
        project=project, run=run, step=Checkpoint.objects.count() + 1, location=str(location),
        total_size=sum(f["size"] for f in files), file_count=len(files), status="verified",
    )  # fmt: skip
    CheckpointFile.objects.bulk_create(CheckpointFile(checkpoint=checkpoint, **f) for f in files)
    target = StorageTarget.objects.create(
        project=project, name=prefix, bucket=args.bucket, prefix=prefix,
        endpoint_url=args.endpoint,
    )  # fmt: skip
    return Replica.objects.create(checkpoint=checkpoint, target=target).pk


def _replicate_in_child(replica_id: int) -> str:
    from django.db import connections

    connections.close_all()  # the parent's, inherited by the fork: never used here
    from workers.replicate import replicate

    return str(replicate(replica_id))


def replicate_at_once(replica_ids: list[int]) -> None:
    import multiprocessing

    from django.db import connections

    connections.close_all()
    with multiprocessing.get_context("fork").Pool(len(replica_ids)) as pool:
        outcomes = pool.map(_replicate_in_child, replica_ids)
    if set(outcomes) != {"verified"}:
        raise SystemExit(f"replication did not verify: {outcomes}")


def report(shape: str, results: dict[str, list[float]], files: list[dict], args) -> None:
    size = sum(f["size"] for f in files)
    best = {name: min(times) for name, times in results.items()}
    # --boto3 "" --rclone "" leaves no baseline: lifeboat alone, compared with itself.
    baseline = min((n for n in best if n != "lifeboat"), key=best.get, default="lifeboat")
    load = os.getloadavg()[0]
    print()
    print(f"{shape}: {len(files):,} files, {size / MiB:,.0f} MiB, {args.rounds} rounds, "
          f"S3 at {args.endpoint}, {os.cpu_count()} CPUs, load average {load:.2f}")  # fmt: skip
    print(f"{'':14} {'best s':>8} {'median s':>9} {'MiB/s':>7} {'files/s':>8} {'x best':>7}")
    for name, times in results.items():
        print(
            f"{name:14} {best[name]:8.2f} {statistics.median(times):9.2f} "
            f"{size / MiB / best[name]:7.0f} {len(files) / best[name]:8.0f} "
            f"{best[baseline] / best[name]:7.2f}"
        )
    print(f"best baseline: {baseline}; target: lifeboat >= 0.9x it", flush=True)


if __name__ == "__main__":
    sys.exit(main())
