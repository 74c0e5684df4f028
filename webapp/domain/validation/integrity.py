"""Integrity: every file of a checkpoint exists where it may be read, has the size the
job reported, and the sha256 it reported, read in one streaming pass.

A checkpoint's `location` is a directory, or a single file whose own name is the one
entry of `files`. It must lie under one of the project's allowed roots: every file is
opened by walking from the root's descriptor, one component at a time without letting
the kernel follow a symlink (webapp/domain/confined_files.py), so a path that leaves the
roots by `..` or by a symlink at any level, even one swapped in during the check, is
refused, never read. Files fetched from S3 are written under the worker's scratch
directory the same way.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from botocore.exceptions import ClientError
from django.conf import settings

from lifeboat.units import human_size
from webapp.domain import confined_files

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
        out: dict[str, str | list[str]] = {
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
        }
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
    # check_local(keep_open=True): relative path -> open descriptor of the checked file.
    handles: dict[str, int] = field(default_factory=dict)

    def close(self) -> None:
        for fd in self.handles.values():
            os.close(fd)
        self.handles.clear()

    @property
    def ok(self) -> bool:
        return not any(f.severity in ("corrupt", "missing", "refused") for f in self.findings)


Progress = Callable[[int], None]


def hash_fd(fd: int, progress: Progress | None = None) -> tuple[str, int]:
    """sha256 and byte count of an open file, read once in large chunks from its start."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    total = 0
    while n := os.preadv(fd, [buffer], total):
        digest.update(view[:n])
        total += n
        if progress:
            progress(n)
    return digest.hexdigest(), total


def hash_file(path: str, progress: Progress | None = None) -> tuple[str, int]:
    """sha256 and byte count of a file the worker names itself (not a job's path: those
    are opened with confined_files)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return hash_fd(fd, progress)
    finally:
        os.close(fd)


def check_local(
    location: str,
    files: list[FileSpec],
    allowed_roots: list[str],
    progress: Progress | None = None,
    *,
    keep_open: bool = False,
    workers: int = 1,
    only: set[str] | None = None,
) -> IntegrityReport:
    """Every file opened by walking from an allowed root's descriptor
    (confined_files): what is hashed is what was checked. With `keep_open`, the
    descriptors of the files that passed stay open in report.handles for the caller
    to read the same files from (report.close() closes them).

    The files are opened one after another (the confined walk), then hashed by up to
    `workers` threads at once: sha256 and the reads release the GIL, so a many-file
    checkpoint is hashed on as many cores as it has files. `progress(n)` is called from
    those threads (with `file=` when it accepts it, see checking.FileProgress).

    `only` (one part of a fanned-out validation): hash and report just these files; the
    others are opened by the same confined walk and, with keep_open, kept for the
    inspection's cross-file checks (their own part hashes them)."""
    started = time.perf_counter()
    report = IntegrityReport()
    with confined_files.Tree(allowed_roots) as tree:
        try:
            place = tree.locate(location, "location")
            info = tree.stat(place)
        except confined_files.Refused as exc:
            report.findings.append(Finding("refused", "outside_allowed_roots", str(exc)))
            return report
        except (FileNotFoundError, NotADirectoryError):
            report.findings.append(
                Finding("missing", "location_missing", f"{location} does not exist (any more)")
            )
            return report
        is_dir = stat.S_ISDIR(info.st_mode)
        report.base = location.rstrip("/") if is_dir else os.path.dirname(location.rstrip("/"))
        report.single_file = not is_dir
        if not is_dir and (len(files) != 1 or files[0].path != place.name):
            report.findings.append(
                Finding(
                    "corrupt",
                    "files_do_not_match_location",
                    f"{location} is a single file, but the job reported "
                    f"{len(files)} files ({', '.join(f.path for f in files[:3])})",
                )
            )
            return report
        opened: list[tuple[FileSpec, int | Finding]] = []
        try:
            for spec in files:
                opened.append((spec, _open_one(tree, place, is_dir, spec)))
        except BaseException:
            for _, fd in opened:
                if isinstance(fd, int):
                    os.close(fd)
            raise
    if only is not None:
        opened = [(spec, fd) for spec, fd in opened if spec.path in only or isinstance(fd, int)]
    _hash_all(opened, report, progress, keep_open, workers, only)
    report.seconds = time.perf_counter() - started
    return report


def _open_one(tree, place, is_dir: bool, spec: FileSpec) -> int | Finding:
    try:
        file_place = place.join(spec.path, "file path") if is_dir else place
    except confined_files.Refused as exc:
        return Finding("refused", "path_escapes", str(exc), spec.path)
    try:
        return tree.open_read(file_place)
    except confined_files.Refused as exc:
        if exc.kind == "type":
            return Finding("corrupt", "not_a_file", f"{spec.path} is not a regular file", spec.path)
        return Finding(
            "refused",
            "symlink_escapes" if exc.kind == "symlink" else "path_escapes",
            f"{spec.path}: {exc}",
            spec.path,
        )
    except (FileNotFoundError, NotADirectoryError):
        return Finding("missing", "file_missing", f"{spec.path} is missing", spec.path)
    except IsADirectoryError:
        return Finding("corrupt", "not_a_file", f"{spec.path} is not a regular file", spec.path)
    except OSError as exc:
        return Finding("corrupt", "unreadable", f"{spec.path} cannot be read: {exc}", spec.path)


def _hash_all(opened, report: IntegrityReport, progress, keep_open, workers, only) -> None:
    """Hashes the opened files, `workers` at a time; findings in the order of `opened`."""
    lock = threading.Lock()

    def one(item) -> list[Finding]:
        spec, fd = item
        if isinstance(fd, Finding):
            return [fd]
        if only is not None and spec.path not in only:
            with lock:
                if keep_open:
                    report.handles[spec.path] = fd
                else:
                    os.close(fd)
            return []
        try:
            per_file = _file_progress(progress, spec.path)
            problem = _hash_and_compare(fd, spec, report, per_file, lock)
        except BaseException:
            os.close(fd)
            raise
        if problem or not keep_open:
            os.close(fd)
        else:
            with lock:
                report.handles[spec.path] = fd
        if progress is not None and hasattr(progress, "file_done"):
            progress.file_done(spec.path, spec.size)
        return problem

    workers = max(1, min(workers, len(opened)))
    try:
        if workers == 1:
            results = [one(item) for item in opened]
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="lifeboat-hash") as pool:
                results = list(pool.map(one, opened))
    except BaseException:
        report.close()
        raise
    for found in results:
        report.findings.extend(found)


def _file_progress(progress, path: str):
    if progress is None or not hasattr(progress, "file_done"):
        return progress
    return lambda n: progress(n, file=path)


def hole_bytes(fd: int, size: int) -> int:
    """Bytes of the file's holes (never written: no disk behind them), found with
    SEEK_DATA without reading them. 0 where the file system cannot tell."""
    if os.fstat(fd).st_blocks * 512 >= size:
        return 0  # every byte has a block (the common case: one fstat)
    holes = position = 0
    while position < size:
        try:
            data = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after `position`: a hole to the end
                return holes + size - position
            return 0  # SEEK_DATA not supported here
        holes += data - position
        position = os.lseek(fd, data, os.SEEK_HOLE)
    return holes


def _hash_and_compare(fd: int, spec: FileSpec, report: IntegrityReport, progress, lock=None):
    size = os.fstat(fd).st_size
    if size != spec.size:
        what = "truncated" if size < spec.size else "larger than reported"
        return [
            Finding(
                "corrupt",
                "size_mismatch",
                f"{spec.path} is {what}: {size:,} bytes on disk, {spec.size:,} reported by the job",
                spec.path,
            )
        ]
    holes = hole_bytes(fd, size)
    if holes >= settings.VALIDATION_SPARSE_HOLE_BYTES:
        # A checkpoint writer writes every byte; a file of holes is declared, not
        # written, and hashing its zeros (a terabyte costs nothing on disk) would hold a
        # worker for hours. Not hashed: reported with the reason.
        return [
            Finding(
                "suspicious",
                "sparse",
                f"{spec.path} is sparse: {human_size(size)} declared, "
                f"{human_size(size - holes)} stored on disk ({human_size(holes)} never "
                "written); not hashed",
                spec.path,
            )
        ]
    try:
        digest, n = hash_fd(fd, progress)
    except OSError as exc:
        return [Finding("corrupt", "unreadable", f"{spec.path} cannot be read: {exc}", spec.path)]
    with lock or contextlib.nullcontext():
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
    *,
    workers: int = 1,
) -> IntegrityReport:
    """Stream each object through sha256 into `scratch` (one pass over the network),
    so the load check can then read the same bytes from local disk; up to `workers`
    objects at once (an object store serves one stream slowly and several quickly)."""
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
    lock = threading.Lock()
    # The job names the files: each is written under `scratch` by a confined walk, so a
    # path with '..', an absolute path or a symlink in scratch cannot write elsewhere.
    with confined_files.Tree([scratch]) as tree:
        top = tree.locate(scratch)

        def one(spec: FileSpec) -> list[Finding]:
            try:
                target = top.join(spec.path, "file path")
            except confined_files.Refused as exc:
                return [Finding("refused", "path_escapes", str(exc), spec.path)]
            key = prefix if single else prefix.rstrip("/") + "/" + spec.path
            per_file = _file_progress(progress, spec.path)
            found = _fetch_one(client, bucket, key, spec, tree, target, report, per_file, lock)
            if progress is not None and hasattr(progress, "file_done"):
                progress.file_done(spec.path, spec.size)
            return found

        workers = max(1, min(workers, len(files)))
        if workers == 1:
            results = [one(spec) for spec in files]
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="lifeboat-fetch") as pool:
                results = list(pool.map(one, files))
    for found in results:  # in the order of the files, however they finished
        report.findings.extend(found)
    report.seconds = time.perf_counter() - started
    return report


def _fetch_one(client, bucket, key, spec: FileSpec, tree, target, report, progress, lock):
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
    try:
        fd = tree.create_file(target, replace=True)
    except (confined_files.Refused, OSError) as exc:
        return [Finding("refused", "path_escapes", f"{spec.path}: {exc}", spec.path)]
    with os.fdopen(fd, "wb") as out:
        for chunk in response["Body"].iter_chunks(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            total += len(chunk)
            if progress:
                progress(len(chunk))
    with lock:
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
