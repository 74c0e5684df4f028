"""A replica's files sent at once, within one memory budget.

A sharded checkpoint is 8 to 64 large files, a Megatron-style one thousands of small
ones. One file at a time leaves the wire idle between files and sends a small file's
request alone (a round trip per file); here up to REPLICATION_FILES_AT_ONCE files are
in flight, each large one in parts, and a single Budget caps the bytes read and not yet
sent across all of them (REPLICATION_CONCURRENCY parts of REPLICATION_PART_SIZE), so a
worker's memory does not grow with the number of files.

Only the calling thread touches the database: the sending threads count bytes and note
multipart upload ids, and the caller writes both to the row (progress, lease, ids to
abort after a crash) while it waits. The first failure stops the files not yet begun;
a file whose bytes changed (SourceChanged) wins over other errors, since it is final.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import BinaryIO, cast

from webapp.domain.replication.upload import Budget, SourceChanged, upload

WAKE_S = 0.25  # how often the caller looks at the threads' progress


class Tally:
    """Bytes done and sent, and the open multipart uploads, as the threads report them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = self.sent = 0
        self.uploads: dict[str, str] = {}
        self.uploads_changed = False

    def add(self, n: int, sent: bool = True) -> None:
        with self.lock:
            self.done += n
            if sent:
                self.sent += n

    def started(self, key: str, upload_id: str) -> None:
        with self.lock:
            self.uploads[key] = upload_id
            self.uploads_changed = True

    def ended(self, key: str) -> None:
        with self.lock:
            if self.uploads.pop(key, None) is not None:
                self.uploads_changed = True


def send_files(
    client,
    bucket: str,
    entries: list[dict],
    *,
    open_source: Callable[[str], BinaryIO],
    present: Callable[[dict], bool],
    tally: Tally,
    on_wake: Callable[[], None],
    files_at_once: int,
    upload_kwargs: dict,
) -> list[dict]:
    """Send every entry ({path, size, sha256, key}) the target lacks. Returns the
    entries that were already there (not sent). `on_wake()` is called on this thread
    about every WAKE_S while the others work."""
    budget = Budget(upload_kwargs["part_size"] * upload_kwargs["concurrency"])
    stop = threading.Event()
    skipped: list[dict] = []

    def one(entry: dict) -> None:
        if present(entry):
            tally.add(entry["size"], sent=False)
            with tally.lock:
                skipped.append(entry)
            return
        key = entry["key"]
        source = open_source(entry["path"])
        try:
            upload(
                client, bucket, key, source, name=entry["path"], size=entry["size"],
                sha256=entry["sha256"], progress=tally.add, budget=budget,
                on_started=lambda upload_id: tally.started(key, upload_id), **upload_kwargs,
            )  # fmt: skip
        finally:
            source.close()
        tally.ended(key)

    # `files_at_once` threads take the files in turn: the caller waits on those few
    # futures, not on one per file (waiting on 10,000 futures costs a core).
    queue = iter(entries)
    queue_lock = threading.Lock()

    def worker() -> None:
        while not stop.is_set():
            with queue_lock:
                entry = next(queue, None)
            if entry is None:
                return
            try:
                one(entry)
            except BaseException:
                stop.set()
                raise

    threads = min(files_at_once, len(entries)) or 1
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="replicate")
    try:
        futures = [pool.submit(worker) for _ in range(threads)]
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=WAKE_S, return_when=FIRST_EXCEPTION)
            on_wake()
            if any(f.exception() for f in finished):
                break
    finally:
        stop.set()
        pool.shutdown(wait=True)
    errors = [cast(BaseException, f.exception()) for f in futures if f.exception()]
    if errors:
        changed = [e for e in errors if isinstance(e, SourceChanged)]
        raise (changed or errors)[0]
    return skipped
