"""What one small S3 upload costs a Python process: plain boto3 `put_object` of 4 KiB
objects to the S3 server, with 1 to 16 threads, requests per second and CPU per request.
It is the ceiling the replication of a many-file checkpoint meets in one worker process
(docs/benchmarks.md, "Whole trees").

    .venv/bin/python bench/s3_requests.py                 # SeaweedFS at :8333
    S3_ENDPOINT_URL=http://host:9000 .venv/bin/python bench/s3_requests.py --requests 2000
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import uuid
from concurrent.futures import ThreadPoolExecutor


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="uploads per setting")
    parser.add_argument("--threads", default="1,4,8,16")
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    args = parser.parse_args()
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=args.endpoint, region_name="us-east-1",
        aws_access_key_id=os.environ.get("S3_ACCESS_KEY_ID", "bench"),
        aws_secret_access_key=os.environ.get("S3_SECRET_ACCESS_KEY", "bench-secret"),
        config=Config(max_pool_connections=64),
    )  # fmt: skip
    bucket = f"bench-requests-{uuid.uuid4().hex[:6]}"
    client.create_bucket(Bucket=bucket)
    body = os.urandom(4096)
    print(f"put_object of 4 KiB to {args.endpoint}, {args.requests} requests per setting")
    print(f"{'threads':>7} {'requests/s':>11} {'CPU ms/request':>15}")
    try:
        for threads in (int(n) for n in args.threads.split(",")):
            keys = [f"{threads}/{i}" for i in range(args.requests)]
            started, cpu = time.perf_counter(), cpu_seconds()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=body), keys))
            wall, used = time.perf_counter() - started, cpu_seconds() - cpu
            per_request_ms = 1000 * used / args.requests
            print(f"{threads:>7} {args.requests / wall:>11.0f} {per_request_ms:>15.2f}")
    finally:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=bucket)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
