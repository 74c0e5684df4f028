"""Checkpoint reports written down but not yet sent: the spool's `pending/` folder.

`Run.checkpoint()` writes a record, `pending/<event id>.json` (where, which step, the
event id and time chosen at report time), before it returns, and hashes the files on a
background thread. If the process dies first, any lifeboat process on the same host with
the same spool completes the record: a job when it starts (and every 30 s while it runs),
`lifeboat watch` likewise, `lifeboat flush` at once. Completing is what the job would
have done: hash the files by the same rules (lifeboat.files.describe) and spool
`checkpoint.saved` with the record's event id and time, or `checkpoint.failed` with the
reason when the files are gone or changed while they were being hashed.

Claims. One process at a time works on a record: the holder of an exclusive flock on
`pending/<id>.lock`. The reporting process takes it before the record appears and holds
it until the record is gone; the kernel drops it when its holder dies, so a record left
by a dead process can be claimed at once, and one whose writer still works on it never
is. A lock file is unlinked only by a holder of its lock, and whoever locks one checks
that its name still leads to the file locked, so two processes never hold one record.

Once. The finished event is written into the record (a temporary name renamed over it)
before it goes into the spool, and the record is removed after that; a process that
finds a record holding its event spools that event as it is instead of hashing again.
So one record gives the server one event id with one content, however often it changes
hands (the server ignores a repeated id).

Records of another host are left alone: the location may be on a disk only that host
sees, and "gone" would be a false report. A record that cannot be read as one is moved
to `rejected/` with a note beside it, and the others go on.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lifeboat.config import hostname
from lifeboat.files import ChangedWhileHashing, FilesGone, compare_listing, describe, listing
from lifeboat.spool import Spool

log = logging.getLogger("lifeboat")

RESCAN_S = 30.0  # how often a running process looks for records a dead one left
REQUIRED = {"id": str, "run": str, "time": str, "location": str, "step": int}
SAVED_FIELDS = ("step", "epoch", "metrics", "save_seconds", "format")


class DamagedRecord(ValueError):
    """A pending record that is not one (not JSON, a field missing or of the wrong kind)."""


class SpoolFull(OSError):
    """The spool had no room for the finished event; the record stays for a later try."""


def build_event(type_: str, event_id: str, run: str, time: str, **fields) -> dict:
    """A v1 event; fields that are None are left out."""
    event = {"id": event_id, "type": type_, "run": run, "time": time}
    event.update({k: v for k, v in fields.items() if v is not None})
    return event


def parse(raw: bytes, name: str) -> dict:
    """The record in `raw`, checked: what completing it needs is there and well-formed."""
    try:
        request = json.loads(raw)
    except ValueError as exc:
        raise DamagedRecord(f"not valid JSON ({exc})") from None
    if not isinstance(request, dict):
        raise DamagedRecord("not a JSON object")
    for key, kind in REQUIRED.items():
        value = request.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise DamagedRecord(f"{key!r} is missing or not a {kind.__name__}")
    if f"{request['id']}.json" != name:
        raise DamagedRecord(f"its id {request['id']!r} does not match its name")
    event = request.get("event")
    if event is not None and not (isinstance(event, dict) and event.get("id") == request["id"]):
        raise DamagedRecord("its finished event is malformed")
    listed = request.get("listed")
    if listed is not None and not (
        isinstance(listed, dict)
        and all(isinstance(size, int) and not isinstance(size, bool) for size in listed.values())
    ):
        raise DamagedRecord("its list of files is malformed")
    return request


def label(request: dict) -> str:
    return f"{request['location']} (run {request['run']!r}, step {request['step']})"


def _lock(path: Path) -> int | None:
    """An exclusive flock on `path` (created if need be), without waiting: the descriptor,
    or None if another process (or another claim in this one) holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            # Who holds it, for the messages of those who find it taken.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {hostname()}\n".encode(), 0)
            return fd
        # Its last holder removed it between our open and our lock: lock the new one.
        os.close(fd)


class Claim:
    """The exclusive hold on one pending record. `release()` is safe to call twice."""

    def __init__(self, lock_path: Path, fd: int):
        self.lock_path = lock_path
        self._fd: int | None = fd

    def drop(self) -> None:
        """Remove the lock file, still holding it (the record is gone), then release."""
        if self._fd is not None:
            self.lock_path.unlink(missing_ok=True)
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class Scan:
    """What one look at `pending/` found."""

    claimed: list[tuple[dict, Claim]] = field(default_factory=list)
    busy: list[tuple[dict, str]] = field(default_factory=list)  # (record, its holder)
    foreign: list[dict] = field(default_factory=list)  # records of other hosts
    set_aside: list[tuple[Path, str]] = field(default_factory=list)  # (moved to, why)


class PendingReports:
    def __init__(self, spool: Spool):
        self.spool = spool
        self.dir = spool.pending

    def _record(self, event_id: str) -> Path:
        return self.dir / f"{event_id}.json"

    def _lock_path(self, event_id: str) -> Path:
        return self.dir / f"{event_id}.lock"

    def _write(self, request: dict) -> None:
        # Not fsynced: this guards against the process dying (the page cache survives
        # that), and an fsync here would put disk latency into the training loop.
        temporary = self.spool.tmp / f"pending-{request['id']}.json"
        temporary.write_text(json.dumps(request))
        os.replace(temporary, self._record(request["id"]))

    # -- a new report -------------------------------------------------------------------

    def add(self, request: dict) -> Claim | None:
        """Claim a new report, then write its record. None if its id is claimed already:
        the same report (same event id) is being completed by another process."""
        fd = _lock(self._lock_path(request["id"]))
        if fd is None:
            return None
        self._write(request)
        return Claim(self._lock_path(request["id"]), fd)

    # -- records left behind ------------------------------------------------------------

    def take_orphans(self) -> Scan:
        """Claim every record of this host that no live process holds. Damaged records
        are moved aside; stale lock files (their record gone) are removed."""
        scan = Scan()
        here = hostname()
        for path in sorted(self.dir.glob("*.json")):
            try:
                request = parse(path.read_bytes(), path.name)
            except FileNotFoundError:
                continue  # completed meanwhile
            except DamagedRecord:
                request = None  # looked at again under the claim
            if request is not None and request.get("host") != here:
                scan.foreign.append(request)
                continue
            lock_path = self.dir / f"{path.stem}.lock"
            fd = _lock(lock_path)
            if fd is None:
                if request is not None:
                    scan.busy.append((request, _holder(lock_path)))
                continue
            claim = Claim(lock_path, fd)
            # Read again under the claim: its holder may have finished it, or written
            # its event into it, since.
            try:
                request = parse(path.read_bytes(), path.name)
            except FileNotFoundError:
                claim.drop()
                continue
            except DamagedRecord as exc:
                scan.set_aside.append((self._set_aside(path, str(exc)), str(exc)))
                claim.drop()
                continue
            if request.get("host") != here:
                scan.foreign.append(request)
                claim.drop()
                continue
            scan.claimed.append((request, claim))
        self._remove_stale_locks()
        return scan

    def _set_aside(self, path: Path, why: str) -> Path:
        aside = self.spool.rejected / f"pending-{path.name}"
        note = {"error": f"a pending checkpoint record that cannot be completed: {why}"}
        try:
            os.replace(path, aside)
            (self.spool.rejected / f"{aside.name}.error").write_text(json.dumps(note) + "\n")
        except OSError as exc:  # a look at the others must go on
            log.error("lifeboat: %s (%s), and it could not be moved aside: %s", note["error"],
                      path, exc)  # fmt: skip
            return path
        log.error("lifeboat: %s; it is kept in %s", note["error"], aside)
        return aside

    def _remove_stale_locks(self) -> None:
        for lock_path in self.dir.glob("*.lock"):
            if self._record(lock_path.stem).exists():
                continue
            fd = _lock(lock_path)
            if fd is None:
                continue  # a writer holds it and is about to write its record
            claim = Claim(lock_path, fd)
            if self._record(lock_path.stem).exists():
                claim.release()
            else:
                claim.drop()

    # -- completing one -----------------------------------------------------------------

    def complete(
        self, request: dict, claim: Claim, on_read: Callable[[int], None] | None = None
    ) -> dict:
        """Finish a claimed record: spool its event (made now by hashing the files, or
        the one a previous holder made), then remove the record and its lock. Returns
        the event. Raises OSError when the files cannot be read (permissions, I/O) and
        SpoolFull when the spool has no room; the record then stays for a later try.
        The caller releases the claim in any case."""
        event = request.get("event")
        if event is None:
            event = self._hash(request, on_read)
            self._write({**request, "event": event})
        if not self.spool.put(event):
            raise SpoolFull(f"the spool at {self.spool.dir} is full; {label(request)} waits")
        self._record(request["id"]).unlink(missing_ok=True)
        claim.drop()
        return event

    def _hash(self, request: dict, on_read: Callable[[int], None] | None) -> dict:
        ids = {"event_id": request["id"], "run": request["run"], "time": request["time"]}
        try:
            files = self._describe(request, on_read)
        except FilesGone as exc:
            error = f"files of the reported checkpoint are gone before they could be hashed: {exc}"
        except FileNotFoundError as exc:
            error = f"the reported checkpoint is gone before it could be hashed: {exc}"
        except ChangedWhileHashing as exc:
            error = f"the reported checkpoint changed while it was being hashed: {exc}"
        else:
            fields = {name: request.get(name) for name in SAVED_FIELDS}
            return build_event(
                "checkpoint.saved", **ids, location=request["location"], files=files, **fields
            )
        return build_event("checkpoint.failed", **ids, step=request["step"], error=error[-9000:])

    def _describe(self, request: dict, on_read: Callable[[int], None] | None) -> list[dict]:
        """describe() the files, held to the list of files and sizes the first holder saw
        when it began hashing (kept in the record for whoever takes it over): a shard
        deleted after a killed job hashed it must not drop out of the report unseen."""
        now = listing(request["location"])
        if "listed" not in request:
            request["listed"] = now
            self._write(request)
        compare_listing(request["listed"], now)
        files = describe(request["location"], on_read)
        compare_listing(request["listed"], {f["path"]: f["size"] for f in files})
        return files


def _holder(lock_path: Path) -> str:
    try:
        return lock_path.read_text().strip() or "another process"
    except OSError:
        return "another process"
