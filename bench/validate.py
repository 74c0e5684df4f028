"""Validation throughput on a 1 GiB checkpoint, beside a plain hashlib.sha256 read of the
same file in the same run; with --shards, a sharded checkpoint against the machine's
limit (bench/validate_sharded.py).

    .venv/bin/python bench/validate.py               # 1 GiB, 3 rounds
    .venv/bin/python bench/validate.py --size-mib 256 --rounds 5
    .venv/bin/python bench/validate.py --shards 8 --total 2GiB
    .venv/bin/python bench/validate.py --shards 8 --shape dcp --total 2GiB   # 8 DCP ranks
    .venv/bin/python bench/validate.py --many-files --total 40MiB   # 10,000 small files

Phases, each timed over the same file (warm in the page cache after the first read, as
it is when a worker checks a checkpoint the job has just written):

  baseline    hashlib.sha256 over the file in 8 MiB reads (the plain read)
  integrity   Lifeboat's integrity check: path confinement, size, sha256
  validation  integrity + the load check in a child process with memory and time limits
              (torch.load(weights_only=True, mmap=True), then a NaN/Inf and all-zero
              scan of every tensor), as a worker runs it: the child is forked from a
              helper that imported torch once ("warm")
  cold        the same with a fresh interpreter per check (what the first check of a
              worker, or a one-off check, pays: Python start and `import torch`)

Targets (issue #4): integrity >= 0.9x the baseline, the whole validation >= 0.5x.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from webapp.domain.validation.inspector import (  # noqa: E402
    inspect_checkpoint,
    start_warm_inspector,
)
from webapp.domain.validation.integrity import CHUNK, FileSpec, check_local  # noqa: E402


def make_checkpoint(path: Path, size_mib: int) -> None:
    import torch

    tensors = max(1, size_mib // 16)
    per_tensor = size_mib * 1024 * 1024 // 4 // tensors
    generator = torch.Generator().manual_seed(0)
    state = {
        f"layers.{i}.weight": torch.randn(per_tensor, generator=generator) for i in range(tensors)
    }
    torch.save(state, path)


def plain_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="where to write the checkpoint (default: a temp dir)")
    parser.add_argument("--shards", type=int, help="a sharded checkpoint of this many shards")
    parser.add_argument(
        "--shape",
        choices=("hf", "dcp", "deepspeed"),
        default="hf",
        help="with --shards: HF safetensors shards, a DCP save of that many ranks, or a "
        "DeepSpeed ZeRO folder of that many ranks",
    )
    parser.add_argument("--total", default="8GiB", help="with --shards: its size (8GiB, 1GiB)")
    parser.add_argument(
        "--many-files", action="store_true", help="10,000 small files of --total in all instead"
    )
    args = parser.parse_args()
    if args.shards or args.many_files:
        from bench.corpus import parse_size
        from bench.validate_sharded import run

        shape = "many_files" if args.many_files else args.shape
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="lifeboat-bench-validate-") as tmp:
            return run(Path(tmp), args.shards or 0, parse_size(args.total), args.rounds, shape)

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="lifeboat-bench-validate-") as tmp:
        root = Path(tmp)
        path = root / "model.pt"
        print(f"writing a {args.size_mib} MiB torch state dict to {path} ...", flush=True)
        make_checkpoint(path, args.size_mib)
        size = path.stat().st_size
        digest = plain_sha256(path)  # also warms the page cache
        spec = FileSpec("model.pt", size, digest)

        rows: dict[str, list[float]] = {
            "baseline": [],
            "integrity": [],
            "validation": [],
            "cold": [],
        }
        start_warm_inspector()  # a worker starts it with its first check
        details: list[dict] = []
        for _ in range(args.rounds):
            seconds, _ = timed(lambda: plain_sha256(path))
            rows["baseline"].append(seconds)
            seconds, report = timed(lambda: check_local(str(path), [spec], [str(root)]))
            assert report.ok, report.findings
            rows["integrity"].append(seconds)

            for name, warm in (("validation", True), ("cold", False)):

                def validation(warm=warm):
                    report = check_local(str(path), [spec], [str(root)])
                    inspection = inspect_checkpoint(
                        str(root), ["model.pt"], True, "torch", warm=warm
                    )
                    return report, inspection

                seconds, (report, inspection) = timed(validation)
                problems = [f for f in inspection["findings"] if f["severity"] != "info"]
                assert report.ok and not problems, (report.findings, problems)
                rows[name].append(seconds)
                if warm:
                    details.append(inspection["timings"])

    mib = size / 1024 / 1024
    base = statistics.median(rows["baseline"])
    print(f"\nfile: {mib:,.0f} MiB, {args.rounds} rounds, median seconds; machine: 2 cores")
    print(f"{'phase':<12} {'seconds':>8} {'MiB/s':>8} {'x baseline':>11}  target")
    targets = {"baseline": "", "integrity": ">= 0.90", "validation": ">= 0.50", "cold": ""}
    for name, values in rows.items():
        seconds = statistics.median(values)
        ratio = base / seconds
        verdict = ""
        if targets[name]:
            verdict = "met" if ratio >= float(targets[name][3:]) else "NOT met"
        print(
            f"{name:<12} {seconds:8.3f} {mib / seconds:8.0f} {ratio:11.2f}  "
            f"{targets[name]} {verdict}"
        )
    load = statistics.median(d.get("load_s", 0) for d in details)
    scan = statistics.median(d.get("scan_s", 0) for d in details)
    print(f"\ninside the load check (child process): load {load:.3f} s, scan {scan:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
