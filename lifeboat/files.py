"""The file list of a checkpoint: relative paths, sizes and sha256, as the contract wants."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CHUNK = 1024 * 1024


def hash_file(path: str | os.PathLike) -> tuple[str, int]:
    """(sha256, size) of the bytes actually read, so the two always agree even if the
    file changed on disk meanwhile. hashlib releases the GIL on big updates, so the
    training loop keeps running while a background thread hashes gigabytes."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    size = 0
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            size += count
    return digest.hexdigest(), size


def sha256_of(path: str | os.PathLike) -> str:
    return hash_file(path)[0]


def list_files(location: str | os.PathLike) -> list[Path]:
    """The regular files of a checkpoint: the file itself, or every file under the
    directory (symlinks not followed: the server would refuse to follow them too)."""
    root = Path(location)
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


def describe(location: str | os.PathLike) -> list[dict]:
    """[{path, size, sha256}] for a checkpoint file or directory; paths relative to the
    directory (for a single file, its own name), with '/' as separator."""
    root = Path(location)
    files = list_files(root)
    base = root.parent if root.is_file() else root
    described = []
    for path in files:
        sha256, size = hash_file(path)
        relative = path.relative_to(base).as_posix()
        described.append({"path": relative, "size": size, "sha256": sha256})
    return described


def total_size(location: str | os.PathLike) -> int:
    return sum(path.stat().st_size for path in list_files(location))
