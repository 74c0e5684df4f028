"""Group commit: the events of concurrent requests of one web process, applied in one
transaction.

Why: a training job that sends one event per request pays for a whole transaction per
event: about ten statements, a WAL flush, and a validation message. Under load most of
a request's CPU went there (bench/ingest.py: 5.6 ms of Lifeboat CPU and 2.0 ms of
PostgreSQL CPU per single event). Here each request thread hands its validated events
to one committer thread per process and waits; the committer takes everything that is
waiting (up to EVENTS_MAX_BATCH events), applies it with one ingest() per project, and
wakes each request with its own statuses. Under no load a request is applied alone, as
before; under load the per-transaction cost is shared by the requests that arrived
while the previous transaction ran. Requests of GROUP_BELOW events or more (batches
from a client's spool) are applied by their own thread: they already share a
transaction among their events, and in one queue they would wait for each other.

What does not change: a 202 is given only after the transaction that holds the events
has committed; a repeat within the group is recognised like a repeat within a batch
(the first copy is created, the others are duplicates); validation is enqueued after
commit. If a group's transaction fails, each request of it is applied alone, so one
request's trouble is never another's.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections

from webapp.domain.ingest import IngestResult, ingest

log = logging.getLogger(__name__)


@dataclass
class _Request:
    project: object
    actor: str
    events: Sequence
    raw: Sequence[dict]
    finite: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    result: IngestResult | None = None
    error: BaseException | None = None


class GroupCommitter:
    def __init__(self, max_events: int):
        self.max_events = max_events
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._checked_at = 0.0
        self._failed = False

    def submit(
        self, project, actor: str, events: Sequence, raw: Sequence[dict], finite: bool = False
    ) -> IngestResult:
        """Apply the events; return once they are committed (or raise what failed)."""
        request = _Request(project, actor, events, raw, finite)
        self._ensure_thread()
        self._queue.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def _ensure_thread(self) -> None:
        # Started on first use, in the process that serves requests (after gunicorn's
        # fork: a thread does not survive a fork).
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="lifeboat-group-commit", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            group = [self._queue.get()]
            size = len(group[0].events)
            while size < self.max_events:
                try:
                    request = self._queue.get_nowait()
                except queue.Empty:
                    break
                group.append(request)
                size += len(request.events)
            try:
                self._apply(group)
            except BaseException as exc:  # never leave a request thread waiting
                log.exception("group commit failed outside a transaction")
                for request in group:
                    if not request.done.is_set():
                        request.error = exc
                        request.done.set()

    def _apply(self, group: list[_Request]) -> None:
        # As a request would: drop a connection that broke or outlived CONN_MAX_AGE. Not
        # before every transaction: with CONN_HEALTH_CHECKS that costs a round trip each
        # time; after a failure, and otherwise once a second, is enough.
        now = time.monotonic()
        if self._failed or now - self._checked_at > 1.0:
            close_old_connections()
            self._checked_at, self._failed = now, False
        by_project: dict[int, list[_Request]] = {}
        for request in group:
            by_project.setdefault(request.project.pk, []).append(request)
        for requests in by_project.values():
            if len(requests) == 1:
                self._apply_alone(requests[0])
                continue
            try:
                self._apply_together(requests)
            except Exception:
                self._failed = True
                log.warning(
                    "a group of %d requests failed together; applying each alone",
                    len(requests),
                    exc_info=True,
                )
                close_old_connections()  # a broken connection is not used again
                for request in requests:
                    self._apply_alone(request)

    def _apply_alone(self, request: _Request) -> None:
        try:
            request.result = self._ingest(request)
        except BaseException as exc:
            self._failed = True
            request.error = exc
        request.done.set()

    @staticmethod
    def _ingest(request: _Request) -> IngestResult:
        def once() -> IngestResult:
            return ingest(
                request.project, request.actor, request.events, request.raw, finite=request.finite
            )

        try:
            return once()
        except (OperationalError, InterfaceError):
            # The connection may have died since it was last checked (a database
            # restart, a failover): once more on a new one. Safe: ingest is idempotent
            # by event id.
            close_old_connections()
            return once()

    @staticmethod
    def _apply_together(requests: list[_Request]) -> None:
        events, raw, actors = [], [], []
        for request in requests:
            events.extend(request.events)
            raw.extend(request.raw)
            actors.extend([request.actor] * len(request.events))
        finite = all(request.finite for request in requests)
        result = ingest(requests[0].project, actors, events, raw, finite=finite)
        start = 0
        for request in requests:
            end = start + len(request.events)
            statuses = result.statuses[start:end]
            mine = IngestResult(statuses=statuses)
            for event, status in zip(request.events, statuses, strict=True):
                (mine.created if status == "created" else mine.duplicates).append(event.id)
            request.result = mine
            start = end
        for request in requests:
            request.done.set()


# Requests with fewer events than this go through the committer.
GROUP_BELOW = 100
_committer: GroupCommitter | None = None
_committer_lock = threading.Lock()


def apply_events(
    project, actor: str, events: Sequence, raw: Sequence[dict], finite: bool = False
) -> IngestResult:
    """The ingest endpoint's way in: through this process's committer, or directly when
    INGEST_GROUP_COMMIT is off (the in-process test client, whose test transaction
    another thread could not see)."""
    global _committer
    if not settings.INGEST_GROUP_COMMIT or len(events) >= GROUP_BELOW:
        # A batch already shares its transaction among its events; sent through the
        # one committer thread, batches of a process would wait for each other instead
        # of running side by side.
        return ingest(project, actor, events, raw, finite=finite)
    if _committer is None:
        with _committer_lock:
            if _committer is None:
                _committer = GroupCommitter(settings.EVENTS_MAX_BATCH)
    return _committer.submit(project, actor, events, raw, finite)
