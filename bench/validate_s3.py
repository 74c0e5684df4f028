"""Integrity check of a checkpoint that a job wrote straight to S3 (an s3:// location),
beside boto3's TransferManager downloading the same objects, in the same run.

    .venv/bin/python bench/validate_s3.py                       # 8 shards, 2 GiB, 3 rounds
    .venv/bin/python bench/validate_s3.py --shards 8 --total 8GiB --rounds 2
    S3_ENDPOINT_URL=http://host:9000 .venv/bin/python bench/validate_s3.py

Setup: a Hugging Face folder of --shards safetensors shards (bench/corpus.py) uploaded to
the S3 server (S3_ENDPOINT_URL, default the shared SeaweedFS on :8333). Then, alternated
round by round, each into an empty scratch folder:

  boto3      s3transfer.TransferManager (10 threads, 8 MiB parts) downloading every
             object: no checksum
  lifeboat   integrity.check_s3 as a validate worker runs it for an s3:// checkpoint:
  xN         every object streamed into scratch with its sha256 in the same pass, its
             size and digest compared with what the job reported, paths confined; N
             objects at once (--streams)

No target is set; the figure says what a user whose jobs write to S3 waits for.
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
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MiB = 1024 * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--total", default="2GiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", default="1,4", help="objects fetched at once, each way")
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    args = parser.parse_args()
    import corpus
    from replicate import delete_prefix, s3_client, setup_django

    os.environ.setdefault("S3_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("S3_SECRET_ACCESS_KEY", "bench-secret")
    os.environ["S3_ENDPOINT_URL"] = args.endpoint
    os.environ.setdefault("LIFEBOAT_OUTBOUND_ALLOW", urlsplit(args.endpoint).netloc)
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lifeboat-bench-validate-s3-", dir=ROOT / "var"))
    setup_django(work / "var")
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    from webapp.domain.replication import storage
    from webapp.domain.validation.integrity import FileSpec, check_s3

    client = s3_client(args.endpoint)
    bucket = f"bench-validate-s3-{uuid.uuid4().hex[:6]}"
    client.create_bucket(Bucket=bucket)
    total = corpus.parse_size(args.total)
    print(f"writing {args.shards} shards, {total / MiB:,.0f} MiB, and uploading ...", flush=True)
    folder = corpus.write("hf", work / "tree", total, shards=args.shards)
    files = corpus.manifest(folder)
    size = sum(f["size"] for f in files)
    config = TransferConfig(max_concurrency=10, multipart_chunksize=8 * MiB)
    with TransferManager(client, config) as manager:
        for f in files:
            manager.upload(str(folder / f["path"]), bucket, f"job/ckpt/{f['path']}")
    shutil.rmtree(work / "tree")
    location = f"s3://{bucket}/job/ckpt"
    specs = [FileSpec(f["path"], f["size"], f["sha256"]) for f in files]
    worker_client = storage.client(args.endpoint, "us-east-1", os.environ["S3_ACCESS_KEY_ID"],
                                   os.environ["S3_SECRET_ACCESS_KEY"])  # fmt: skip
    scratch = work / "scratch"
    ways = ["boto3", *(f"lifeboat x{n}" for n in args.streams.split(","))]
    results: dict[str, list[float]] = {way: [] for way in ways}

    def boto3_round() -> None:
        with TransferManager(client, config) as manager:
            for f in files:
                manager.download(bucket, f"job/ckpt/{f['path']}", str(scratch / f["path"]))

    def lifeboat_round(streams: int) -> None:
        report = check_s3(location, specs, [f"s3://{bucket}/job"], worker_client, str(scratch),
                          workers=streams)  # fmt: skip
        if report.findings:
            raise SystemExit(f"the check found: {report.findings}")

    try:
        for round_ in range(args.rounds):
            for way in ways if round_ % 2 == 0 else ways[::-1]:
                shutil.rmtree(scratch, ignore_errors=True)
                scratch.mkdir(mode=0o700)
                started = time.perf_counter()
                if way == "boto3":
                    boto3_round()
                else:
                    lifeboat_round(int(way.split("x")[1]))
                results[way].append(time.perf_counter() - started)
            print(f"round {round_ + 1}: " + ", ".join(
                f"{k} {v[-1]:.2f} s" for k, v in results.items()), flush=True)  # fmt: skip
    finally:
        delete_prefix(client, bucket, "")
        client.delete_bucket(Bucket=bucket)
        shutil.rmtree(work, ignore_errors=True)
    boto3_s = statistics.median(results["boto3"])
    print()
    load = os.getloadavg()[0]
    print(f"{len(files)} files, {size / MiB:,.0f} MiB, {args.rounds} rounds, S3 at "
          f"{args.endpoint}, {os.cpu_count()} CPUs, load average {load:.2f}")  # fmt: skip
    print(f"{'':34} {'median s':>9} {'MiB/s':>7} {'x boto3':>8}")
    for way in ways:
        median = statistics.median(results[way])
        label = "boto3 TransferManager download" if way == "boto3" else f"check_s3, {way[9:]}"
        print(f"{label:34} {median:9.2f} {size / MiB / median:7.0f} {median / boto3_s:8.2f}")
    print("check_s3: every object fetched with its sha256 and size compared; x N: N at once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
