"""One file to S3, hashed as it is sent.

The file is read once. Each part's bytes go into the file's running sha256 (in read
order) and, in a worker thread, into the part's own checksum (CRC32 or SHA256), which S3
checks on arrival: a part damaged on the way is refused by the server. The multipart
upload is completed only when the whole file's sha256 equals the one the checkpoint
recorded; otherwise it is aborted, so no object ever sits under a content address that
is not its content.
"""

from __future__ import annotations

import base64
import hashlib
import math
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

MAX_PARTS = 10_000  # S3's limit


class SourceChanged(Exception):
    """The bytes read differ from what the checkpoint recorded: permanent, never
    retried; the checkpoint is no longer what was verified."""


@dataclass
class Sent:
    sha256: str
    size: int


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


# The checksum S3 checks on each part. SHA256 costs a second hash of every byte on both
# ends; CRC32 (zlib, several GB/s) catches damage in transit as well at a fraction of
# the CPU. The file's own sha256 is computed either way, from the same bytes.
PART_CHECKSUMS = {
    "SHA256": lambda data: _b64(hashlib.sha256(data).digest()),
    "CRC32": lambda data: _b64(zlib.crc32(data).to_bytes(4, "big")),
}


def _read_exactly(source: BinaryIO, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = source.read(n - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Throttle:
    """Keeps the bytes sent per second under a limit (0: none)."""

    def __init__(self, bytes_per_s: int):
        self.rate = bytes_per_s
        self.start = time.monotonic()
        self.sent = 0
        self._lock = threading.Lock()

    def __call__(self, n: int) -> None:
        if not self.rate:
            return
        with self._lock:  # shared by the files sent at once
            self.sent += n
        ahead = self.sent / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


class Budget:
    """Bytes read from sources and not yet sent, shared by the files of a replica that
    are sent at once: a worker holds at most `limit` bytes of checkpoint in memory
    however many files and parts are on the wire. A request larger than the limit
    waits for the budget to be free and then takes all of it."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._cond = threading.Condition()

    def take(self, n: int) -> int:
        n = min(n, self.limit)
        with self._cond:
            while self.used + n > self.limit:
                self._cond.wait()
            self.used += n
        return n

    def give(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()


def _mismatch(name: str, expected_sha: str, expected_size: int, sha: str, size: int) -> str:
    if size != expected_size:
        return (
            f"{name} is {size:,} bytes now, not the {expected_size:,} that were verified: "
            "the file changed after validation"
        )
    return (
        f"{name} does not match its recorded sha256 (recorded {expected_sha[:12]}…, read "
        f"{sha[:12]}…): the file changed after validation"
    )


def upload(
    client,
    bucket: str,
    key: str,
    source: BinaryIO,
    *,
    name: str,
    size: int,
    sha256: str,
    part_size: int,
    concurrency: int,
    storage_class: str = "",
    progress: Callable[[int], None] | None = None,
    on_started: Callable[[str], None] | None = None,
    throttle: Throttle | None = None,
    part_checksum: str = "CRC32",
    budget: Budget | None = None,
) -> Sent:
    """Send `size` bytes of `source` to s3://bucket/key; raise SourceChanged unless
    they hash to `sha256`. `on_started(upload_id)` is called as soon as a multipart
    upload exists, so that a crash can be cleaned up after. `budget`, when given, is
    taken before each read and given back once those bytes are sent."""
    budget = budget or Budget(max(part_size, math.ceil(size / MAX_PARTS)) * (concurrency + 1))
    extra: dict[str, Any] = {"Metadata": {"sha256": sha256}}
    if storage_class:
        extra["StorageClass"] = storage_class
    # Larger parts for a file that would need more than S3's 10,000.
    part_size = max(part_size, math.ceil(size / MAX_PARTS))
    if size <= part_size:
        held = budget.take(size + 1)
        try:
            return _put_small(client, bucket, key, source, name, size, sha256, extra,
                              progress, throttle)  # fmt: skip
        finally:
            budget.give(held)
    return _multipart(
        client, bucket, key, source, name=name, size=size, sha256=sha256,
        part_size=part_size, concurrency=concurrency, extra=extra, progress=progress,
        on_started=on_started, throttle=throttle, part_checksum=part_checksum, budget=budget,
    )  # fmt: skip


def _put_small(client, bucket, key, source, name, size, sha256, extra, progress, throttle):
    data = _read_exactly(source, size + 1)  # one byte more shows a grown file
    digest = hashlib.sha256(data)
    if digest.hexdigest() != sha256 or len(data) != size:
        raise SourceChanged(_mismatch(name, sha256, size, digest.hexdigest(), len(data)))
    if throttle:
        throttle(len(data))
    # The object is small: its sha256 is also the checksum S3 checks.
    client.put_object(
        Bucket=bucket, Key=key, Body=data, ChecksumSHA256=_b64(digest.digest()), **extra
    )
    if progress:
        progress(len(data))
    return Sent(sha256, len(data))


def _multipart(
    client, bucket, key, source, *, name, size, sha256, part_size, concurrency, extra,
    progress, on_started, throttle, part_checksum, budget,
) -> Sent:  # fmt: skip
    # Looked up before the upload is created: an unknown algorithm leaves nothing behind.
    checksum_of = PART_CHECKSUMS[part_checksum]
    upload_id = client.create_multipart_upload(
        Bucket=bucket, Key=key, ChecksumAlgorithm=part_checksum, **extra
    )["UploadId"]
    if on_started:
        on_started(upload_id)
    completed = False
    try:
        upload = _Upload(client, bucket, key, upload_id, part_checksum, checksum_of, budget)
        parts, sha, total = _send_parts(
            upload, source, size=size, part_size=part_size, concurrency=concurrency,
            progress=progress, throttle=throttle,
        )  # fmt: skip
        if total != size or sha != sha256:
            raise SourceChanged(_mismatch(name, sha256, size, sha, total))
        client.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": sorted(parts, key=lambda p: p["PartNumber"])},
        )
        completed = True
        return Sent(sha, total)
    finally:
        if not completed:
            abort_quietly(client, bucket, key, upload_id)


@dataclass
class _Upload:
    """One open multipart upload, and the budget its parts' bytes are held against."""

    client: Any  # a boto3 S3 client
    bucket: str
    key: str
    upload_id: str
    part_checksum: str
    checksum_of: Callable[[bytes], str]
    budget: Budget

    def send(self, number: int, data: bytes, held: int) -> dict:
        # hashlib and zlib release the GIL on large buffers: parts hash in parallel.
        field = f"Checksum{self.part_checksum}"
        try:
            checksum = self.checksum_of(data)
            answer = self.client.upload_part(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self.upload_id,
                PartNumber=number,
                Body=data,
                **{field: checksum},
            )
        finally:
            self.budget.give(held)
        return {"PartNumber": number, "ETag": answer["ETag"], field: checksum}


def _send_parts(
    upload: _Upload, source, *, size, part_size, concurrency, progress, throttle
) -> tuple[list[dict], str, int]:
    """Read `source` part by part and send the parts in parallel; returns the parts
    (for completing the upload), the sha256 of all bytes read and their count. Stops
    reading as soon as more than `size` bytes came: the caller refuses a grown file."""
    budget = upload.budget
    whole = hashlib.sha256()
    total = 0
    parts: list[dict] = []
    pending: deque = deque()

    def collect_oldest() -> None:
        future, n = pending.popleft()
        parts.append(future.result())
        if progress:
            progress(n)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        try:
            number = 0
            while True:
                # At most `concurrency` parts of this file on the wire, and no more
                # bytes in memory than the budget shared with the other files.
                while len(pending) >= concurrency:
                    collect_oldest()
                held = budget.take(part_size)
                data = _read_exactly(source, part_size)
                if not data:
                    budget.give(held)
                    break
                number += 1
                whole.update(data)
                total += len(data)
                if total > size:
                    budget.give(held)
                    break  # grown: no need to read (or send) the rest
                if throttle:
                    throttle(len(data))
                try:
                    future = pool.submit(upload.send, number, data, held)
                except BaseException:
                    budget.give(held)
                    raise
                pending.append((future, len(data)))
            while pending:
                collect_oldest()
        finally:
            for future, _ in pending:
                future.cancel()
    return parts, whole.hexdigest(), total


def abort_quietly(client, bucket: str, key: str, upload_id: str) -> Exception | None:
    """Abort a multipart upload; the error if that failed too (the target is down). The
    replica keeps the id, and its next attempt aborts it."""
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except client.exceptions.NoSuchUpload:
        pass
    except Exception as exc:
        return exc
    return None
