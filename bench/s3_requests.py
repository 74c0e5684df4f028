"""What small S3 uploads cost Python: plain boto3 `put_object` of 4 KiB objects to the S3
server, from 1 to 3 processes of 4 to 16 threads each, with botocore's default
"Expect: 100-continue" and without it (as Lifeboat sends a small object). Requests per
second and CPU per request of the client processes. It is the ceiling the replication of
a many-file checkpoint meets (docs/benchmarks.md, "Whole trees"): no file is read, no
sha256 computed, nothing recorded.

    .venv/bin/python bench/s3_requests.py                 # SeaweedFS at :8333
    S3_ENDPOINT_URL=http://host:9000 .venv/bin/python bench/s3_requests.py --requests 6000
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import time
import uuid
from concurrent.futures import ThreadPoolExecutor


def client_for(endpoint: str, expect: bool):
    import boto3
    from botocore.config import Config
    from botocore.handlers import add_expect_header

    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=os.environ.get("S3_ACCESS_KEY_ID", "bench"),
        aws_secret_access_key=os.environ.get("S3_SECRET_ACCESS_KEY", "bench-secret"),
        config=Config(max_pool_connections=64),
    )  # fmt: skip
    if not expect:
        client.meta.events.unregister("before-call.s3", add_expect_header)
    return client


def send(job: tuple) -> float:
    """One process's share; returns the CPU seconds it used."""
    endpoint, bucket, prefix, count, threads, expect = job
    client = client_for(endpoint, expect)
    body = os.urandom(4096)
    before = resource.getrusage(resource.RUSAGE_SELF)
    with ThreadPoolExecutor(threads) as pool:
        keys = (f"{prefix}/{i}" for i in range(count))
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=body), keys))
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=6000, help="uploads per setting")
    parser.add_argument("--processes", default="1,2,3")
    parser.add_argument("--threads", default="4,16")
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    args = parser.parse_args()
    setup = client_for(args.endpoint, True)
    bucket = f"bench-requests-{uuid.uuid4().hex[:6]}"
    setup.create_bucket(Bucket=bucket)
    print(f"put_object of 4 KiB to {args.endpoint}, {args.requests} requests per setting, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'100-continue':>12} {'processes':>9} {'threads':>7} {'requests/s':>11} "
          f"{'CPU ms/request':>15}")  # fmt: skip
    forked = multiprocessing.get_context("fork")
    best = {}
    try:
        for expect in (True, False):
            for processes in (int(n) for n in args.processes.split(",")):
                for threads in (int(n) for n in args.threads.split(",")):
                    share = args.requests // processes
                    jobs = [
                        (args.endpoint, bucket, f"{expect}-{processes}-{threads}-{p}", share,
                         threads, expect)
                        for p in range(processes)
                    ]  # fmt: skip
                    with forked.Pool(processes) as pool:
                        started = time.perf_counter()
                        cpu = sum(pool.map(send, jobs))
                        wall = time.perf_counter() - started
                    rate = share * processes / wall
                    best[expect] = max(best.get(expect, 0), rate)
                    print(f"{'yes' if expect else 'no':>12} {processes:>9} {threads:>7} "
                          f"{rate:>11.0f} {1000 * cpu / (share * processes):>15.2f}",
                          flush=True)  # fmt: skip
    finally:
        paginator = setup.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                setup.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        setup.delete_bucket(Bucket=bucket)
    print(f"best: {best[True]:.0f} requests/s with 100-continue, {best[False]:.0f} without")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
