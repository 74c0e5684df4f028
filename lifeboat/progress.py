"""A progress line for long operations of the client (a restore, hashing a big
checkpoint, a check running on the server): bytes, rate and ETA on one line of stderr."""

from __future__ import annotations

import sys
import time

from lifeboat.units import human_size

__all__ = ["Progress", "human_size"]


class Progress:
    """Bytes, rate and ETA on one line of stderr, at most every half second."""

    def __init__(self, total: int, label: str, stream=None, enabled: bool = True):
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.started = time.monotonic()
        self._shown = 0.0
        self._rate: float | None = None
        self._eta: float | None = None

    def add(self, count: int) -> None:
        self.done += count
        self._draw()

    def update(
        self,
        done: int,
        total: int | None = None,
        rate: float | None = None,
        eta_s: float | None = None,
    ) -> None:
        """Show work measured elsewhere (a check on the server): its bytes done, total,
        and the rate and ETA it measured, rather than ones timed here."""
        self.done = done
        if total is not None:
            self.total = total
        self._rate, self._eta = rate, eta_s
        self._draw()

    def _draw(self) -> None:
        now = time.monotonic()
        if self.enabled and (now - self._shown >= 0.5 or self.done >= self.total):
            self._shown = now
            self.stream.write("\r" + self.line(now))
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.started, 1e-9)
        rate = self._rate if self._rate is not None else self.done / elapsed
        eta = self._eta
        if eta is None:
            eta = (self.total - self.done) / rate if rate > 0 else 0
        percent = 100 * self.done / self.total if self.total else 100
        return (
            f"{self.label}: {human_size(self.done)} / {human_size(self.total)} "
            f"({percent:.0f}%) {human_size(rate)}/s, ETA {eta:.0f} s   "
        )

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
