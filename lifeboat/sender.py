"""Delivers the spool to the server in the background: batches, retries, backoff.

One sender per spool at a time, chosen by an exclusive lock on `sender.lock`, so several
processes of one job (or a job and `lifeboat flush`) never send the same file twice at
once; the others only write. The lock dies with its process, so a successor takes over.
"""

from __future__ import annotations

import fcntl
import logging
import random
import threading
import time

from lifeboat.config import Config
from lifeboat.spool import Spool
from lifeboat.transport import ServerError, Unreachable, api_url, request

log = logging.getLogger("lifeboat")

BATCH_BYTES = 4 * 1024 * 1024  # well under the server's 16 MiB body limit
IDLE_POLL_S = 1.0  # picks up files other processes (or a predecessor) left


class Sender:
    def __init__(self, config: Config, spool: Spool):
        self.config = config
        self.spool = spool
        self.delivered = 0
        self.attempts = 0
        self.last_error = ""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock_file = None
        self._thread: threading.Thread | None = None
        self._batch_size = config.batch_size
        self._backoff = 0.0
        # flush() on the caller's thread and the background loop share one lock file;
        # this keeps them from sending the same batch at once.
        self._send_lock = threading.Lock()

    # -- the lock ---------------------------------------------------------------------

    def _take_lock(self) -> bool:
        if self._lock_file is not None:
            return True
        handle = open(self.spool.dir / "sender.lock", "a+")  # noqa: SIM115 (held for life)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        self._lock_file = handle
        return True

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    # -- the background thread --------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="lifeboat-sender", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> bool:
        """Deliver what is spooled for up to `timeout` seconds, then stop. True if the
        spool is empty; what is left stays on disk for the next process."""
        empty = self.flush(timeout)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        self._release_lock()
        return empty

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._take_lock():
                try:
                    progressed = self.send_once()
                except Exception:  # keep the thread alive whatever happens; the spool is safe
                    log.exception("lifeboat: the sender hit an unexpected error")
                    progressed = False
                if progressed:
                    continue
            wait = self._backoff if self._backoff else IDLE_POLL_S
            self._wake.wait(wait)
            self._wake.clear()

    # -- one round ----------------------------------------------------------------------

    def flush(self, timeout: float = 30.0) -> bool:
        """Send from this thread until the spool is empty or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._take_lock():
                # Another process (a sibling rank, a `lifeboat watch` sidecar) is this
                # spool's sender: it delivers what we wrote; no need to wait for it.
                return not self.spool.names()
            if not self.spool.names():
                return True
            if not self.send_once():
                time.sleep(min(self._backoff or 0.2, max(0.0, deadline - time.monotonic())))
        return not self.spool.names()

    def send_once(self) -> bool:
        """Send one batch. True if it made progress (sent or set aside), False if there
        was nothing to send or the server could not take it (backoff was raised)."""
        with self._send_lock:
            return self._send_once()

    def _send_once(self) -> bool:
        names = self.spool.names()[: self._batch_size]
        if not names:
            return False
        batch = self.spool.read(names, BATCH_BYTES)
        if not batch:
            return True
        self.attempts += 1
        try:
            request(
                "POST",
                api_url(self.config.url, "/events"),
                self.config.token,
                {"events": [event for _, event in batch]},
                timeout=self.config.timeout_s,
            )
        except Unreachable as exc:
            return self._failed(f"server unreachable: {exc}")
        except ServerError as exc:
            return self._refused(exc, batch)
        self.spool.remove([name for name, _ in batch])
        self.delivered += len(batch)
        self._backoff = 0.0
        self._batch_size = self.config.batch_size
        if self.last_error:
            log.warning("lifeboat: delivering again after: %s", self.last_error)
            self.last_error = ""
        return True

    def _refused(self, exc: ServerError, batch: list[tuple[str, dict]]) -> bool:
        if exc.status == 400 and isinstance(exc.answer.get("index"), int):
            # The server names the one bad event and took none of the batch: set that one
            # aside and send the rest again at once.
            index = exc.answer["index"]
            if 0 <= index < len(batch):
                self.spool.reject(batch[index][0], exc.answer)
                return True
        if exc.status == 413 and len(batch) > 1:
            self._batch_size = max(1, len(batch) // 2)
            return True
        if exc.status in (400, 413, 422):
            for name, _ in batch:
                self.spool.reject(name, exc.answer)
            return True
        # 401/403 (a token problem a person can fix), 429 and 5xx: keep the events, retry.
        return self._failed(f"HTTP {exc.status}: {exc.answer.get('error', exc.answer)}")

    def _failed(self, message: str) -> bool:
        first = not self.last_error
        self.last_error = message
        self._backoff = min(
            self.config.max_backoff_s, max(0.5, self._backoff * 2) * random.uniform(0.8, 1.2)
        )
        if first:
            log.warning(
                "lifeboat: %s; events are kept in %s and sent when it is back",
                message,
                self.spool.dir,
            )
        return False
