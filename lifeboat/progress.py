"""A progress line for long operations of the client (a restore, hashing a big
checkpoint): bytes, rate and ETA on one line of stderr."""

from __future__ import annotations

import sys
import time


class Progress:
    """Bytes, rate and ETA on one line of stderr, at most every half second."""

    def __init__(self, total: int, label: str, stream=None, enabled: bool = True):
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.started = time.monotonic()
        self._shown = 0.0

    def add(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if self.enabled and (now - self._shown >= 0.5 or self.done >= self.total):
            self._shown = now
            self.stream.write("\r" + self.line(now))
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.started, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else 0
        percent = 100 * self.done / self.total if self.total else 100
        return (
            f"{self.label}: {_size(self.done)} / {_size(self.total)} ({percent:.0f}%) "
            f"{_size(rate)}/s, ETA {eta:.0f} s   "
        )

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"
