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

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connections

from webapp.domain.ingest import IngestResult, ingest

log = logging.getLogger(__name__)


@dataclass
class _Request:
    project: object
    actor: str
    events: Sequence
    raw: Sequence[dict]
    finite: bool = False
    # Called in the committer's thread once result or error is set (an event loop's
    # waker); a request thread waits on done instead.
    on_done: Callable[[], None] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: IngestResult | None = None
    error: BaseException | None = None

    def finish(self) -> None:
        self.done.set()
        if self.on_done is not None:
            self.on_done()


_STOP = object()  # tells a committer thread to end


class _ThreadState(threading.local):
    checked_at = 0.0  # when this thread's connection was last checked
    failed = False  # whether its last transaction failed


class GroupCommitter:
    def __init__(self, max_events: int, threads: int = 1):
        self.max_events = max_events
        self.thread_count = threads
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._state = _ThreadState()

    def submit(
        self, project, actor: str, events: Sequence, raw: Sequence[dict], finite: bool = False
    ) -> IngestResult:
        """Apply the events; return once they are committed (or raise what failed)."""
        request = _Request(project, actor, events, raw, finite)
        self.enqueue(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    async def submit_async(
        self, project, actor: str, events: Sequence, raw: Sequence[dict], finite: bool = False
    ) -> IngestResult:
        """submit() for a coroutine: the event loop serves other requests meanwhile."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_resolve, future)

        request = _Request(project, actor, events, raw, finite, on_done=wake)
        self.enqueue(request)
        await future
        if request.error is not None:
            raise request.error
        return request.result

    def enqueue(self, request: _Request) -> None:
        self._ensure_thread()
        self._queue.put(request)

    def _ensure_thread(self) -> None:
        # Started on first use, in the process that serves requests (after gunicorn's
        # fork: a thread does not survive a fork).
        if len(self._threads) == self.thread_count and all(t.is_alive() for t in self._threads):
            return
        with self._start_lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            while len(self._threads) < self.thread_count:
                thread = threading.Thread(
                    target=self._run, name="lifeboat-group-commit", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        """End the committer threads once they have applied what is queued; each closes
        its database connection. A later request starts them again."""
        with self._start_lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(_STOP)
        for thread in threads:
            thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                connections.close_all()
                return
            group, size = [first], len(first.events)
            while size < self.max_events:
                try:
                    request = self._queue.get_nowait()
                except queue.Empty:
                    break
                if request is _STOP:
                    self._queue.put(request)  # for the next round
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
                        request.finish()

    def _apply(self, group: list[_Request]) -> None:
        # As a request would: drop a connection that broke or outlived CONN_MAX_AGE. Not
        # before every transaction: with CONN_HEALTH_CHECKS that costs a round trip each
        # time; after a failure, and otherwise once a second, is enough.
        state, now = self._state, time.monotonic()
        if state.failed or now - state.checked_at > 1.0:
            close_old_connections()
            state.checked_at, state.failed = now, False
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
                self._state.failed = True
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
            self._state.failed = True
            request.error = exc
        request.finish()

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
            request.finish()


def _resolve(future: asyncio.Future) -> None:
    if not future.done():  # not cancelled meanwhile
        future.set_result(None)


# Requests with fewer events than this go through the committer.
GROUP_BELOW = 100
_committer: GroupCommitter | None = None
_committer_lock = threading.Lock()


def grouped(events: Sequence) -> bool:
    """Whether these events go through the committer (else they are applied by the
    caller's thread): a batch already shares its transaction among its events, and
    sent through the one committer thread, batches of a process would wait for each
    other instead of running side by side. Off (INGEST_GROUP_COMMIT) for the
    in-process test client, whose test transaction another thread could not see."""
    return settings.INGEST_GROUP_COMMIT and len(events) < GROUP_BELOW


def committer() -> GroupCommitter:
    global _committer
    if _committer is None:
        with _committer_lock:
            if _committer is None:
                _committer = GroupCommitter(settings.EVENTS_MAX_BATCH, settings.INGEST_COMMITTERS)
    return _committer


def stop_committer() -> None:
    """At the web process's shutdown (webapp/api/ingest_asgi.py): let the committers end
    and close their database connections."""
    if _committer is not None:
        _committer.stop()


def apply_events(
    project, actor: str, events: Sequence, raw: Sequence[dict], finite: bool = False
) -> IngestResult:
    """The ingest endpoint's way in, from a request thread: through this process's
    committer when grouped(), else directly."""
    if not grouped(events):
        return ingest(project, actor, events, raw, finite=finite)
    return committer().submit(project, actor, events, raw, finite)
