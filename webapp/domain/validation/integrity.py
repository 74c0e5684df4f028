"""Integrity: every file of a checkpoint exists where it may be read, has the size the
job reported, and the sha256 it reported, read in one streaming pass.

A checkpoint's `location` is a directory, or a single file whose own name is the one
entry of `files`. It must lie under one of the project's allowed roots, after resolving
symlinks: a path that leaves the roots by `..` or by a symlink is refused, never read.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

CHUNK = 8 * 1024 * 1024  # large reads: hashlib releases the GIL and the disk streams


@dataclass
class FileSpec:
    path: str
    size: int
    sha256: str


@dataclass
class Finding:
    """One thing a check found. severity: corrupt, missing, suspicious or info."""

    severity: str
    code: str
    message: str
    file: str = ""
    tensors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        out = {"severity": self.severity, "code": self.code, "message": self.message}
        if self.file:
            out["file"] = self.file
        if self.tensors:
            out["tensors"] = self.tensors
        return out


@dataclass
class IntegrityReport:
    findings: list[Finding] = field(default_factory=list)
    bytes_read: int = 0
    seconds: float = 0.0
    # Where the files can be read now (a local directory); None when nothing can be.
    base: str | None = None
    single_file: bool = False

    @property
    def ok(self) -> bool:
        return not any(f.severity in ("corrupt", "missing", "refused") for f in self.findings)


Progress = Callable[[int], None]


class LocationRefused(Exception):
    """The location is outside every allowed root; nothing is read."""


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def resolve_local(location: str, allowed_roots: list[str]) -> str:
    """The real path of `location`, or LocationRefused if it is not under a root."""
    roots = [os.path.realpath(r) for r in allowed_roots if r.startswith("/")]
    if not roots:
        raise LocationRefused(
            "the project has no allowed root directories, so no checkpoint file may be read"
        )
    pure = PurePosixPath(location)
    if not pure.is_absolute() or ".." in pure.parts:
        raise LocationRefused(f"{location} is not an absolute path without '..'")
    if not _inside(os.path.normpath(location), [os.path.normpath(r) for r in allowed_roots]):
        raise LocationRefused(
            f"{location} is outside the project's allowed roots ({', '.join(allowed_roots)})"
        )
    real = os.path.realpath(location)
    if not _inside(real, roots):
        raise LocationRefused(
            f"{location} leads by a symlink to {real}, outside the project's allowed roots "
            f"({', '.join(allowed_roots)})"
        )
    return real


def hash_file(path: str, progress: Progress | None = None) -> tuple[str, int]:
    """sha256 and byte count of a file, read once in large chunks."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    total = 0
    # O_NOFOLLOW: the last component was checked not to be a symlink out of the root;
    # refuse it if it was swapped for one since.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])
            total += n
            if progress:
                progress(n)
    return digest.hexdigest(), total


def check_local(
    location: str,
    files: list[FileSpec],
    allowed_roots: list[str],
    progress: Progress | None = None,
) -> IntegrityReport:
    started = time.perf_counter()
    report = IntegrityReport()
    try:
        real = resolve_local(location, allowed_roots)
    except LocationRefused as exc:
        report.findings.append(Finding("refused", "outside_allowed_roots", str(exc)))
        return report
    if not os.path.exists(real):
        report.findings.append(
            Finding("missing", "location_missing", f"{location} does not exist (any more)")
        )
        return report
    roots = [os.path.realpath(r) for r in allowed_roots if r.startswith("/")]
    is_dir = os.path.isdir(real)
    base = real if is_dir else os.path.dirname(real)
    report.base, report.single_file = base, not is_dir
    if not is_dir and (len(files) != 1 or files[0].path != os.path.basename(real)):
        report.findings.append(
            Finding(
                "corrupt",
                "files_do_not_match_location",
                f"{location} is a single file, but the job reported "
                f"{len(files)} files ({', '.join(f.path for f in files[:3])})",
            )
        )
        return report
    for spec in files:
        report.findings.extend(_check_one(base, spec, roots, report, progress))
    report.seconds = time.perf_counter() - started
    return report


def _check_one(base, spec: FileSpec, roots, report: IntegrityReport, progress) -> list[Finding]:
    rel = PurePosixPath(spec.path)
    if rel.is_absolute() or ".." in rel.parts:
        message = f"{spec.path} is not a relative path without '..'"
        return [Finding("refused", "path_escapes", message, spec.path)]
    path = os.path.join(base, spec.path)
    real = os.path.realpath(path)
    if not _inside(real, roots):
        return [
            Finding(
                "refused",
                "symlink_escapes",
                f"{spec.path} is a symlink to {real}, outside the project's allowed roots; "
                "it was not read",
                spec.path,
            )
        ]
    try:
        info = os.stat(real)
    except FileNotFoundError:
        return [Finding("missing", "file_missing", f"{spec.path} is missing", spec.path)]
    if not stat.S_ISREG(info.st_mode):
        return [Finding("corrupt", "not_a_file", f"{spec.path} is not a regular file", spec.path)]
    if info.st_size != spec.size:
        what = "truncated" if info.st_size < spec.size else "larger than reported"
        return [
            Finding(
                "corrupt",
                "size_mismatch",
                f"{spec.path} is {what}: {info.st_size:,} bytes on disk, "
                f"{spec.size:,} reported by the job",
                spec.path,
            )
        ]
    try:
        digest, n = hash_file(real, progress)
    except OSError as exc:
        return [Finding("corrupt", "unreadable", f"{spec.path} cannot be read: {exc}", spec.path)]
    report.bytes_read += n
    if n != spec.size:
        return [
            Finding(
                "corrupt",
                "size_changed",
                f"{spec.path} changed size while it was read ({n:,} bytes read)",
                spec.path,
            )
        ]
    if digest != spec.sha256:
        return [
            Finding(
                "corrupt",
                "checksum_mismatch",
                f"{spec.path} does not match its sha256: the bytes changed after the job "
                f"wrote them (expected {spec.sha256[:12]}…, read {digest[:12]}…)",
                spec.path,
            )
        ]
    return []


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def s3_allowed(location: str, allowed_roots: list[str]) -> bool:
    bucket, key = split_s3(location)
    for root in allowed_roots:
        if not root.startswith("s3://"):
            continue
        root_bucket, root_key = split_s3(root)
        if bucket == root_bucket and (not root_key or key.startswith(root_key.rstrip("/") + "/")):
            return True
    return False


def check_s3(
    location: str,
    files: list[FileSpec],
    allowed_roots: list[str],
    client,
    scratch: str,
    progress: Progress | None = None,
) -> IntegrityReport:
    """Stream each object through sha256 into `scratch` (one pass over the network),
    so the load check can then read the same bytes from local disk."""
    started = time.perf_counter()
    report = IntegrityReport()
    if ".." in location.split("/") or not s3_allowed(location, allowed_roots):
        report.findings.append(
            Finding(
                "refused",
                "outside_allowed_roots",
                f"{location} is not under an s3:// allowed root of the project "
                f"({', '.join(r for r in allowed_roots if r.startswith('s3://')) or 'none'})",
            )
        )
        return report
    bucket, prefix = split_s3(location)
    single = len(files) == 1 and prefix.rstrip("/").endswith("/" + files[0].path)
    report.base, report.single_file = scratch, single
    for spec in files:
        key = prefix if single else prefix.rstrip("/") + "/" + spec.path
        target = os.path.join(scratch, spec.path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        report.findings.extend(_fetch_one(client, bucket, key, spec, target, report, progress))
    report.seconds = time.perf_counter() - started
    return report


def _fetch_one(client, bucket, key, spec: FileSpec, target, report, progress) -> list[Finding]:
    from botocore.exceptions import ClientError

    try:
        response = client.get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "404", "NotFound"):
            return [Finding("missing", "file_missing", f"{spec.path} is missing", spec.path)]
        raise
    if response["ContentLength"] != spec.size:
        return [
            Finding(
                "corrupt",
                "size_mismatch",
                f"{spec.path} is {response['ContentLength']:,} bytes in s3://{bucket}/{key}, "
                f"{spec.size:,} reported by the job",
                spec.path,
            )
        ]
    digest = hashlib.sha256()
    total = 0
    with open(target, "wb") as out:
        for chunk in response["Body"].iter_chunks(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            total += len(chunk)
            if progress:
                progress(len(chunk))
    report.bytes_read += total
    if digest.hexdigest() != spec.sha256 or total != spec.size:
        return [
            Finding(
                "corrupt",
                "checksum_mismatch",
                f"{spec.path} does not match its sha256: the object's bytes differ from what "
                "the job wrote",
                spec.path,
            )
        ]
    return []
