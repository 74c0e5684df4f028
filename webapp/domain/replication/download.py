"""Verified download of a checkpoint's files from URLs (presigned S3 GETs).

Standard library only, on purpose: the `lifeboat` client (stdlib-only at its core) and
the server's restore path use this same code. Each file is streamed to `<path>.partial`
through sha256 and moved into place only when its size and sha256 match; a file already
in place with the right size and sha256 is not fetched again, so an interrupted restore
picks up where it stopped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

CHUNK = 8 * 1024 * 1024


class RestoreError(Exception):
    """A file could not be fetched, or its bytes do not match its sha256."""


def _safe_relative(path: str) -> PurePosixPath:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise RestoreError(f"refusing file path {path!r}: not a relative path without '..'")
    return pure


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download_files(
    files: Iterable[dict],
    dest: str | os.PathLike,
    progress: Callable[[int, int], None] | None = None,
    *,
    timeout: float = 60,
    opener: Callable = urllib.request.urlopen,
) -> list[Path]:
    """Fetch every {path, size, sha256, url} into `dest`, verified. `progress(done,
    total)` is called after every chunk. Returns the files' paths."""
    files = list(files)
    total = sum(int(f["size"]) for f in files)
    done = 0
    dest = Path(dest)
    written = []
    for entry in files:
        final = dest.joinpath(*_safe_relative(entry["path"]).parts)
        final.parent.mkdir(parents=True, exist_ok=True)
        size, sha = int(entry["size"]), entry["sha256"]
        if final.is_file() and final.stat().st_size == size and _sha256_of(final) == sha:
            done += size
            if progress:
                progress(done, total)
            written.append(final)
            continue
        partial = final.with_name(final.name + ".partial")
        digest = hashlib.sha256()
        got = 0
        try:
            with opener(entry["url"], timeout=timeout) as response, partial.open("wb") as out:
                while chunk := response.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    got += len(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
                out.flush()
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
