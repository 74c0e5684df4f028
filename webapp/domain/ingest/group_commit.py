"""Group commit: the small requests one web process holds at one moment, applied in one
transaction.

Why: a training job that sends one event per request would pay for a whole transaction
per event (a dozen statements, a WAL flush, a validation message). The event loop of a
web process (webapp/api/ingest_asgi.py) hands each small request's checked events to
its GroupCommitter and awaits them; the committer sends what is waiting, up to
EVENTS_MAX_BATCH events, to one thread of the process's pool, which applies it with one
ingest() per project and gives each request its own statuses. Under no load a request
is applied alone, at once; under load the requests that arrive while `in_flight` groups
run wait for the next group, so groups grow with the load. Requests of GROUP_BELOW
events or more (batches from a client's spool) are not grouped: they already share a
transaction among their events.

What does not change: a 202 is given only after the transaction that holds the events
has committed; a repeat within the group is recognised like a repeat within a batch
(the first copy is created, the others are duplicates); validation is enqueued after
commit. If a group's transaction fails, each request of it is applied alone, so one
request's trouble is never another's.

The groups run in the pool the caller gives, so in-process tests (whose pool runs in the
test's thread, inside its transaction) go the same way as production.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from django.db import InterfaceError, OperationalError, connection

from webapp.domain.ingest.apply import IngestResult, ingest
from webapp.domain.models import Project

log = logging.getLogger(__name__)

# Requests with fewer events than this are grouped.
GROUP_BELOW = 100


@dataclass
class _Request:
    project: Project
    actor: str
    events: Sequence
    raw: Sequence[dict]
    finite: bool
    future: asyncio.Future


class GroupCommitter:
    """Groups the requests of one event loop; at most `in_flight` groups run at once.

    wrap(function, *args) runs a group in the pool's thread (the web door's: it drops a
    database connection that broke or outlived its age, before and after)."""

    def __init__(self, executor: Executor, max_events: int, in_flight: int, wrap: Callable):
        self.executor = executor
        self.max_events = max_events
        self.in_flight = in_flight
        self.wrap = wrap
        self._waiting: deque[_Request] = deque()
        self._running = 0

    async def submit(
        self, project, actor: str, events: Sequence, raw: Sequence[dict], finite: bool
    ) -> IngestResult:
        """Apply the events; return once they are committed (or raise what failed)."""
        loop = asyncio.get_running_loop()
        request = _Request(project, actor, events, raw, finite, loop.create_future())
        self._waiting.append(request)
        self._start(loop)
        return await request.future

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._waiting and self._running < self.in_flight:
            group: list[_Request] = []
            size = 0
            while self._waiting and (not group or size < self.max_events):
                group.append(self._waiting.popleft())
                size += len(group[-1].events)
            self._running += 1
            done = loop.run_in_executor(self.executor, self.wrap, apply_group, group)
            done.add_done_callback(functools.partial(self._finish, loop, group))

    def _finish(self, loop, group: list[_Request], task: asyncio.Future) -> None:
        self._running -= 1
        error = task.exception() if not task.cancelled() else asyncio.CancelledError()
        outcomes = [error] * len(group) if error is not None else task.result()
        for request, outcome in zip(group, outcomes, strict=True):
            if request.future.done():  # cancelled meanwhile (the client went away)
                continue
            if isinstance(outcome, BaseException):
                request.future.set_exception(outcome)
            else:
                request.future.set_result(outcome)
        self._start(loop)


def apply_group(group: list[_Request]) -> list[IngestResult | BaseException]:
    """Each request's result or error, in order: one transaction per project, or one per
    request when the project's shared one failed."""
    outcomes: dict[int, IngestResult | BaseException] = {}
    by_project: dict[int, list[_Request]] = {}
    for request in group:
        by_project.setdefault(request.project.pk, []).append(request)
    for requests in by_project.values():
        if len(requests) > 1:
            try:
                for request, result in zip(requests, _apply_together(requests), strict=True):
                    outcomes[id(request)] = result
                continue
            except Exception:
                log.warning(
                    "a group of %d requests failed together; applying each alone",
                    len(requests),
                    exc_info=True,
                )
        for request in requests:
            try:
                outcomes[id(request)] = _apply_alone(request)
            except Exception as exc:
                outcomes[id(request)] = exc
    return [outcomes[id(request)] for request in group]


def _apply_alone(request: _Request) -> IngestResult:
    def once() -> IngestResult:
        return ingest(
            request.project, request.actor, request.events, request.raw, finite=request.finite
        )

    try:
        return once()
    except (OperationalError, InterfaceError):
        # The connection may have died since it was last checked (a database restart,
        # a failover): once more on a new one. Safe: ingest is idempotent by event id.
        if connection.in_atomic_block:
            raise
        connection.close()
        return once()


def _apply_together(requests: list[_Request]) -> list[IngestResult]:
    events: list = []
    raw: list[dict] = []
    actors: list[str] = []
    for request in requests:
        events.extend(request.events)
        raw.extend(request.raw)
        actors.extend([request.actor] * len(request.events))
    finite = all(request.finite for request in requests)
    result = ingest(requests[0].project, actors, events, raw, finite=finite)
    results, start = [], 0
    for request in requests:
        end = start + len(request.events)
        mine = IngestResult(statuses=result.statuses[start:end])
        for event, status in zip(request.events, mine.statuses, strict=True):
            (mine.created if status == "created" else mine.duplicates).append(event.id)
        results.append(mine)
        start = end
    return results
