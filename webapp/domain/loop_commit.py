"""Group commit on the event loop: the single events of a web process applied by the
PostgreSQL function from the loop itself, with no thread between the request and the
database.

Why: under load from single-event clients both cores were busy, and much of it was the
cost of each transaction rather than of each event (bench/ingest_in_process.py: the
function's PostgreSQL CPU per event falls from 0.43 ms alone to 0.12 ms in a group of
8). The threaded committer (webapp/domain/group_commit.py) made groups of about two:
each request crossed to a committer thread and back (the GIL, a wake-up of the loop),
and two committers per process split what was waiting. Here a request's events wait on
the loop in a list; one task per process sends everything waiting as one call of
lifeboat_ingest_v1 on an asynchronous connection, and while that call runs, the loop
reads the next requests, which make the next group. docs/benchmarks.md has the figures.

What does not change: a 202 only after the transaction that holds the events has
committed (the call is its own transaction); a repeat within the group is a duplicate of
its first copy, as in a batch; validation is published after commit. Whatever this way
does not take, it gives back untouched (None), and the caller sends it the threaded way,
which applies it with the full rules: events the function does not handle, a run that
does not exist yet, a step saved before, an error of any kind (the function keeps
nothing of a call that fails), a database that is not PostgreSQL. So this way is only a
shortcut for what the function applies on its own; tests/test_loop_commit.py checks the
rows it writes against the threaded way's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import psycopg
from django.conf import settings
from django.db import connection
from django.utils import timezone

from webapp.domain import ingest_in_sql, validation_outbox
from webapp.domain.ingest import IngestResult

log = logging.getLogger(__name__)

CALL = "SELECT lifeboat_ingest_v1(%s, %s, %s::jsonb)"
APPLICATION_NAME = "lifeboat ingest loop"
DECLINED = (ingest_in_sql.NEW_RUNS, ingest_in_sql.ELSEWHERE, ingest_in_sql.UNDEFINED_FUNCTION)


@dataclass
class _Pending:
    project: object
    actor: str
    events: Sequence
    raw: Sequence[dict]
    finite: bool
    future: asyncio.Future


class LoopCommitter:
    """One per process, used from its event loop only (no locks: nothing here runs in
    another thread)."""

    def __init__(self, max_events: int):
        self.max_events = max_events
        self._waiting: deque[_Pending] = deque()
        self._running = False
        self._task: asyncio.Task | None = None
        self._conn: psycopg.AsyncConnection | None = None

    async def submit(
        self, project, actor: str, events: Sequence, raw: Sequence[dict], finite: bool
    ) -> IngestResult | None:
        """The events applied and committed, or None when this way did not take them (and
        kept nothing of them)."""
        if not finite or len(events) >= ingest_in_sql.BELOW:
            return None
        if any(event.type not in ingest_in_sql.TYPES for event in events):
            return None
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(_Pending(project, actor, events, raw, finite, future))
        if not self._running:
            # Started now, run once the loop has read what else arrived meanwhile.
            self._running = True
            # Held: the loop keeps only a weak reference to a task.
            self._task = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        group: list[_Pending] = []
        try:
            while self._waiting:
                group = self._take()
                try:
                    await self._apply(group)
                except Exception:
                    log.exception("loop commit failed; the threaded way takes the group")
                    for pending in group:
                        _resolve(pending.future, None)
        finally:
            self._running = False
            # Whatever is left unanswered (an error above, or this task cancelled as the
            # process stops) goes the threaded way: no request waits forever.
            for pending in [*group, *self._waiting]:
                _resolve(pending.future, None)
            self._waiting.clear()

    def _take(self) -> list[_Pending]:
        """What is waiting, up to max_events, of the first request's project (one call
        applies one project's events); the others wait for the next round, in order."""
        first = self._waiting.popleft()
        group, size, others = [first], len(first.events), deque()
        while self._waiting and size < ingest_in_sql.BELOW - 1:
            pending = self._waiting.popleft()
            if pending.project.pk != first.project.pk or size + len(pending.events) >= min(
                self.max_events, ingest_in_sql.BELOW
            ):
                others.append(pending)
                continue
            group.append(pending)
            size += len(pending.events)
        others.extend(self._waiting)
        self._waiting = others
        return group

    async def _apply(self, group: list[_Pending]) -> None:
        events, raw, actors = [], [], []
        for pending in group:
            events.extend(pending.events)
            raw.extend(pending.raw)
            actors.extend([pending.actor] * len(pending.events))
        firsts: dict[uuid.UUID, int] = {}
        for i, event in enumerate(events):
            firsts.setdefault(event.id, i)
        unique = sorted(firsts.values())
        payload = orjson.dumps(
            [ingest_in_sql.event_json(events[i], raw[i], actors[i]) for i in unique]
        ).decode()
        answer = await self._call(group[0].project.pk, payload)
        if answer is None:
            for pending in group:
                _resolve(pending.future, None)
            return
        new = {uuid.UUID(value) for value in answer["new"]}
        if answer["validate"]:
            ids = sorted(answer["validate"])
            if settings.VALIDATION_PUBLISH_MS:
                validation_outbox.publish_after_commit(ids)  # hands them to its thread
            else:
                # Published by the caller: off the loop (a Redis round trip, and on
                # failure a database update, which Django refuses on a loop).
                await asyncio.get_running_loop().run_in_executor(
                    None, validation_outbox.publish_after_commit, ids
                )
        start = 0
        for pending in group:
            result = IngestResult()
            for i, event in enumerate(pending.events, start):
                is_new = event.id in new and firsts[event.id] == i
                (result.created if is_new else result.duplicates).append(event.id)
                result.statuses.append("created" if is_new else "duplicate")
            start += len(pending.events)
            _resolve(pending.future, result)

    async def _call(self, project_id: int, payload: str) -> dict | None:
        try:
            conn = await self._connection()
            cursor = await conn.execute(CALL, [project_id, timezone.now(), payload], prepare=True)
            (answer,) = await cursor.fetchone()
        except psycopg.Error as exc:
            if exc.sqlstate not in DECLINED:
                # The threaded way tries again on a connection of its own, and reports
                # what fails there. A broken connection is not used again.
                log.warning("loop commit: %s; the threaded way takes the group", exc)
                await self.close()
            return None
        return orjson.loads(answer) if isinstance(answer, str | bytes) else answer

    async def _connection(self) -> psycopg.AsyncConnection:
        if self._conn is None or self._conn.closed:
            params = connection.get_connection_params()
            for key in ("cursor_factory", "context"):  # Django's, for its sync cursors
                params.pop(key, None)
            # Named, so that pg_stat_activity tells it from the committers' connections.
            params.setdefault("application_name", APPLICATION_NAME)
            self._conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
            # As Django sets it: timestamps without an offset read as UTC.
            await self._conn.execute("SET TIME ZONE 'UTC'")
        return self._conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                await conn.close()


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


_committer: LoopCommitter | None = None


def enabled() -> bool:
    """Whether single events go this way: PostgreSQL with the function in use, and
    group commit on (off in the in-process test client, whose test transaction another
    connection could not see)."""
    return (
        settings.INGEST_ON_LOOP
        and settings.INGEST_IN_SQL
        and settings.INGEST_GROUP_COMMIT
        # Not connection.vendor: on the loop, each request (a context of its own) would
        # make a new DatabaseWrapper to ask.
        and "postgresql" in settings.DATABASES["default"]["ENGINE"]
    )


def loop_committer() -> LoopCommitter:
    global _committer
    if _committer is None:
        _committer = LoopCommitter(settings.EVENTS_MAX_BATCH)
    return _committer


async def close_loop_committer() -> None:
    if _committer is not None:
        await _committer.close()
