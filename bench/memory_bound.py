"""A checkpoint four times larger than the worker's memory verifies, replicates and
restores (issue #20, item 6), under a real memory limit.

    .venv/bin/python bench/memory_bound.py                      # 16 GiB on a 4 GiB limit
    .venv/bin/python bench/memory_bound.py --total 2GiB --memory 1GiB
    .venv/bin/python bench/memory_bound.py --shape dcp          # a DCP save of 8 ranks

Writes a Hugging Face folder of 8 safetensors shards (or, with --shape dcp, a DCP save
of 8 ranks; bench/corpus.py) and its manifest, then moves this process into a memory
cgroup (v1 /sys/fs/cgroup/memory, as root) limited to --memory, page cache included, so
that everything after, and every child it forks, lives within it, as a worker in a
container of that size would. Then, as a worker runs them (the tasks called in this
process, on a scratch SQLite; VALIDATION_MEMORY_BYTES set to --memory): the validate
task (hash, safe load, NaN scan), the replicate task to S3 (S3_ENDPOINT_URL, default the
shared SeaweedFS on :8333), and a restore test (every shard downloaded and verified,
then loaded shard by shard in a limited child).

Prints each verdict, its time, and the cgroup's peak use and failure count; exits 1 unless
the checkpoint is verified, its replica verified and its restore test passed, with no
process of the cgroup killed for memory. Tasks published on the way go to Redis db 13
(REDIS_URL), flushed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GiB = 1 << 30
CGROUP = Path("/sys/fs/cgroup/memory")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", default="16GiB", help="checkpoint size")
    parser.add_argument(
        "--shape", choices=("hf", "dcp"), default="hf",
        help="8 HF safetensors shards, or a DCP save of 8 ranks",
    )  # fmt: skip
    parser.add_argument("--memory", default="4GiB", help="the cgroup's memory limit")
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    parser.add_argument("--bucket", default=f"bench-memory-{uuid.uuid4().hex[:6]}")
    return parser.parse_args()


def enter_cgroup(limit: int) -> Path:
    if not (CGROUP / "tasks").exists():
        raise SystemExit(f"no cgroup v1 memory controller at {CGROUP}; run as root on Linux")
    group = CGROUP / f"lifeboat-bench-{os.getpid()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit))
    (group / "tasks").write_text(str(os.getpid()))
    return group


def cgroup_figures(group: Path) -> dict:
    oom = dict(line.split() for line in (group / "memory.oom_control").read_text().splitlines())
    return {
        "peak": int((group / "memory.max_usage_in_bytes").read_text()),
        "failcnt": int((group / "memory.failcnt").read_text()),
        "oom_kill": int(oom.get("oom_kill", 0)),
    }


def leave_cgroup(group: Path) -> None:
    (CGROUP / "tasks").write_text(str(os.getpid()))
    with contextlib.suppress(OSError):  # a child still in it: the kernel keeps it till then
        group.rmdir()


def configure(args: argparse.Namespace, work: Path, limit: int) -> None:
    os.environ.setdefault("S3_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("S3_SECRET_ACCESS_KEY", "bench-secret")
    os.environ["S3_ENDPOINT_URL"] = args.endpoint
    os.environ.setdefault("LIFEBOAT_OUTBOUND_ALLOW", urlsplit(args.endpoint).netloc)
    os.environ["REDIS_URL"] = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
    os.environ["VALIDATION_MEMORY_BYTES"] = str(limit)
    # One worker checks the whole checkpoint: nothing else would take fanned-out parts.
    os.environ["VALIDATION_FANOUT_BYTES"] = str(1 << 50)
    os.environ["LIFEBOAT_SCRATCH_DIR"] = str(work / "scratch")
    from replicate import setup_django

    setup_django(work / "var")


def timed(what: str, function, *args):
    started = time.perf_counter()
    result = function(*args)
    seconds = time.perf_counter() - started
    print(f"  {what:<14} {result!s:<12} {seconds:8.1f} s", flush=True)
    return result, seconds


def run_stages(args, folder: Path, files: list[dict]) -> dict[str, str]:
    from webapp.domain.models import (
        Checkpoint,
        CheckpointFile,
        Project,
        Replica,
        Run,
        StorageTarget,
        Validation,
    )
    from webapp.domain.recovery import restore_test as rt
    from workers.replicate import replicate
    from workers.validate import validate_checkpoint

    project = Project.objects.create(name="bench", slug="bench", allowed_roots=[str(folder.parent)])
    run = Run.objects.create(project=project, key="run")
    checkpoint = Checkpoint.objects.create(
        project=project, run=run, step=100, location=str(folder),
        total_size=sum(f["size"] for f in files), file_count=len(files),
    )  # fmt: skip
    CheckpointFile.objects.bulk_create(CheckpointFile(checkpoint=checkpoint, **f) for f in files)
    timed("validate", validate_checkpoint, checkpoint.pk)
    checkpoint.refresh_from_db()
    target = StorageTarget.objects.create(project=project, name="backup", bucket=args.bucket,
                                          prefix="lb", endpoint_url=args.endpoint)  # fmt: skip
    replica = Replica.objects.create(checkpoint=checkpoint, target=target)
    timed("replicate", replicate, replica.pk)
    replica.refresh_from_db()
    validation = rt.request(checkpoint)
    timed("restore test", rt.run, validation.pk)
    validation = Validation.objects.get(pk=validation.pk)
    return {
        "checkpoint": f"{checkpoint.status} {checkpoint.status_message}".strip(),
        "replica": f"{replica.status} {replica.last_error}".strip(),
        "restore test": f"{validation.status} {validation.message or ''}".strip(),
    }


def main() -> int:
    args = parse_args()
    import corpus

    total, limit = corpus.parse_size(args.total), corpus.parse_size(args.memory)
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lifeboat-bench-memory-", dir=ROOT / "var"))
    configure(args, work, limit)
    import boto3
    import redis
    from replicate import delete_prefix

    client = boto3.client("s3", endpoint_url=args.endpoint, region_name="us-east-1",
                          aws_access_key_id=os.environ["S3_ACCESS_KEY_ID"],
                          aws_secret_access_key=os.environ["S3_SECRET_ACCESS_KEY"])  # fmt: skip
    client.create_bucket(Bucket=args.bucket)
    group = None
    try:
        print(f"writing a {args.shape} checkpoint of 8 shards, {total / GiB:.1f} GiB ...")
        options = {"shards": 8} if args.shape == "hf" else {"ranks": 8}
        folder = corpus.write(args.shape, work / "ckpts", total, **options)
        files = corpus.manifest(folder)
        group = enter_cgroup(limit)
        print(f"in a memory cgroup of {limit / GiB:.1f} GiB (page cache included):")
        outcome = run_stages(args, folder, files)
        figures = cgroup_figures(group)
    finally:
        if group is not None:
            leave_cgroup(group)
        delete_prefix(client, args.bucket, "")
        client.delete_bucket(Bucket=args.bucket)
        redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
        shutil.rmtree(work, ignore_errors=True)
    print()
    for what, verdict in outcome.items():
        print(f"{what:<13} {verdict[:200]}")
    print(
        f"cgroup: peak {figures['peak'] / GiB:.2f} GiB of {limit / GiB:.1f} GiB, "
        f"{figures['failcnt']} allocations held back at the limit (reclaim), "
        f"{figures['oom_kill']} processes killed for memory"
    )
    good = (
        outcome["checkpoint"].startswith("verified")
        and outcome["replica"].startswith("verified")
        and outcome["restore test"].startswith("passed")
        and figures["oom_kill"] == 0
    )
    print("result:", "every stage good within the limit" if good else "NOT GOOD")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
