"""Click to the resumed job's first reported step, for a sharded checkpoint whose local
copy is gone (so it comes back from S3), beside the floor measured in the same run.

    .venv/bin/python bench/resume.py                       # 1 GiB in 8 shards, 3 rounds
    .venv/bin/python bench/resume.py --total 256MiB --rounds 2
    .venv/bin/python bench/resume.py --launcher local,slurm   # Slurm too (sbatch here)
    .venv/bin/python bench/resume.py --shape dcp      # a DCP folder saved by 8 gloo ranks

Setup: a checkpoint of --shards torch files (--total bytes), or with --shape dcp a
torch.distributed.checkpoint folder saved by --shards ranks (bench/corpus.py; the job
loads it with DCP's own loader, no process group), verified, replicated to the
S3 server (S3_ENDPOINT_URL, default the shared SeaweedFS on :8333), and a launch profile
of each --launcher kind (`local`; `slurm`, which needs sbatch and a node that sees this
checkout, such as the single-node cluster of scripts/slurm_single_node.sh) running
bench/resume_job.py (start a lifeboat.Run, torch.load every shard one at
a time, one step, run.log; it prints the time of that report). Database: a scratch
SQLite. No Lifeboat server runs: the job's events wait in its spool, which does not
delay it. Alternated round by round, the local folder deleted before each:

  lifeboat   the click (webapp.domain.recovery.resume.request, what the API and the Resume button
             call) then what the launch worker does with the message
             (workers.launch.launch_resume: check the local copy, restore every shard
             from the replica in parallel, verified, start the job, or submit it to
             Slurm); timed to the job's first reported step, Slurm's scheduling
             included. The queue's own latency is not included.
  floor      boto3's TransferManager downloading the same objects (no verification),
             then a fresh interpreter that imports torch and torch.loads every shard.

Target (issue #20): lifeboat <= 1.5x floor.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
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
LOAD = (
    "import sys, time, torch\n"
    "from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys\n"
    "for f in sys.argv[1:]:\n"
    "    if f.endswith('/.metadata'):\n"
    "        s = _load_state_dict_from_keys(checkpoint_id=f.rsplit('/', 1)[0]); del s; break\n"
    "    if not f.endswith('.distcp'):\n"
    "        s = torch.load(f, map_location='cpu', weights_only=True); del s\n"
    "print(f'LOADED {time.time():.6f}')\n"
)


def write_shards(folder: Path, shards: int, total: int) -> list[dict]:
    import torch

    folder.mkdir(parents=True)
    files = []
    per = total // shards // 4
    for i in range(shards):
        path = folder / f"shard-{i:02d}-of-{shards:02d}.pt"
        torch.save({f"layer.{i}.weight": torch.randn(per)}, path)
        data = path.read_bytes()
        files.append(
            {"path": path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )
    return files


def first_step(log: Path, timeout: float = 600) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists():
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("FIRST_STEP "):
                    return float(line.split()[1])
        time.sleep(0.02)
    raise SystemExit(f"the resumed job reported no step; its output:\n{log.read_text()[-2000:]}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", default="1GiB")
    parser.add_argument("--shards", type=int, default=8, help="torch files, or DCP ranks")
    parser.add_argument("--shape", choices=("torch", "dcp"), default="torch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--launcher", default="local", help="launch profile kinds, comma-separated: local,slurm"
    )
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    parser.add_argument("--bucket", default=f"bench-resume-{uuid.uuid4().hex[:6]}")
    return parser.parse_args()


def configure(args: argparse.Namespace, work: Path) -> None:
    """The S3 settings, then Django on a scratch SQLite under work, its launched jobs'
    events sent nowhere (they spool)."""
    os.environ.setdefault("S3_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("S3_SECRET_ACCESS_KEY", "bench-secret")
    os.environ["S3_ENDPOINT_URL"] = args.endpoint
    os.environ.setdefault("LIFEBOAT_OUTBOUND_ALLOW", urlsplit(args.endpoint).netloc)
    from replicate import setup_django

    setup_django(work / "var")
    from django.conf import settings

    settings.LAUNCH_LIFEBOAT_URL = "http://127.0.0.1:9"  # nothing listens: events spool


def record(args, work: Path, folder: Path, files: list[dict]):
    """The shards recorded as a verified checkpoint, replicated by the real task, and a
    launch profile per --launcher kind; returns (checkpoint, replica, {kind: profile})."""
    from webapp.domain.models import (
        Checkpoint,
        CheckpointFile,
        LaunchProfile,
        Project,
        Replica,
        Run,
        StorageTarget,
    )
    from workers.replicate import replicate

    size = sum(f["size"] for f in files)
    project = Project.objects.create(
        name="bench", slug="bench", allowed_roots=[str(work / "ckpts")]
    )
    run = Run.objects.create(project=project, key="run")
    checkpoint = Checkpoint.objects.create(
        project=project, run=run, step=100, location=str(folder), total_size=size,
        file_count=len(files), status="verified",
    )  # fmt: skip
    CheckpointFile.objects.bulk_create(CheckpointFile(checkpoint=checkpoint, **f) for f in files)
    target = StorageTarget.objects.create(project=project, name="backup", bucket=args.bucket,
                                          prefix="lb", endpoint_url=args.endpoint)  # fmt: skip
    replica = Replica.objects.create(checkpoint=checkpoint, target=target)
    assert replicate(replica.pk) == "verified"
    replica.refresh_from_db()
    profiles = {
        kind: LaunchProfile.objects.create(
            project=project,
            name=kind,
            kind=kind,
            command_template=(
                f"{shlex.quote(sys.executable)} bench/resume_job.py "
                "--resume-from {{checkpoint_path}} --run {{new_run_key}}"
            ),
            options={"workdir": str(ROOT), "env": {}},
        )  # fmt: skip
        for kind in args.launcher.split(",")
    }
    return checkpoint, replica, profiles


def lifeboat_once(checkpoint, profile) -> float:
    """The click, then the launch worker's handling of it; seconds to the first step."""
    from django.db import transaction

    from webapp.domain.models import Resume
    from webapp.domain.recovery import resume as resumes
    from workers.launch import launch_resume

    clicked = time.time()
    with transaction.atomic():
        resume = resumes.request(checkpoint, profile, actor="bench")
    launch_resume(resume.pk)
    resume = Resume.objects.get(pk=resume.pk)
    if resume.status == "failed":
        raise SystemExit(f"the resume failed: {resume.error}")
    return first_step(resumes.launch_dir(resume) / "output.log") - clicked


def floor_once(client, bucket: str, replica, folder: Path) -> float:
    """TransferManager's download of every object, then a fresh interpreter's loads."""
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    started = time.time()
    folder.mkdir(parents=True)
    config = TransferConfig(max_concurrency=10, multipart_chunksize=8 * MiB)
    with TransferManager(client, config) as manager:
        for entry in replica.files:
            manager.download(bucket, entry["key"], str(folder / entry["path"]))
    out = subprocess.run(
        [sys.executable, "-c", LOAD, *sorted(str(p) for p in folder.iterdir())],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return float(out.split()[-1]) - started


def run_rounds(args, client, folder: Path, checkpoint, replica, profiles) -> dict[str, list[float]]:
    ways = ["floor", *(f"lifeboat {kind}" for kind in profiles)]
    results: dict[str, list[float]] = {way: [] for way in ways}
    for round_ in range(args.rounds):
        shift = round_ % len(ways)  # each way goes first in turn
        for way in ways[shift:] + ways[:shift]:
            shutil.rmtree(folder, ignore_errors=True)  # the node that held it is gone
            if way == "floor":
                results[way].append(floor_once(client, args.bucket, replica, folder))
            else:
                profile = profiles[way.split()[1]]
                results[way].append(lifeboat_once(checkpoint, profile))
        print(
            f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in results.items()),
            flush=True,
        )
    return results


def main() -> int:
    args = parse_args()
    import corpus

    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lifeboat-bench-resume-", dir=ROOT / "var"))
    configure(args, work)
    import boto3
    from botocore.config import Config
    from replicate import delete_prefix

    # A pool larger than the floor's 10 transfer threads: with botocore's default (10)
    # s3transfer drops and reopens connections, which would slow the floor.
    client = boto3.client("s3", endpoint_url=args.endpoint, region_name="us-east-1",
                          aws_access_key_id=os.environ["S3_ACCESS_KEY_ID"],
                          aws_secret_access_key=os.environ["S3_SECRET_ACCESS_KEY"],
                          config=Config(max_pool_connections=32))  # fmt: skip
    client.create_bucket(Bucket=args.bucket)
    total = corpus.parse_size(args.total)
    folder = work / "ckpts" / "run" / "step-100"
    print(f"writing {args.shards} {args.shape} shards, {total / MiB:,.0f} MiB ...", flush=True)
    if args.shape == "dcp":
        folder.parent.mkdir(parents=True)
        corpus.write("dcp", work / "written", total, ranks=args.shards).rename(folder)
        files = corpus.manifest(folder)
    else:
        files = write_shards(folder, args.shards, total)
    size = sum(f["size"] for f in files)
    checkpoint, replica, profiles = record(args, work, folder, files)
    try:
        results = run_rounds(args, client, folder, checkpoint, replica, profiles)
    finally:
        delete_prefix(client, args.bucket, "")
        client.delete_bucket(Bucket=args.bucket)
        shutil.rmtree(work, ignore_errors=True)
    best = {k: min(v) for k, v in results.items()}
    print()
    print(f"{args.shape}: {len(files)} files, {size / MiB:,.0f} MiB, {args.rounds} rounds, "
          f"S3 at {args.endpoint}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'':16} {'best s':>8} {'median s':>9} {'x floor':>8}")
    for k, v in results.items():
        print(f"{k:16} {best[k]:8.2f} {statistics.median(v):9.2f} {best[k] / best['floor']:8.2f}")
    print("target: lifeboat <= 1.5x floor (click to first reported step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
