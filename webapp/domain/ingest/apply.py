"""Applying v1 events to the database: the write path of POST /api/v1/events.

The contract this module keeps (docs/api.md):

* Idempotent by event id. Each event row is inserted with ON CONFLICT DO NOTHING
  RETURNING, and only the rows that came back are applied. Two requests carrying the
  same event at the same moment both reach that INSERT; PostgreSQL makes the second wait
  on the first's uncommitted index entry and then returns nothing for it, so the event
  is applied exactly once whichever commits first.
* Tolerant of late and out-of-order events: the new events are folded in time order by
  the rules of webapp/domain/ingest/rules.py, their one text, on SQLite and PostgreSQL.
* Bounded work per batch: a constant number of queries whatever the batch size
  (bulk inserts, one SELECT ... FOR NO KEY UPDATE per table), so a client that batches gets
  PostgreSQL's bulk speed.
* No network call inside the transaction: validation tasks are published on commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.utils import timezone

from webapp.domain.ingest import clock
from webapp.domain.ingest.bulk_select import (
    select_locked,
    select_locked_by_key_later,
    select_locked_later,
)
from webapp.domain.ingest.bulk_sql import insert_rows_by_key_later, insert_rows_later
from webapp.domain.ingest.event_schema import CHECKPOINT_TYPES, ENVELOPE, json_safe
from webapp.domain.ingest.rules import Applier
from webapp.domain.ingest.sql_pipeline import Pending, generic_plans_later, pipeline
from webapp.domain.models import Checkpoint, Event, Project, Run

log = logging.getLogger(__name__)

_EVENT_COLUMNS = (
    "project_id",
    "run_id",
    "event_id",
    "type",
    "step",
    "time",
    "received_at",
    "actor",
    "data",
    "message",
)


@dataclass
class IngestResult:
    created: list[uuid.UUID] = field(default_factory=list)
    duplicates: list[uuid.UUID] = field(default_factory=list)
    enqueued: list[int] = field(default_factory=list)
    # "created" or "duplicate" for each event, in the order they were given.
    statuses: list[str] = field(default_factory=list)


def ingest(
    project: Project,
    actor: str | Sequence[str],
    events: Sequence,
    raw: Sequence[dict],
    *,
    finite: bool = False,
) -> IngestResult:
    """Store and apply validated events (event_schema models) with their raw dicts.

    actor: who sent them, or one actor per event (webapp/domain/ingest/group_commit.py applies
    the requests of several tokens together). Returns which event ids were new and which
    were repeats (of an earlier delivery, or of an earlier event in the same batch).
    finite: the caller knows the values hold no NaN or Infinity (a body orjson parsed),
    so they need not be searched for them: a tenth of a batch's CPU."""
    safe = _as_is if finite else json_safe
    actors = [actor] * len(events) if isinstance(actor, str) else actor
    firsts: dict[uuid.UUID, int] = {}
    for i, event in enumerate(events):
        firsts.setdefault(event.id, i)
    unique = sorted(firsts.values())

    keys = sorted({events[i].run for i in unique})
    # PostgreSQL: the first round trip locks the runs, inserts the events and locks the
    # checkpoints together, once this process knows the runs exist; elsewhere (SQLite),
    # and for a run's first events, one statement after the other.
    together = connection.vendor == "postgresql" and _KNOWN_RUNS.has(project.pk, keys)
    try:
        stored = _store(project, keys, events, unique, actors, raw, safe, together)
    except _NewRuns:
        # A run known to exist was deleted since: its events may have been inserted
        # before its row was locked, and waiting for that lock while holding them
        # can deadlock with a request that holds the lock and sends the same events.
        # All of it was rolled back; now the runs are created and locked first.
        stored = _store(project, keys, events, unique, actors, raw, safe, False)
    inserted, enqueued = stored
    _KNOWN_RUNS.add(project.pk, keys)
    result = IngestResult(enqueued=enqueued)
    for i, event in enumerate(events):
        is_new = event.id in inserted and firsts[event.id] == i
        (result.created if is_new else result.duplicates).append(event.id)
        result.statuses.append("created" if is_new else "duplicate")
    return result


def _lock_runs(project: Project, keys: list[str]) -> dict[str, Run]:
    """Create missing runs and lock every run the batch touches.

    Keys are sorted, and rows locked in id order, so two batches that touch the same
    runs in a different order wait for each other instead of deadlocking."""

    def lock():
        locked = select_locked(Run, {"project_id": [project.pk], "key": keys})
        return {run.key: run for run in locked}

    runs = lock()
    missing = [key for key in keys if key not in runs]
    if missing:  # only the first events of a run pay for the insert
        now = timezone.now()
        Run.objects.bulk_create(
            [Run(project=project, key=key, created_at=now) for key in missing],
            ignore_conflicts=True,
        )
        runs = lock()
    return runs


class _KnownRuns:
    """The runs this process has seen exist, by (project id, key), so that only a run's
    first events take the longer way (_lock_runs) instead of a transaction that finds
    the run missing, is rolled back and is made again. Knowing a run that was deleted
    since costs that rolled-back transaction once; nothing is ever wrong for it. Bounded:
    forgotten all at once when full (thousands of live runs are a few hundred KB)."""

    LIMIT = 100_000

    def __init__(self):
        self._keys: set[tuple[int, str]] = set()

    def has(self, project_id: int, keys: list[str]) -> bool:
        return all((project_id, key) in self._keys for key in keys)

    def add(self, project_id: int, keys: list[str]) -> None:
        if len(self._keys) + len(keys) > self.LIMIT:
            self._keys.clear()
        self._keys.update((project_id, key) for key in keys)


_KNOWN_RUNS = _KnownRuns()


def _as_is(value):
    return value


class _NewRuns(Exception):
    pass


def _store(project, keys, events, unique, actors, raw, safe, together: bool):
    """One transaction: insert the new events, fold them into runs and checkpoints."""
    with transaction.atomic():
        now = timezone.now()

        def row(i: int, run) -> tuple:
            return _event_row(project, run, actors[i], events[i], raw[i], now, safe)

        if together:
            runs, inserted, existing = _read_and_insert_together(project, keys, events, unique, row)
        else:
            runs = _lock_runs(project, keys)
            inserted = _event_ids(
                _insert_events_later([row(i, runs[events[i].run].pk) for i in unique]).result()
            )
            existing = _lock_checkpoints(runs, events, unique)
        fresh = [events[i] for i in unique if events[i].id in inserted]
        _believable_times(fresh, now)
        # Applied in time order so that a batch replayed from a spool, or events that
        # crossed on the network, end in the state the newest event describes.
        fresh.sort(key=lambda e: e.time)
        applier = Applier(project, runs, safe)
        applier.apply(fresh, existing)
        # The last round trip carries the COMMIT too, unless a caller's transaction
        # holds this one (then that caller commits).
        enqueued = applier.flush(commit=together and len(connection.atomic_blocks) == 1)
    return inserted, enqueued


def _believable_times(events: list, now) -> None:
    """Events are stored as claimed and folded in with a time that can be true
    (clock.believable_times); `clock_off` marks those whose claim was not believed, so
    that a start stamped impossibly is not taken for a requeue."""
    rows = [(e.run, e.type, e.time, now) for e in events]
    for event, when in zip(events, clock.believable_times(rows), strict=True):
        event.clock_off = when != event.time
        event.time = when


def _read_and_insert_together(project: Project, keys: list[str], events, unique, row):
    """In one round trip (a transaction's BEGIN included): lock the runs, insert the
    events, lock the checkpoints they name. The events and checkpoints name their runs
    by key, so nothing waits for the runs' ids. Under load a round trip costs about as
    much as the work of an event (bench/ingest.py), and a single event's transaction
    had six of them.

    When a run does not exist (deleted since this process saw it) this raises _NewRuns."""
    steps = sorted({events[i].step for i in unique if events[i].type in CHECKPOINT_TYPES})
    with pipeline():
        generic_plans_later()
        locked = select_locked_later(Run, {"project_id": [project.pk], "key": keys})
        new_events = insert_rows_by_key_later(
            Event,
            _EVENT_COLUMNS,
            [row(i, events[i].run) for i in unique],
            fk="run_id",
            target=Run,
            match=("project_id", "key"),
            ignore_conflicts_on=("project_id", "event_id"),
            returning=("event_id",),
        )
        checkpoints = select_locked_by_key_later(
            Checkpoint,
            {"step": steps},
            fk="run_id",
            target=Run,
            target_where={"project_id": [project.pk], "key": keys},
        )
        runs = {run.key: run for run in locked.result()}
        inserted = _event_ids(new_events.result())
        existing = checkpoints.result()
    if len(runs) < len(keys):
        raise _NewRuns  # rolls the transaction back (ingest then takes the other way)
    return runs, inserted, existing


def _lock_checkpoints(runs: dict[str, Run], events, indexes) -> list[Checkpoint]:
    wanted = {
        (runs[events[i].run].pk, events[i].step)
        for i in indexes
        if events[i].type in CHECKPOINT_TYPES and events[i].run in runs
    }
    return select_locked(
        Checkpoint,
        {"run_id": sorted({r for r, _ in wanted}), "step": sorted({s for _, s in wanted})},
    )


def _event_row(project: Project, run, actor: str, event, raw: dict, now, safe) -> tuple:
    # run: the run's id, or its key (_read_and_insert_together)
    data = {k: v for k, v in raw.items() if k not in ENVELOPE}
    step = getattr(event, "step", None)
    return (
        project.pk,
        run,
        event.id,
        event.type,
        step,
        event.time,
        now,
        actor,
        safe(data),
        "",
    )


def _insert_events_later(rows: list[tuple]) -> Pending:
    """INSERT ... ON CONFLICT DO NOTHING RETURNING event_id: the ids that are new."""
    return insert_rows_later(
        Event,
        _EVENT_COLUMNS,
        rows,
        ignore_conflicts_on=("project_id", "event_id"),
        returning=("event_id",),
    )


def _event_ids(inserted: list[tuple]) -> set[uuid.UUID]:
    return {
        value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)) for (value,) in inserted
    }
