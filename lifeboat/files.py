"""The file list of a checkpoint: relative paths, sizes and sha256, as the contract wants."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

CHUNK = 1024 * 1024


def _read_hashing(handle, on_read: Callable[[int], None] | None) -> tuple[str, int]:
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    size = 0
    while count := handle.readinto(buffer):
        digest.update(view[:count])
        size += count
        if on_read is not None:
            on_read(count)
    return digest.hexdigest(), size


def hash_file(
    path: str | os.PathLike, on_read: Callable[[int], None] | None = None
) -> tuple[str, int]:
    """(sha256, size) of the bytes actually read, so the two always agree even if the
    file changed on disk meanwhile. hashlib releases the GIL on big updates, so the
    training loop keeps running while a background thread hashes gigabytes.
    `on_read(count)` is called after every chunk (a progress line)."""
    with open(path, "rb", buffering=0) as handle:
        return _read_hashing(handle, on_read)


class ChangedWhileHashing(Exception):
    """A file of a checkpoint was written to, replaced or removed while it was being
    hashed: the bytes read are not a file that exists on disk. The message says how."""


def hash_unchanged(
    path: str | os.PathLike, on_read: Callable[[int], None] | None = None
) -> tuple[str, int]:
    """(sha256, size) of a file that stayed the same while it was read: the bytes read
    equal its size when hashing began and when it ended, its mtime did not move, and its
    name still leads to the same file. Otherwise ChangedWhileHashing; FileNotFoundError
    if it is gone before it is opened."""
    with open(path, "rb", buffering=0) as handle:
        before = os.fstat(handle.fileno())
        sha256, size = _read_hashing(handle, on_read)
        after = os.fstat(handle.fileno())
    try:
        now = os.stat(path)
    except FileNotFoundError:
        raise ChangedWhileHashing(f"{path} was removed while it was being hashed") from None
    if size != before.st_size or after.st_size != before.st_size:
        raise ChangedWhileHashing(
            f"{path} changed size while it was being hashed: {before.st_size:,} bytes when "
            f"hashing began, {size:,} read, {after.st_size:,} at the end"
        )
    if after.st_mtime_ns != before.st_mtime_ns:
        raise ChangedWhileHashing(f"{path} was written to while it was being hashed")
    if not os.path.samestat(before, now):
        raise ChangedWhileHashing(f"{path} was replaced by another file while it was being hashed")
    return sha256, size


def sha256_of(path: str | os.PathLike) -> str:
    return hash_file(path)[0]


def _named_file(root: Path, name: str) -> Path:
    """The regular file `name` under the folder `root`, reached without a symlink."""
    path = root
    for part in name.split("/"):
        path = path / part
        if path.is_symlink():
            raise FileNotFoundError(f"{path} is a symlink (not followed, nor by the server)")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist or is not a regular file")
    return path


def list_files(location: str | os.PathLike, only: list[str] | None = None) -> list[Path]:
    """The regular files of a checkpoint: the file itself, or every file under the
    directory (symlinks not followed: the server would refuse to follow them too).
    `only` (paths relative to the directory): those files and no others, each of which
    must be there (one rank's part of a checkpoint, lifeboat/parts.py)."""
    root = Path(location)
    if only is not None:
        if not root.is_dir():
            raise FileNotFoundError(f"{root} does not exist or is not a folder")
        return [_named_file(root, name) for name in only]
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"{root} does not exist")
    found = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                found.append(path)
    if not found:
        raise FileNotFoundError(f"{root} holds no files")
    return found


def describe(
    location: str | os.PathLike,
    on_read: Callable[[int], None] | None = None,
    written: dict[str, dict] | None = None,
    only: list[str] | None = None,
) -> list[dict]:
    """[{path, size, sha256}] for a checkpoint file or directory; paths relative to the
    directory (for a single file, its own name), with '/' as separator. Raises
    FileNotFoundError if it (or a file in it) is gone, ChangedWhileHashing if a file
    changed while it was read: what is reported was on disk, whole, as it is.
    `written` maps paths to the {size, sha256} of the bytes the job wrote, hashed as
    they were written (HashingWriter): those files are not read again, and what is
    reported is what the job wrote, so a file changed on disk since is caught by the
    server's validation instead of being hashed as it now is. `only`: those files of
    the directory, no others (list_files)."""
    root = Path(location)
    files = list_files(root, only)
    base = root if only is not None else (root.parent if root.is_file() else root)
    described = []
    for path in files:
        relative = path.relative_to(base).as_posix()
        known = (written or {}).get(relative)
        if known is not None:
            sha256, size = known["sha256"], known["size"]
        else:
            sha256, size = hash_unchanged(path, on_read)
        described.append({"path": relative, "size": size, "sha256": sha256})
    return described


class HashingWriter:
    """A file object for torch.save that hashes the bytes as they are written: the
    checkpoint's sha256 without reading it back. Each buffer is hashed in write(), on the
    caller's thread, before it goes to the file: no copy and no thread of its own.
    (A hashing thread fed with copies was measured 4x costlier per save with every core
    training: bench/client_overhead.py, docs/client.md.) torch.save (zip format) only
    calls write() and flush(), in order; anything else (seek, tell, fileno...) is passed
    to the file but makes the digest unusable (`digest()` is then None, and the file is
    read and hashed as before)."""

    def __init__(self, handle):
        self._handle = handle
        self._sha = hashlib.sha256()
        self.size = 0
        self.sequential = True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self._sha.update(view)  # releases the GIL on large buffers
        self.size += len(view)
        return self._handle.write(view)

    def flush(self) -> None:
        self._handle.flush()

    def __getattr__(self, name: str):
        self.sequential = False
        return getattr(self._handle, name)

    def digest(self) -> dict | None:
        """{size, sha256} of what was written, or None if torch.save did more than write."""
        if not self.sequential:
            return None
        return {"size": self.size, "sha256": self._sha.hexdigest()}


def listing(location: str | os.PathLike, only: list[str] | None = None) -> dict[str, int]:
    """{path: size} of a checkpoint's files now, paths as describe() gives them."""
    root = Path(location)
    base = root if only is not None else (root.parent if root.is_file() else root)
    files = list_files(root, only)
    return {path.relative_to(base).as_posix(): path.stat().st_size for path in files}


class FilesGone(FileNotFoundError):
    """Files of a checkpoint that were there when hashing began are gone; names them."""


def compare_listing(then: dict[str, int], now: dict[str, int]) -> None:
    """Raise FilesGone if a file of `then` is missing from `now`, ChangedWhileHashing if
    one changed size or appeared; both name the files."""
    gone = sorted(set(then) - set(now))
    if gone:
        raise FilesGone(f"{', '.join(gone)} (there when hashing began)")
    changed = [
        f"{path} was {then[path]:,} bytes when hashing began and is {now[path]:,} now"
        for path in sorted(then)
        if then[path] != now[path]
    ]
    changed += [f"{path} appeared since hashing began" for path in sorted(set(now) - set(then))]
    if changed:
        raise ChangedWhileHashing("; ".join(changed))


def total_size(location: str | os.PathLike) -> int:
    return sum(path.stat().st_size for path in list_files(location))
