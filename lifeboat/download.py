"""Verified download of a checkpoint's files from URLs (presigned S3 GETs).

Standard library only, on purpose: the `lifeboat` client (`lifeboat.latest`) and the
server's restore path (restore tests, resume) use this same code. Each file is written to
`<path>.partial` and moved into place only when its size and sha256 match; a file already
in place with the right size and sha256 is not fetched again, so an interrupted restore
picks up where it stopped.

A large file is fetched as several ranged GETs at once (object stores serve one stream
slowly and many quickly, which is what boto3's download_file does too), while one thread
takes the parts in order, hashes them and writes them: sha256 in the same pass as the
download, one read of the bytes, and at most `parallel * 2` parts held in memory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

CHUNK = 8 * 1024 * 1024  # one ranged GET
# Ranged GETs at once: measured on 2 cores against SeaweedFS, 4 fetched 512 MiB in
# 1.12 s, 8 in 1.47 s (the hashing thread starves), 1 in 1.94 s; boto3 0.93 s.
PARALLEL = max(4, min(8, os.cpu_count() or 4))


class RestoreError(Exception):
    """A file could not be fetched, or its bytes do not match its sha256."""


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


def _get_range(opener, url: str, start: int, end: int, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end}"})  # noqa: S310 (a presigned http(s) URL from the server)
    with opener(request, timeout=timeout) as response:
        data = response.read()
    if getattr(response, "status", 206) == 200 and (start, end) != (0, len(data) - 1):
        # The server ignored the range and sent the whole object: take our part of it.
        data = data[start : end + 1]
    if len(data) != end - start + 1:
        raise OSError(f"bytes {start}-{end}: got {len(data)} bytes")
    return data


def _stream(opener, url: str, size: int, timeout: float, parallel: int):
    """The object's bytes in order, as chunks; ranged GETs in parallel for a big one."""
    if size <= CHUNK or parallel <= 1:
        with opener(url, timeout=timeout) as response:  # noqa: S310 (as above)
            while chunk := response.read(CHUNK):
                yield chunk
        return
    ranges = [(start, min(start + CHUNK, size) - 1) for start in range(0, size, CHUNK)]
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="lifeboat-get") as pool:
        window = parallel * 2
        futures = [pool.submit(_get_range, opener, url, s, e, timeout) for s, e in ranges[:window]]
        for index in range(len(ranges)):
            chunk = futures[index].result()
            futures[index] = None  # let the part go once it is written
            following = index + window
            if following < len(ranges):
                s, e = ranges[following]
                futures.append(pool.submit(_get_range, opener, url, s, e, timeout))
            yield chunk


def download_files(
    files: Iterable[dict],
    dest: str | os.PathLike,
    progress: Callable[[int, int], None] | None = None,
    *,
    timeout: float = 60,
    opener: Callable = urllib.request.urlopen,
    parallel: int = PARALLEL,
    durable: bool = True,
) -> list[Path]:
    """Fetch every {path, size, sha256, url} into `dest`, verified. `progress(done,
    total)` is called after every chunk. Returns the files' paths. `durable` fsyncs each
    file before it is moved into place: what a job will resume from must survive a crash
    of the machine; a restore test's scratch copy, deleted at once, need not."""
    files = list(files)
    total = sum(int(f["size"]) for f in files)
    done = 0
    dest = Path(dest)
    written = []
    for entry in files:
        final = dest.joinpath(*_safe_relative(entry["path"]).parts)
        final.parent.mkdir(parents=True, exist_ok=True)
        size, sha = int(entry["size"]), entry["sha256"]
        if final.is_file() and final.stat().st_size == size and sha256_of(final) == sha:
            done += size
            if progress:
                progress(done, total)
            written.append(final)
            continue
        partial = final.with_name(final.name + ".partial")
        digest = hashlib.sha256()
        got = 0
        try:
            with partial.open("wb") as out:
                for chunk in _stream(opener, entry["url"], size, timeout, parallel):
                    digest.update(chunk)
                    out.write(chunk)
                    got += len(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
                out.flush()
                if durable:
                    os.fsync(out.fileno())
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise RestoreError(f"could not fetch {entry['path']}: {exc}") from exc
        if got != size or digest.hexdigest() != sha:
            partial.unlink(missing_ok=True)
            raise RestoreError(
                f"{entry['path']} does not match its sha256: expected {size:,} bytes with "
                f"sha256 {sha[:12]}…, got {got:,} bytes with {digest.hexdigest()[:12]}…"
            )
        shutil.move(partial, final)
        written.append(final)
    return written
