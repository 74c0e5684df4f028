"""Small groups of the most frequent events applied by one PostgreSQL statement.

Why: a single event's transaction in webapp/domain/ingest.py costs two pipelined round
trips and, on these cores, about as much Python as PostgreSQL CPU (building statements,
adapting parameters, reading rows into models, folding them). The web process's
committer (webapp/domain/group_commit.py) runs one such transaction for every few
requests, and under load from single-event clients that Python is what the process
spends its time on. Here the events go to the server as one JSON parameter and the
function lifeboat_ingest_v1 (migration 0005; 0007 adds a set-based way for groups of
new saves only) applies them with the same rules, in one round trip and, outside a
caller's transaction, as its own transaction (no BEGIN, no COMMIT). docs/benchmarks.md
has the figures.

It takes what a training job sends all the time: run.heartbeat, checkpoint.started,
checkpoint.failed, and checkpoint.saved of a step not saved before. Everything else
(run.started and the ends of a run, metrics, a run not created yet, a step saved again)
the function refuses with its own SQLSTATE before anything is kept, and ingest() takes
the general way. tests/test_ingest_in_sql.py sends the same events both ways and
compares every row written.
"""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from functools import partial

import orjson
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from webapp.domain import validation_outbox
from webapp.domain.event_schema import ENVELOPE, json_safe

TYPES = frozenset({"run.heartbeat", "checkpoint.started", "checkpoint.failed", "checkpoint.saved"})
# Larger groups are batches, which the general way writes with set-based statements;
# the function loops over events.
BELOW = 100
NEW_RUNS = "LBF01"  # a run does not exist yet
ELSEWHERE = "LBF02"  # an event the function leaves to ingest.py
# The function is not there: code newer than the database (migration 0005 not run yet,
# as during a rolling upgrade). The Python way still works.
UNDEFINED_FUNCTION = "42883"


class Declined(Exception):
    def __init__(self, new_runs: bool):
        self.new_runs = new_runs


def takes(events, unique: list[int], finite: bool) -> bool:
    """Whether these events (their first copies, `unique`) may go to the function.
    finite: their values hold no NaN or Infinity (as the general way, the event rows
    are written as given)."""
    return (
        settings.INGEST_IN_SQL
        and finite
        and connection.vendor == "postgresql"
        and len(unique) < BELOW
        and all(events[i].type in TYPES for i in unique)
    )


def store(project, events, unique: list[int], actors, raw) -> tuple[set[uuid.UUID], list[int]]:
    """Apply the events; (the ids of those that were new, the checkpoints to validate).
    Raises Declined, with nothing kept, when the function leaves them to ingest.py."""
    payload = orjson.dumps([event_json(events[i], raw[i], actors[i]) for i in unique]).decode()
    params = [project.pk, timezone.now(), payload]
    # In a caller's transaction, a savepoint, so that a declined call leaves it usable;
    # else the statement is a transaction of its own: a single round trip.
    scope = transaction.atomic() if connection.in_atomic_block else nullcontext()
    try:
        with scope, connection.cursor() as cursor:
            cursor.execute("SELECT lifeboat_ingest_v1(%s, %s, %s::jsonb)", params)
            (answer,) = cursor.fetchone()
    except DatabaseError as exc:
        state = getattr(exc.__cause__, "sqlstate", None)
        if state in (NEW_RUNS, ELSEWHERE, UNDEFINED_FUNCTION):
            raise Declined(new_runs=state == NEW_RUNS) from None
        raise
    if isinstance(answer, str | bytes):
        answer = orjson.loads(answer)
    to_validate = sorted(answer["validate"])
    if to_validate:
        # Now when this was its own transaction, else when the caller's commits.
        transaction.on_commit(partial(validation_outbox.publish_after_commit, to_validate))
    return {uuid.UUID(value) for value in answer["new"]}, to_validate


def event_json(event, raw: dict, actor: str) -> dict:
    """One event as the function reads it."""
    out = {
        "id": event.id,
        "type": event.type,
        "run": event.run,
        "time": event.time,
        "step": getattr(event, "step", None),
        "actor": actor,
        "data": {k: v for k, v in raw.items() if k not in ENVELOPE},
    }
    if event.type == "checkpoint.saved":
        files = sorted((f.path, f.size, f.sha256) for f in event.files)
        out.update(
            epoch=event.epoch,
            location=event.location,
            format=event.format,
            files=files,
            total_size=sum(size for _, size, _ in files),
            file_count=len(files),
            save_seconds=event.save_seconds,
            metrics=json_safe(event.metrics),
        )
    elif event.type == "run.heartbeat":
        out["metrics"] = json_safe(event.metrics)
    elif event.type == "checkpoint.failed":
        out["error"] = event.error
    return out
