"""The on-disk spool: every event is written here before anything is sent.

One small JSON file per event, written to a temporary name, flushed to disk and renamed
into `events/`, so a file there is always complete and survives a crash of the training
process (and, with the fsync, of the machine). Names sort by creation time, so a sender
delivers in order. A delivered event's file is removed after the server answered 202;
if the process dies in between, the event is sent again and the server, which
deduplicates by event id, changes nothing.

The spool is bounded (LIFEBOAT_SPOOL_MAX_BYTES, 256 MiB by default). When it fills,
heartbeats and metrics are dropped first, since a later one supersedes them; checkpoint
and run events are still kept up to twice the bound. Every drop is logged at ERROR level
with the spool's path, so a full spool is never silent.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("lifeboat")

# Events that a later one of the same kind supersedes; dropped first when the spool is full.
EXPENDABLE = frozenset({"run.heartbeat", "metrics"})
RESCAN_EVERY_S = 10.0


class Spool:
    def __init__(self, directory: Path, max_bytes: int, durable: bool = True):
        self.dir = Path(directory)
        self.events = self.dir / "events"
        self.tmp = self.dir / "tmp"
        self.rejected = self.dir / "rejected"
        self.pending = self.dir / "pending"
        for folder in (self.events, self.tmp, self.rejected, self.pending):
            folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.durable = durable
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._bytes = 0
        self._scanned_at = 0.0
        self.dropped = 0
        self.written = 0
        self._last_alarm = 0.0
        self._rescan()

    # -- writing ----------------------------------------------------------------------

    def put(self, event: dict) -> bool:
        """Write one event durably. False if the spool is full and it was dropped."""
        data = json.dumps(event, separators=(",", ":")).encode()
        with self._lock:
            if time.monotonic() - self._scanned_at > RESCAN_EVERY_S:
                self._rescan()
            limit = self.max_bytes if event.get("type") in EXPENDABLE else 2 * self.max_bytes
            if self._bytes + len(data) > limit:
                self.dropped += 1
                self._alarm(event)
                return False
            name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):08d}.json"
            self._write(self.events / name, data)
            self._bytes += len(data)
            self.written += 1
        return True

    def _write(self, final: Path, data: bytes) -> None:
        temporary = self.tmp / final.name
        with open(temporary, "wb") as handle:
            handle.write(data)
            if self.durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, final)

    def _alarm(self, event: dict) -> None:
        # Loud, but at most every 10 s: a job in a tight loop must not drown its own log.
        now = time.monotonic()
        if now - self._last_alarm < 10:
            return
        self._last_alarm = now
        log.error(
            "lifeboat: the spool at %s is full (%d bytes, limit %d); dropped a %s event "
            "(%d dropped so far). The server has been unreachable for a while: check "
            "LIFEBOAT_URL and the server, or raise LIFEBOAT_SPOOL_MAX_BYTES.",
            self.dir,
            self._bytes,
            self.max_bytes,
            event.get("type"),
            self.dropped,
        )

    def _rescan(self) -> None:
        total = 0
        for entry in os.scandir(self.events):
            with contextlib.suppress(FileNotFoundError):  # delivered meanwhile
                total += entry.stat().st_size
        self._bytes = total
        self._scanned_at = time.monotonic()

    # -- reading (the sender) ---------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(e.name for e in os.scandir(self.events) if e.name.endswith(".json"))

    def read(self, names: list[str], max_bytes: int) -> list[tuple[str, dict]]:
        """The events of the first files in `names`, up to about max_bytes of JSON."""
        batch, size = [], 0
        for name in names:
            try:
                raw = (self.events / name).read_bytes()
            except FileNotFoundError:
                continue
            if batch and size + len(raw) > max_bytes:
                break
            try:
                batch.append((name, json.loads(raw)))
            except ValueError:
                # Not ours or damaged by a disk fault: keep it aside for a person to read.
                self.reject(name, {"error": "not valid JSON"})
                continue
            size += len(raw)
        return batch

    def remove(self, names: list[str]) -> None:
        freed = 0
        for name in names:
            path = self.events / name
            try:
                freed += path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                pass
        with self._lock:
            self._bytes = max(0, self._bytes - freed)

    def reject(self, name: str, answer: dict) -> None:
        """Move an event the server refused for good into rejected/, with the answer."""
        try:
            os.replace(self.events / name, self.rejected / name)
        except FileNotFoundError:
            return
        (self.rejected / (name + ".error")).write_text(json.dumps(answer, indent=1) + "\n")
        log.error(
            "lifeboat: the server refused an event for good (%s); it is kept in %s",
            answer.get("error", answer),
            self.rejected / name,
        )

    def stats(self) -> dict:
        names = self.names()
        return {
            "dir": str(self.dir),
            "events": len(names),
            "bytes": sum(
                (self.events / n).stat().st_size for n in names if (self.events / n).exists()
            ),
            "rejected": len([p for p in self.rejected.iterdir() if p.suffix == ".json"]),
            "pending_checkpoints": len(list(self.pending.glob("*.json"))),
            "dropped": self.dropped,
        }
