"""Validation of a sharded checkpoint against the machine's limit (issue #20, item 2); run
through `bench/validate.py --shards 8 --total 2GiB`.

The checkpoint is written by bench/corpus.py: a Hugging Face folder of `--shards`
safetensors shards and its index, or (`--shape`) a DCP save or a DeepSpeed ZeRO folder of
`--shards` ranks. Every phase reads the same files, warm in the page cache (a
worker checks what the job has just written). Measured in the same run:

  read        every byte read (8 MiB reads), one thread per shard up to the cores
  sha256/cores  hashlib.sha256 of every byte on one core, divided by the cores
  floor       max(read, sha256/cores): no check of every byte can beat it
  sha256 threads  every file hashed by one thread per core at once: what the cores
              give now (on a shared, loaded machine, less than sha256/cores)
  one worker  Lifeboat's check as one validate worker runs it: integrity (confined
              open, size, sha256; files hashed by VALIDATION_PARALLEL threads), then the
              load check (header validated, shards mapped, every tensor scanned for
              NaN/Inf/all-zero) in parts, each in a limited child forked from a warm
              helper, at the same time
  two workers the files split in two parts (what fan-out gives two workers), each part
              checked by its own process at the same time, then the parts merged

Target: one worker <= 1.3x the floor.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from bench import corpus
from webapp.domain.validation.inspect_parts import merge_parts, raw_parts, split
from webapp.domain.validation.inspector import warm_helper
from webapp.domain.validation.integrity import CHUNK, FileSpec, check_local

LIMITS = {"timeout_s": 1800, "memory_bytes": 4 << 30, "warm": True}


def read_all(paths: list[Path], threads: int) -> None:
    def one(path: Path) -> None:
        # Sized to the file: a zeroed 8 MiB buffer per small file would cost more than
        # reading it, and make this floor slower than it is.
        buffer = bytearray(min(CHUNK, path.stat().st_size + 1))
        with path.open("rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, paths))


def sha256_all(paths: list[Path]) -> None:
    for path in paths:
        digest = hashlib.sha256()
        with path.open("rb", buffering=0) as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)


def sha256_threads(paths: list[Path], threads: int) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda p: sha256_all([p]), paths))


def check(location: Path, specs: list[FileSpec], only: list[str], parts: int) -> list[dict]:
    """One worker's check of the files `only`: integrity, then the load check in parts."""
    report = check_local(
        str(location),
        specs,
        [str(location.parent)],
        keep_open=False,
        workers=parts,
        only=set(only),
    )
    assert report.ok, report.findings
    files = [s.path for s in specs]
    return raw_parts(str(location), files, False, only, parts=parts, **LIMITS)


def start_helpers(parts: int) -> None:
    for slot in range(parts):
        warm_helper(slot=slot).ensure_started()


def second_process(location: str, specs: list[tuple], only: list[str], parts: int) -> list:
    start_helpers(parts)
    specs_ = [FileSpec(*s) for s in specs]
    check(Path(location), specs_, only, parts)  # warm-up: helpers forked, caches full
    started = time.perf_counter()
    results = check(Path(location), specs_, only, parts)
    return [time.perf_counter() - started, results]


def run(root: Path, shards: int, total: int, rounds: int, shape: str = "hf") -> int:
    """shape "hf": `shards` safetensors shards; "dcp" / "deepspeed": a save of `shards`
    ranks; "many_files": 10,000 small safetensors files in 100 folders (bench/corpus.py),
    `shards` unused."""
    cores = os.cpu_count() or 1
    parts = max(1, min(int(os.environ.get("VALIDATION_PARALLEL", "8")), cores))
    print(f"writing a {shape} checkpoint, {total / (1 << 30):.2f} GiB ...")
    opts = {"hf": {"shards": shards}, "dcp": {"ranks": shards}, "deepspeed": {"ranks": shards}}
    opts = opts.get(shape, {})
    location = corpus.write(shape, root, total, **opts)
    manifest = corpus.manifest(location)  # also warms the page cache
    specs = [FileSpec(f["path"], f["size"], f["sha256"]) for f in manifest]
    paths = [location / f["path"] for f in manifest]
    size = sum(f["size"] for f in manifest)
    start_helpers(parts)
    check(location, specs, [s.path for s in specs], parts)  # warm-up
    rows: dict[str, list[float]] = {"read": [], "sha256/cores": [], "sha256 threads": []}
    rows["one worker"] = []
    every = [s.path for s in specs]
    for _ in range(rounds):
        rows["read"].append(timed(lambda: read_all(paths, min(cores, len(paths)))))
        rows["sha256/cores"].append(timed(lambda: sha256_all(paths)) / cores)
        # What `cores` hashing threads get now (on a loaded machine, less than the cores).
        rows["sha256 threads"].append(timed(lambda: sha256_threads(paths, cores)))
        seconds = timed(lambda: verify(check(location, specs, every, parts), shape))
        rows["one worker"].append(seconds)
    rows["two workers"] = two_workers(location, specs, parts, rounds, shape)
    report(rows, size, len(specs), cores, parts)
    return 0


HINTS = {"hf": "safetensors", "many_files": "safetensors", "dcp": "dcp", "deepspeed": "torch"}


def verify(results: list[dict], shape: str) -> None:
    merged = merge_parts(results, HINTS[shape])
    problems = [f for f in merged["findings"] if f["severity"] != "info"]
    assert not problems and merged["tensors"] > 0, problems


def two_workers(
    location: Path, specs: list[FileSpec], parts: int, rounds: int, shape: str
) -> list[float]:
    """Two processes, each checking half of the files at the same time (as two workers
    taking fanned-out parts); the time is the slower one's, plus the merge."""
    sizes = {s.path: s.size for s in specs}
    halves = split([s.path for s in specs], sizes, 2)
    plain = [(s.path, s.size, s.sha256) for s in specs]
    times = []
    with ProcessPoolExecutor(2) as pool:
        for _ in range(rounds):
            futures = [
                pool.submit(second_process, str(location), plain, half, max(1, parts // 2))
                for half in halves
            ]
            answers = [f.result() for f in futures]
            started = time.perf_counter()
            verify([r for _, results in answers for r in results], shape)
            times.append(max(seconds for seconds, _ in answers) + time.perf_counter() - started)
    return times


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def report(rows: dict, size: int, files: int, cores: int, parts: int) -> None:
    mib = size / (1 << 20)
    medians = {name: statistics.median(values) for name, values in rows.items()}
    floor = max(medians["read"], medians["sha256/cores"])
    print(
        f"\n{files:,} files, {mib:,.0f} MiB, {len(rows['read'])} rounds (median), "
        f"{cores} cores, {parts} hashing threads / inspection parts per worker"
    )
    print(f"{'phase':<14} {'seconds':>8} {'MiB/s':>8} {'x floor':>8}  target")
    for name, seconds in medians.items():
        target = ""
        if name == "one worker":
            target = "<= 1.3  " + ("met" if seconds / floor <= 1.3 else "NOT met")
        print(f"{name:<14} {seconds:8.3f} {mib / seconds:8.0f} {seconds / floor:8.2f}  {target}")
    print(f"{'floor':<14} {floor:8.3f} {mib / floor:8.0f} {1.0:8.2f}  max(read, sha256/cores)")
