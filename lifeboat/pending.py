"""Checkpoint reports written down but not yet sent: the spool's `pending/` folder.

`Run.checkpoint()` writes a record, `pending/<event id>.json` (where, which step, the
event id and time chosen at report time), before it returns, and hashes the files on a
background thread. If the process dies first, any lifeboat process on the same host with
the same spool completes the record: a job when it starts (and when its hashing thread idles 30 s),
`lifeboat watch` likewise, `lifeboat flush` at once. Completing is what the job would
have done: hash the files by the same rules (lifeboat.files.describe) and spool
`checkpoint.saved` with the record's event id and time, or `checkpoint.failed` with the
reason when the files are gone or changed while they were being hashed.

Claims. One process at a time works on a record: its owner, named in the record. A
process owns records through one lock file of its own, `pending/owner-<random>.lock`,
flocked for as long as it lives (one descriptor, however many reports it has queued);
the kernel drops that lock when the process dies, so whether the owner lives is a
question the kernel answers, which no reused pid can fool. A record whose owner is dead
is taken over under a brief flock on `pending/<id>.lock`: the taker reads it again,
checks its owner again and writes itself in as the owner, so two processes never take
one record. Lock files are unlinked only by a holder of their lock, and whoever locks
one checks that its name still leads to the file locked.

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
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lifeboat.config import hostname
from lifeboat.files import ChangedWhileHashing, FilesGone, compare_listing, describe, listing
from lifeboat.spool import Spool

log = logging.getLogger("lifeboat")

RESCAN_S = 30.0  # how often a running process looks for records a dead one left
REQUIRED = {"id": str, "run": str, "time": str, "location": str, "step": int}
SAVED_FIELDS = ("step", "epoch", "metrics", "save_seconds", "format", "part")


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
    written = request.get("written")
    if written is not None and not (
        isinstance(written, dict)
        and all(
            isinstance(w, dict)
            and isinstance(w.get("size"), int)
            and isinstance(w.get("sha256"), str)
            for w in written.values()
        )  # fmt: skip
    ):
        raise DamagedRecord("its digests of the written files are malformed")
    listed = request.get("listed")
    if listed is not None and not (
        isinstance(listed, dict)
        and all(isinstance(size, int) and not isinstance(size, bool) for size in listed.values())
    ):
        raise DamagedRecord("its list of files is malformed")
    only = request.get("only")
    if only is not None and not (
        isinstance(only, list) and only and all(isinstance(name, str) and name for name in only)
    ):
        raise DamagedRecord("its list of this rank's files is malformed")
    part = request.get("part")
    if part is not None and not (
        isinstance(part, dict)
        and all(_whole(part.get(key)) for key in ("rank", "world_size"))
        and isinstance(part.get("host", ""), str)
    ):
        raise DamagedRecord("its part (rank, world size, host) is malformed")
    return request


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def label(request: dict) -> str:
    return f"{request['location']} (run {request['run']!r}, step {request['step']})"


def _lock(path: Path) -> int | None:
    """An exclusive flock on `path` (created if need be), without waiting: the descriptor,
    or None if another holder (another process, or another descriptor here) has it."""
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


class _Lock:
    """A held flock. `drop()` removes its file, still holding it, then lets go;
    `release()` only lets go. Both are safe to call twice."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    def drop(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _try_lock(path: Path) -> _Lock | None:
    """A lock on an existing lock file that nobody holds (its holder is dead), else None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return _Lock(path, fd)


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Scan:
    """What one look at `pending/` found."""

    claimed: list[dict] = field(default_factory=list)  # records now owned here
    busy: list[tuple[dict, str]] = field(default_factory=list)  # (record, its live owner)
    foreign: list[dict] = field(default_factory=list)  # records of other hosts
    set_aside: list[tuple[Path, str]] = field(default_factory=list)  # (moved to, why)


class PendingReports:
    """The pending records of one spool, for one owner. `close()` when done: what it
    still owns is then free for the next process (as when the process dies)."""

    def __init__(self, spool: Spool):
        self.spool = spool
        self.dir = spool.pending
        self._owner_lock: _Lock | None = None
        self._owner_guard = threading.Lock()

    def _record(self, event_id: str) -> Path:
        return self.dir / f"{event_id}.json"

    def _owner(self) -> str:
        """The name of this owner's lock file, held (made on first use)."""
        with self._owner_guard:
            if self._owner_lock is None:
                path = self.dir / f"owner-{uuid.uuid4().hex}.lock"
                self._owner_lock = _Lock(path, _lock(path))
            return self._owner_lock.path.name

    def _mine(self) -> str | None:
        return self._owner_lock.path.name if self._owner_lock is not None else None

    def close(self) -> None:
        with self._owner_guard:
            if self._owner_lock is not None:
                self._owner_lock.drop()
                self._owner_lock = None

    def _write(self, request: dict) -> None:
        # Not fsynced: this guards against the process dying (the page cache survives
        # that), and an fsync here would put disk latency into the training loop.
        temporary = self.spool.tmp / f"pending-{request['id']}.json"
        temporary.write_text(json.dumps(request))
        os.replace(temporary, self._record(request["id"]))

    def _live_owner(self, request: dict) -> str | None:
        """Who owns the record, if they live ("pid N on HOST"); None if nobody does."""
        if "owner" not in request:
            # Written by an older client, which had no owner lock: its pid tells.
            alive = _pid_alive(request.get("pid"))
            return f"pid {request.get('pid')} on {request.get('host')}" if alive else None
        owner = request["owner"]
        if not isinstance(owner, str) or not owner.startswith("owner-") or "/" in owner:
            return None  # given up by its owner (release), or nonsense: nobody holds it
        lock = _try_lock(self.dir / owner)
        if lock is not None:
            lock.release()
            return None
        try:
            return (self.dir / owner).read_text().strip() or "another process"
        except OSError:
            return "another process"

    # -- a new report -------------------------------------------------------------------

    def add(self, request: dict) -> dict | None:
        """Write the record of a new report, owned here; returns it as written. None if a
        record with its id exists already (the same report, made again)."""
        request = {**request, "owner": self._owner()}
        temporary = self.spool.tmp / f"pending-{request['id']}.json"
        temporary.write_text(json.dumps(request))
        try:
            os.link(temporary, self._record(request["id"]))  # fails if it exists
        except FileExistsError:
            return None
        finally:
            temporary.unlink(missing_ok=True)
        return request

    def release(self, request: dict) -> None:
        """Give up a record owned here that cannot be completed here (its files cannot be
        read): another process may try."""
        self._write({**request, "owner": None})

    # -- records left behind ------------------------------------------------------------

    def take_orphans(self) -> Scan:
        """Take over every record of this host whose owner is dead. Damaged records are
        moved aside; lock files nobody holds are removed."""
        scan = Scan()
        here = hostname()
        for path in sorted(self.dir.glob("*.json")):
            try:
                request = parse(path.read_bytes(), path.name)
            except FileNotFoundError:
                continue  # completed meanwhile
            except DamagedRecord:
                request = None  # looked at again under the lock
            if request is not None:
                if request.get("host") != here:
                    scan.foreign.append(request)
                    continue
                if request.get("owner") == self._mine():
                    continue  # queued here already
                holder = self._live_owner(request)
                if holder is not None:
                    scan.busy.append((request, holder))
                    continue
            lock_path = self.dir / f"{path.stem}.lock"
            fd = _lock(lock_path)
            if fd is None:
                continue  # another process is taking it over right now
            lock = _Lock(lock_path, fd)
            try:
                self._take_over(path, scan)
            finally:
                lock.drop()
        self._remove_dead_locks()
        return scan

    def _take_over(self, path: Path, scan: Scan) -> None:
        # Read again under the lock: it may have been completed, or taken, since.
        try:
            request = parse(path.read_bytes(), path.name)
        except FileNotFoundError:
            return
        except DamagedRecord as exc:
            scan.set_aside.append((self._set_aside(path, str(exc)), str(exc)))
            return
        if request.get("host") != hostname():
            scan.foreign.append(request)
            return
        holder = self._live_owner(request)
        if holder is not None:
            scan.busy.append((request, holder))
            return
        request["owner"] = self._owner()
        self._write(request)
        scan.claimed.append(request)

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

    def _remove_dead_locks(self) -> None:
        """Remove lock files nobody holds: of owners that died, of takers that died."""
        for path in self.dir.glob("*.lock"):
            if path.name == self._mine():
                continue
            lock = _try_lock(path)
            if lock is not None:
                lock.drop()

    # -- completing one -----------------------------------------------------------------

    def complete(self, request: dict, on_read: Callable[[int], None] | None = None) -> dict:
        """Finish a record owned here: spool its event (made now by hashing the files, or
        the one a previous owner made), then remove the record. Returns the event.
        Raises OSError when the files cannot be read (permissions, I/O) and SpoolFull when
        the spool has no room; the record then stays for a later try."""
        event = request.get("event")
        if event is None:
            event = self._hash(request, on_read)
            self._write({**request, "event": event})
        if not self.spool.put(event):
            raise SpoolFull(f"the spool at {self.spool.dir} is full; {label(request)} waits")
        self._record(request["id"]).unlink(missing_ok=True)
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
            # `part` (one rank's share, lifeboat/parts.py) is absent from whole reports
            # and from records written by older clients, which complete as before.
            fields = {name: request.get(name) for name in SAVED_FIELDS}
            return build_event(
                "checkpoint.saved", **ids, location=request["location"], files=files, **fields
            )
        return build_event("checkpoint.failed", **ids, step=request["step"], error=error[-9000:])

    def _describe(self, request: dict, on_read: Callable[[int], None] | None) -> list[dict]:
        """describe() the files, held to the list of files and sizes the first holder saw
        when it began hashing (kept in the record for whoever takes it over): a shard
        deleted after a killed job hashed it must not drop out of the report unseen.
        A record with `only` (one rank's part) lists and hashes those files alone."""
        only = request.get("only")
        now = listing(request["location"], only)
        if "listed" not in request:
            request["listed"] = now
            self._write(request)
        compare_listing(request["listed"], now)
        files = describe(request["location"], on_read, written=request.get("written"), only=only)
        compare_listing(request["listed"], {f["path"]: f["size"] for f in files})
        return files
