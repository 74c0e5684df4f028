"""Verified download of a checkpoint's files from URLs (presigned S3 GETs).

Standard library only, on purpose: the `lifeboat` client (`lifeboat.latest`) and the
server's restore path (restore tests, resume) use this same code. Each file is written to
`<path>.partial` and moved into place only when its size and sha256 match; a file already
in place with the right size and sha256 is not fetched again, so an interrupted restore
picks up where it stopped.

A large file is fetched as several ranged GETs at once (object stores serve one stream
slowly and many quickly, which is what boto3's download_file does too). Each fetching
thread reads its part straight into a reused buffer, a piece at a time, and writes each
piece at its offset while it is still in the CPU's cache; one thread takes the parts in
order and hashes them: sha256 in the same pass as the download, one read of the bytes,
and at most `parallel * 2` parts held in memory. Why, measured per GiB on 2 cores with
SeaweedFS on the same host (docs/benchmarks.md): one thread hashing and writing in order
was a serial chain of about 2.4 s (5.4 s in all, boto3 2.4 s), so that thread only
hashes now (3.0 s); and writing in 256 KiB pieces as they arrive took 2.5 s of CPU where
writing whole 8 MiB parts took 3.0 s (1 MiB pieces were no better than whole parts).
"""

from __future__ import annotations

import hashlib
import os
import queue
import shutil
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path, PurePosixPath

CHUNK = 8 * 1024 * 1024  # one ranged GET
PIECE = 256 * 1024  # one read from the socket and one write to the file (boto3's too)
# Ranged GETs at once: measured on 2 cores against SeaweedFS, 4 fetched 512 MiB in
# 1.12 s, 8 in 1.47 s (the hashing thread starves), 1 in 1.94 s; boto3 0.93 s. Since the
# fetching threads write, 4 and 8 are within the noise of each other (1 GiB, 2 cores).
PARALLEL = max(4, min(8, os.cpu_count() or 4))
PROGRESS_S = 0.2  # how often progress() is called while files are fetched


class RestoreError(Exception):
    """A file could not be fetched, or its bytes do not match its sha256.

    `replica_at_fault` is False when the fault is not the copy's: this machine's disk (full,
    read-only, over a limit) or the way to the object store (refused, reset, timed out, a
    5xx, a 403). The replica may then be good, and a restore test must not say otherwise."""

    replica_at_fault = True
    mismatched: Path | None = None


class ShortObject(OSError):
    """The store answered a range in full but with fewer bytes: the object is shorter
    than recorded."""


def _replica_at_fault(exc: OSError) -> bool:
    """Only an answer about the object itself says the copy is bad: it is gone (404, 410),
    shorter than recorded (416, or a complete answer with fewer bytes)."""
    if isinstance(exc, ShortObject):
        return True
    return isinstance(exc, urllib.error.HTTPError) and exc.code in (404, 410, 416)


def _safe_relative(path: str) -> PurePosixPath:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise RestoreError(f"refusing file path {path!r}: not a relative path without '..'")
    return pure


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _pwrite(fd: int, view: memoryview, offset: int) -> None:
    if os.pwrite(fd, view, offset) != len(view):
        raise OSError(f"short write at byte {offset}")


def _get_range_into(
    opener, url: str, start: int, view: memoryview, fd: int, timeout: float, at: int
) -> None:
    """Fills `view` with the object's bytes from `start` (no new buffer) and writes them
    at offset `at` of `fd`, a PIECE at a time."""
    end = start + len(view) - 1
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end}"})  # noqa: S310 (a presigned http(s) URL from the server)
    got = 0
    with opener(request, timeout=timeout) as response:
        if getattr(response, "status", 206) == 200 and (start, end) != (0, len(view) - 1):
            # The server ignored the range and sent the whole object: take our part of it.
            part = response.read()[start : end + 1]
            view[: len(part)] = part
            got = len(part)
            _pwrite(fd, view[:got], at)
        else:
            while got < len(view) and (n := response.readinto(view[got : got + PIECE])):
                _pwrite(fd, view[got : got + n], at + got)
                got += n
    if got != len(view):
        raise ShortObject(f"bytes {start}-{end}: got {got} bytes")


def _fetch_small(opener, url: str, out, digest, advance: Callable[[int], None], timeout: float):
    """One GET, hashed and written in order: a file of one part needs no threads."""
    with opener(url, timeout=timeout) as response:  # noqa: S310 (as above)
        while chunk := response.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            advance(len(chunk))


def _ranges(entry: dict) -> list[tuple[str, int, int, int]]:
    """(url, start in the object, length, offset in the file) of each ranged GET: a
    CHUNK at a time of the file's object, or of each of its pieces in turn."""
    size = int(entry["size"])
    objects = (
        [(p["url"], int(p["size"])) for p in entry["pieces"]]
        if entry.get("pieces")
        else [(entry["url"], size)]
    )
    if sum(n for _, n in objects) != size or any(n < 0 for _, n in objects):
        raise ShortObject(f"its pieces do not add up to its {size:,} bytes")
    ranges, at = [], 0
    for url, length in objects:
        ranges += [(url, s, min(CHUNK, length - s), at + s) for s in range(0, length, CHUNK)]
        at += length
    return ranges


def _fetch_parallel(
    opener, ranges: list[tuple[str, int, int, int]], out, digest,
    advance: Callable[[int], None], timeout: float, parallel: int,
) -> None:  # fmt: skip
    """Ranged GETs on `parallel` threads, each writing its part at its offset as it comes;
    this thread hashes the parts in order as they complete. A buffer goes back to the
    pool only once it is hashed, so at most `window` parts are in memory."""
    window = min(len(ranges), parallel * 2)
    free: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(window):
        free.put(bytearray(CHUNK))
    fd = out.fileno()

    def fetch(url: str, start: int, length: int, at: int) -> memoryview:
        view = memoryview(free.get())[:length]
        _get_range_into(opener, url, start, view, fd, timeout, at)
        return view

    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="lifeboat-get") as pool:
        pending = deque(pool.submit(fetch, *r) for r in ranges[:window])
        following = window
        try:
            while pending:
                view = pending.popleft().result()
                digest.update(view)  # releases the GIL: the fetches go on meanwhile
                advance(len(view))
                free.put(view.obj)
                if following < len(ranges):
                    pending.append(pool.submit(fetch, *ranges[following]))
                    following += 1
        except BaseException:
            # Parts not yet started are dropped; the running ones end within `timeout`.
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _fetch_one(
    entry: dict, dest: Path, advance: Callable[[int], None], *, timeout: float, opener,
    parallel: int, durable: bool, keep_mismatched: bool = False,
) -> Path:  # fmt: skip
    """One file, verified, moved into place; skipped if it is there already, whole."""
    final = dest.joinpath(*_safe_relative(entry["path"]).parts)
    final.parent.mkdir(parents=True, exist_ok=True)
    size, sha = int(entry["size"]), entry["sha256"]
    if final.is_file() and final.stat().st_size == size and sha256_of(final) == sha:
        advance(size)
        return final
    partial = final.with_name(final.name + ".partial")
    digest = hashlib.sha256()
    got = 0

    def counted(n: int) -> None:
        nonlocal got
        got += n
        advance(n)

    try:
        with partial.open("wb") as out:
            if not entry.get("pieces") and (size <= CHUNK or parallel <= 1):
                _fetch_small(opener, entry["url"], out, digest, counted, timeout)
            else:  # a large file, or one cut in pieces: ranged GETs, hashed in order
                ranges = _ranges(entry)
                _fetch_parallel(opener, ranges, out, digest, counted, timeout, max(parallel, 1))
            out.flush()
            if durable:
                os.fsync(out.fileno())
    except OSError as exc:
        partial.unlink(missing_ok=True)
        error = RestoreError(f"could not fetch {entry['path']}: {exc}")
        error.replica_at_fault = _replica_at_fault(exc)
        raise error from exc
    if got != size or digest.hexdigest() != sha:
        error = RestoreError(
            f"{entry['path']} does not match its sha256: expected {size:,} bytes with "
            f"sha256 {sha[:12]}…, got {got:,} bytes with {digest.hexdigest()[:12]}…"
        )
        if keep_mismatched:  # as evidence, for the caller to say what in it differs
            error.mismatched = partial.rename(final.with_name(final.name + ".mismatched"))
        else:
            partial.unlink(missing_ok=True)
        raise error
    shutil.move(partial, final)
    return final


def _place(dest: Path, entry: dict) -> tuple[Path, Path]:
    final = dest.joinpath(*_safe_relative(entry["path"]).parts)
    final.parent.mkdir(parents=True, exist_ok=True)
    return final, final.with_name(final.name + ".partial")


def _fetch_pack(
    group: list[dict], dest: Path, advance: Callable[[int], None], *, timeout: float, opener,
    durable: bool, keep_mismatched: bool = False,
) -> dict[int, Path]:  # fmt: skip
    """The files of one pack (entries with `offset`, the same `url`; `_index` their place
    in the caller's list): one ranged GET from the first wanted byte to the last, each
    file cut from the stream in offset order, hashed and verified as it is written. Two
    entries at the same offset (the same bytes under two paths) are read once."""
    written: dict[int, Path] = {}
    wanted = []
    for entry in sorted(group, key=lambda e: (int(e["offset"]), e["_index"])):
        final, _ = _place(dest, entry)
        size = int(entry["size"])
        if final.is_file() and final.stat().st_size == size and sha256_of(final) == entry["sha256"]:
            advance(size)
            written[entry["_index"]] = final
        else:
            wanted.append(entry)
    if not wanted:
        return written
    start = int(wanted[0]["offset"])
    end = max(int(e["offset"]) + int(e["size"]) for e in wanted) - 1
    request = urllib.request.Request(wanted[0]["url"], headers={"Range": f"bytes={start}-{end}"})  # noqa: S310 (a presigned http(s) URL from the server)
    by_place: dict[tuple[int, int], Path] = {}
    current = wanted[0]
    try:
        with opener(request, timeout=timeout) as response:
            position = 0 if getattr(response, "status", 206) == 200 else start  # range ignored
            for entry in wanted:
                current = entry
                offset, size = int(entry["offset"]), int(entry["size"])
                final, partial = _place(dest, entry)
                if (offset, size) in by_place:
                    shutil.copyfile(by_place[(offset, size)], partial)
                    got, sha = size, sha256_of(partial)
                    advance(size)
                else:
                    if offset < position:
                        raise RestoreError(f"{entry['path']}: overlapping entries in its pack")
                    while position < offset:  # a file of the pack this copy does not use
                        skipped = response.read(min(CHUNK, offset - position))
                        if not skipped:
                            raise ShortObject(f"the pack ends at byte {position}")
                        position += len(skipped)
                    digest, got = hashlib.sha256(), 0
                    with partial.open("wb") as out:
                        while got < size and (chunk := response.read(min(PIECE, size - got))):
                            digest.update(chunk)
                            out.write(chunk)
                            got += len(chunk)
                            advance(len(chunk))
                        if durable:
                            out.flush()
                            os.fsync(out.fileno())
                    position += got
                    sha = digest.hexdigest()
                if got != size or sha != entry["sha256"]:
                    error = RestoreError(
                        f"{entry['path']} does not match its sha256: expected {size:,} bytes "
                        f"with sha256 {entry['sha256'][:12]}…, got {got:,} bytes with "
                        f"{sha[:12]}…"
                    )
                    if keep_mismatched:
                        kept = final.with_name(final.name + ".mismatched")
                        error.mismatched = partial.rename(kept)
                    else:
                        partial.unlink(missing_ok=True)
                    raise error
                shutil.move(partial, final)
                by_place[(offset, size)] = final
                written[entry["_index"]] = final
    except OSError as exc:
        _, partial = _place(dest, current)
        partial.unlink(missing_ok=True)
        error = RestoreError(f"could not fetch {current['path']}: {exc}")
        error.replica_at_fault = _replica_at_fault(exc)
        raise error from exc
    return written


def download_files(
    files: Iterable[dict],
    dest: str | os.PathLike,
    progress: Callable[[int, int], None] | None = None,
    *,
    timeout: float = 60,
    opener: Callable = urllib.request.urlopen,
    parallel: int = PARALLEL,
    durable: bool = True,
    keep_mismatched: bool = False,
) -> list[Path]:
    """Fetch every {path, size, sha256, url} into `dest`, verified; a file with an
    `offset` is `size` bytes from there in the object at `url` (a pack of small files,
    fetched with one ranged GET for all of its files listed); a file with `pieces`
    ([{url, size}]) instead of a `url` is their bytes one after the other (a large file
    cut at tensor boundaries), its sha256 checked whole. `progress(done, total)` is called
    on the calling thread, about every PROGRESS_S and at the end.
    Returns the files' paths, in the order given. `durable` fsyncs each file before it
    is moved into place: what a job will resume from must survive a crash of the
    machine; a restore test's scratch copy, deleted at once, need not. With
    `keep_mismatched`, a file whose bytes do not match is kept beside where it would have
    gone (`<name>.mismatched`, the error's `mismatched`), for the caller to examine.

    A sharded checkpoint's files are fetched at once: up to `parallel` files, each on
    its own thread that hashes it as it comes (the shards' sha256 spread over the
    cores); a file gets ranged GETs of its own only with the threads left over (one
    large file: all of them). The first file that fails stops the files not yet begun,
    and its error, naming it, is raised."""
    files = list(files)
    total = sum(int(f["size"]) for f in files)
    dest = Path(dest)
    # The work: each file alone, and each pack's files together (one GET a pack).
    units: list[list[dict]] = []
    packs: dict[str, list[dict]] = {}
    for index, entry in enumerate(files):
        one = {**entry, "_index": index}
        if entry.get("offset") is None:
            units.append([one])
        elif entry["url"] in packs:
            packs[entry["url"]].append(one)
        else:
            packs[entry["url"]] = [one]
            units.append(packs[entry["url"]])
    threads = max(1, min(parallel, len(units)))
    per_file = max(1, parallel // threads)
    lock = threading.Lock()
    done = [0]

    def advance(n: int) -> None:
        with lock:
            done[0] += n

    written: list[Path | None] = [None] * len(files)
    queue_ = iter(units)
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            with lock:
                unit = next(queue_, None)
            if unit is None:
                return
            try:
                if "offset" in unit[0] and unit[0]["offset"] is not None:
                    for index, path in _fetch_pack(
                        unit, dest, advance, timeout=timeout, opener=opener,
                        durable=durable, keep_mismatched=keep_mismatched,
                    ).items():  # fmt: skip
                        written[index] = path
                    continue
                written[unit[0]["_index"]] = _fetch_one(
                    unit[0], dest, advance, timeout=timeout, opener=opener,
                    parallel=per_file, durable=durable, keep_mismatched=keep_mismatched,
                )  # fmt: skip
            except BaseException:
                stop.set()
                raise

    reported = -1
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lifeboat-file") as pool:
        futures = [pool.submit(worker) for _ in range(threads)]
        pending = set(futures)
        try:
            while pending:
                _, pending = wait(pending, timeout=PROGRESS_S, return_when=FIRST_EXCEPTION)
                if progress and done[0] != reported:
                    reported = done[0]
                    progress(reported, total)
                if stop.is_set():
                    break
        finally:
            stop.set()
    for future in futures:
        if future.exception() is not None:
            raise future.exception()
    if progress and done[0] != reported:
        progress(done[0], total)
    return [path for path in written if path is not None]
