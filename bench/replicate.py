"""Replication throughput on a 1 GiB checkpoint, beside boto3's own upload_file of the
same file to the same S3 server in the same run.

    .venv/bin/python bench/replicate.py                    # 1 GiB, 3 rounds, :8333
    .venv/bin/python bench/replicate.py --size-mib 256 --rounds 5
    S3_ENDPOINT_URL=http://host:9000 .venv/bin/python bench/replicate.py

Phases, alternated round by round over the same file (warm in the page cache, as it is
when a worker copies a checkpoint the job has just written and validation has just read):

  boto3       boto3.client("s3").upload_file(path, bucket, key): its default
              TransferConfig (8 MiB parts, 10 threads), no sha256 of the whole file
  lifeboat    the replicate task as a worker runs it (workers.replicate.replicate, with
              its database writes on a scratch SQLite): sha256 of the whole file in the
              same pass, a SHA-256 checksum on every part checked by the server, the
              comparison with the recorded sha256, a HEAD of every object, the manifest

Each round writes under a fresh prefix (so nothing is skipped as already there) and
deletes what it wrote. Target (issue #5): lifeboat >= 0.9x boto3.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024


def make_file(path: Path, size_mib: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for _ in range(size_mib):
            block = os.urandom(MiB)
            digest.update(block)
            out.write(block)
    return digest.hexdigest()


def setup_django(var: Path) -> None:
    os.environ.update(
        DEBUG="1", LIFEBOAT_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="webapp.settings"
    )
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def delete_prefix(client, bucket: str, prefix: str) -> None:
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=item["Key"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    parser.add_argument("--bucket", default=f"bench-replicate-{uuid.uuid4().hex[:6]}")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lifeboat-bench-replicate-", dir=ROOT / "var"))
    os.environ.setdefault("S3_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("S3_SECRET_ACCESS_KEY", "bench-secret")
    os.environ["S3_ENDPOINT_URL"] = args.endpoint
    # The targets made below name this endpoint; the outbound policy refuses loopback and
    # private endpoints unless the deployment allows them (webapp/domain/outbound.py).
    os.environ.setdefault("LIFEBOAT_OUTBOUND_ALLOW", urlsplit(args.endpoint).netloc)
    setup_django(work / "var")

    import boto3

    from webapp.domain.models import (
        Checkpoint,
        CheckpointFile,
        Project,
        Replica,
        Run,
        StorageTarget,
    )
    from workers.replicate import replicate

    client = boto3.client(
        "s3",
        endpoint_url=args.endpoint,
        region_name="us-east-1",
        aws_access_key_id=os.environ["S3_ACCESS_KEY_ID"],
        aws_secret_access_key=os.environ["S3_SECRET_ACCESS_KEY"],
    )
    client.create_bucket(Bucket=args.bucket)
    directory = work / "ckpt"
    directory.mkdir()
    path = directory / "model.bin"
    print(f"writing a {args.size_mib} MiB file ...", flush=True)
    sha = make_file(path, args.size_mib)
    size = path.stat().st_size

    project = Project.objects.create(name="bench", slug="bench", allowed_roots=[str(work)])
    run = Run.objects.create(project=project, key="bench")
    load_before = os.getloadavg()
    from django.conf import settings

    phases = {"sha256 parts": "SHA256", "crc32 parts": "CRC32"}
    results: dict[str, list[float]] = {"boto3": [], **{name: [] for name in phases}}
    # CPU seconds of this process per phase: steadier than wall time on a busy machine.
    cpu: dict[str, list[float]] = {name: [] for name in results}

    def cpu_now() -> float:
        times = os.times()
        return times.user + times.system

    try:
        for round_ in range(args.rounds):
            prefix = f"r{round_}-{uuid.uuid4().hex[:6]}"
            start, cpu_start = time.perf_counter(), cpu_now()
            client.upload_file(str(path), args.bucket, f"{prefix}/boto3/model.bin")
            results["boto3"].append(time.perf_counter() - start)
            cpu["boto3"].append(cpu_now() - cpu_start)
            delete_prefix(client, args.bucket, prefix + "/")
            for n, (name, checksum) in enumerate(phases.items()):
                settings.REPLICATION_PART_CHECKSUM = checksum
                checkpoint = Checkpoint.objects.create(
                    project=project, run=run, step=round_ * 10 + n, location=str(directory),
                    total_size=size, file_count=1, status="verified",
                )  # fmt: skip
                CheckpointFile.objects.create(
                    checkpoint=checkpoint, path="model.bin", size=size, sha256=sha
                )
                target = StorageTarget.objects.create(
                    project=project, name=f"{prefix}-{n}", bucket=args.bucket,
                    prefix=f"{prefix}/lifeboat-{n}", endpoint_url=args.endpoint,
                )  # fmt: skip
                replica = Replica.objects.create(checkpoint=checkpoint, target=target)
                start, cpu_start = time.perf_counter(), cpu_now()
                outcome = replicate(replica.pk)
                results[name].append(time.perf_counter() - start)
                cpu[name].append(cpu_now() - cpu_start)
                replica.refresh_from_db()
                if outcome != "verified":
                    print(f"replication did not verify: {outcome}: {replica.last_error}")
                    return 1
                delete_prefix(client, args.bucket, prefix + "/")
            print(
                f"round {round_ + 1}: "
                + ", ".join(f"{k} {size / MiB / v[-1]:.0f} MiB/s" for k, v in results.items()),
                flush=True,
            )
    finally:
        try:
            delete_prefix(client, args.bucket, "")
            client.delete_bucket(Bucket=args.bucket)
        except Exception as exc:  # noqa: BLE001
            print(f"(could not remove the bench bucket: {exc})")
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()

    def rate(name: str) -> float:
        return size / MiB / statistics.median(results[name])

    def spread(name: str) -> str:
        rates = [size / MiB / t for t in results[name]]
        return f"{min(rates):.0f}-{max(rates):.0f}"

    print()
    print(f"{args.size_mib} MiB file, {args.rounds} rounds, S3 at {args.endpoint}, "
          f"{os.cpu_count()} CPUs; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after")  # fmt: skip
    print(f"lifeboat: parts of {settings.REPLICATION_PART_SIZE // MiB} MiB, "
          f"{settings.REPLICATION_CONCURRENCY} at once")  # fmt: skip
    print(f"{'':24} {'median MiB/s':>13} {'range':>10} {'x boto3':>8} {'client CPU s':>13}")
    for name in results:
        label = name if name == "boto3" else f"lifeboat, {name}"
        ratio = rate(name) / rate("boto3")
        print(
            f"{label:24} {rate(name):13.0f} {spread(name):>10} {ratio:8.2f} "
            f"{statistics.median(cpu[name]):13.1f}"
        )
    print("target: lifeboat >= 0.9x boto3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
