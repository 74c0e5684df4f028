"""Applying v1 events to the database: the write path of POST /api/v1/events.

The contract this module keeps (docs/api.md):

* Idempotent by event id. Each event row is inserted with ON CONFLICT DO NOTHING
  RETURNING, and only the rows that came back are applied. Two requests carrying the
  same event at the same moment both reach that INSERT; PostgreSQL makes the second wait
  on the first's uncommitted index entry and then returns nothing for it, so the event
  is applied exactly once whichever commits first.
* Tolerant of late and out-of-order events: a batch is applied in time order, and each
  field of a run keeps the value of the newest event that set it, so a late heartbeat
  cannot move a run backwards and a checkpoint.saved before its run.started still
  creates the run.
* Bounded work per batch: a constant number of queries whatever the batch size
  (bulk inserts, one SELECT ... FOR UPDATE per table), so a client that batches gets
  PostgreSQL's bulk speed.
* No network call inside the transaction: validation tasks are published on commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache, partial
from operator import attrgetter

from django.db import connection, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from webapp.domain import ingest_in_sql
from webapp.domain.bulk_sql import (
    Pending,
    commit_later,
    generic_plans_later,
    insert_rows_by_key_later,
    insert_rows_later,
    insert_with_children_later,
    pipeline,
    select_locked,
    select_locked_by_key_later,
    select_locked_later,
    update_rows_later,
)
from webapp.domain.event_schema import CHECKPOINT_TYPES, ENVELOPE, json_safe
from webapp.domain.models import (
    Checkpoint,
    CheckpointFile,
    Event,
    MetricPoint,
    Project,
    Run,
)
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.runs import RunStatus
from webapp.domain.validation_outbox import publish_after_commit

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

    actor: who sent them, or one actor per event (webapp/domain/group_commit.py applies
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
    together = connection.vendor == "postgresql"
    stored = None
    if ingest_in_sql.takes(events, unique, finite):
        try:
            stored = ingest_in_sql.store(project, events, unique, actors, raw)
        except ingest_in_sql.Declined as declined:
            # Nothing was kept. A new run: straight to the way that creates runs first.
            together = together and not declined.new_runs
    if stored is None:
        try:
            stored = _store(project, keys, events, unique, actors, raw, safe, together)
        except _NewRuns:
            # A run the events name did not exist: its events may have been inserted
            # before its row was locked, and waiting for that lock while holding them
            # can deadlock with a request that holds the lock and sends the same events.
            # All of it was rolled back; now the runs are created and locked first.
            stored = _store(project, keys, events, unique, actors, raw, safe, False)
    inserted, enqueued = stored
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
        # Applied in time order so that a batch replayed from a spool, or events that
        # crossed on the network, end in the state the newest event describes.
        fresh.sort(key=lambda e: e.time)
        applier = _Applier(project, runs, safe)
        applier.apply(fresh, existing)
        # The last round trip carries the COMMIT too, unless a caller's transaction
        # holds this one (then that caller commits).
        enqueued = applier.flush(commit=together and len(connection.atomic_blocks) == 1)
    return inserted, enqueued


def _read_and_insert_together(project: Project, keys: list[str], events, unique, row):
    """In one round trip (a transaction's BEGIN included): lock the runs, insert the
    events, lock the checkpoints they name. The events and checkpoints name their runs
    by key, so nothing waits for the runs' ids. Under load a round trip costs about as
    much as the work of an event (bench/ingest.py), and a single event's transaction
    had six of them.

    When a run does not exist yet this raises _NewRuns: only the first events of a run
    pay for the way round."""
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


def _later(current: datetime | None, new: datetime) -> bool:
    return current is None or new >= current


class _Applier:
    """Folds new events into runs, checkpoints and metric points, then writes them in
    bulk."""

    def __init__(self, project: Project, runs: dict[str, Run], safe=json_safe):
        self.safe = safe
        self.project = project
        self.runs = runs
        self.dirty_runs: dict[int, set[str]] = {}
        self.checkpoints: dict[tuple[int, int], Checkpoint] = {}
        self.new_checkpoints: list[Checkpoint] = []
        self.changed_checkpoints: dict[int, set[str]] = {}
        self.replaced_files: dict[tuple[int, int], list] = {}
        self.to_validate: set[tuple[int, int]] = set()
        self.metric_points: dict[tuple[int, int], MetricPoint] = {}

    # --- folding --------------------------------------------------------------------

    def apply(self, events: list, existing: list[Checkpoint]) -> None:
        """Fold events in; existing: the locked rows of the checkpoints they name."""
        self.known_files: dict[int, list] = {}
        self._load_checkpoints(events, existing)
        for event in events:
            run = self.runs[event.run]
            self._touch(run, "last_seen_at", event.time, only_if_later=True)
            handler = getattr(self, "_on_" + event.type.replace(".", "_"))
            handler(run, event)

    def _touch(self, run: Run, name: str, value, *, only_if_later: bool = False) -> None:
        if only_if_later and not _later(getattr(run, name), value):
            return
        if getattr(run, name) != value:
            setattr(run, name, value)
            self.dirty_runs.setdefault(run.pk, set()).add(name)

    def _on_run_started(self, run: Run, event) -> None:
        if not _later(run.started_at, event.time):
            return  # an older start of the same key (a requeued job) arrived late
        self._touch(run, "started_at", event.time)
        for name in ("name", "host", "framework", "world_size", "expected_interval_s"):
            self._touch(run, name, getattr(event, name))
        self._touch(run, "config", self.safe(event.config))
        self._touch(run, "tags", event.tags)
        if event.resumed_from is not None:
            self._touch(run, "resumed_from_ref", str(event.resumed_from))
            self._touch(run, "resumed_from_id", self._resolve_checkpoint(event.resumed_from))
        if run.ended_at is None or event.time > run.ended_at:
            # Started after its last end: the same key running again (a requeue).
            self._touch(run, "status", RunStatus.RUNNING)
            self._touch(run, "ended_at", None)
            self._touch(run, "exit_code", None)
            self._touch(run, "error", "")

    def _resolve_checkpoint(self, ref) -> int | None:
        try:
            pk = int(ref)
        except (TypeError, ValueError):
            return None
        return (
            Checkpoint.objects.filter(project=self.project, pk=pk)
            .values_list("pk", flat=True)
            .first()
        )

    def _on_run_heartbeat(self, run: Run, event) -> None:
        if not _later(run.last_heartbeat_at, event.time):
            return
        self._touch(run, "last_heartbeat_at", event.time)
        if event.step is not None:
            self._touch(run, "last_step", event.step)
        if event.metrics:
            self._touch(run, "last_metrics", self.safe(event.metrics))

    def _on_run_finished(self, run: Run, event) -> None:
        self._end(run, event, RunStatus.FINISHED)

    def _on_run_failed(self, run: Run, event) -> None:
        self._end(run, event, RunStatus.FAILED)

    def _end(self, run: Run, event, status: str) -> None:
        if run.started_at is not None and event.time < run.started_at:
            return  # the end of an earlier attempt, arriving after the next start
        if not _later(run.ended_at, event.time):
            return
        self._touch(run, "status", status)
        self._touch(run, "ended_at", event.time)
        self._touch(run, "exit_code", event.exit_code)
        self._touch(run, "error", event.error)

    def _on_metrics(self, run: Run, event) -> None:
        for point in event.points:
            key = (run.pk, point.step)
            existing = self.metric_points.get(key)
            if existing is None:
                self.metric_points[key] = MetricPoint(
                    run=run, step=point.step, values=dict(point.values), time=event.time
                )
            else:
                existing.values.update(point.values)
                existing.time = max(existing.time, event.time)

    def _step_seen(self, run: Run, step: int) -> None:
        if run.last_step is None or step > run.last_step:
            self._touch(run, "last_step", step)

    def _checkpoint(self, run: Run, step: int, time: datetime) -> Checkpoint:
        key = (run.pk, step)
        checkpoint = self.checkpoints.get(key)
        if checkpoint is None:
            checkpoint = _new_checkpoint(
                project_id=self.project.pk,
                run_id=run.pk,
                step=step,
                status=CheckpointStatus.SAVING,
            )
            self.checkpoints[key] = checkpoint
            self.new_checkpoints.append(checkpoint)
        return checkpoint

    def _set(self, checkpoint: Checkpoint, name: str, value) -> None:
        if getattr(checkpoint, name) != value:
            setattr(checkpoint, name, value)
            if checkpoint.pk is not None:
                self.changed_checkpoints.setdefault(checkpoint.pk, set()).add(name)

    def _on_checkpoint_started(self, run: Run, event) -> None:
        self._checkpoint(run, event.step, event.time)
        self._step_seen(run, event.step)

    def _on_checkpoint_failed(self, run: Run, event) -> None:
        checkpoint = self._checkpoint(run, event.step, event.time)
        self._step_seen(run, event.step)
        if checkpoint.status == CheckpointStatus.SAVING:
            self._set(checkpoint, "status", CheckpointStatus.FAILED)
            self._set(checkpoint, "status_message", "The job reported that this save failed.")
        # A failure reported after a successful save of the same step is kept in the
        # event log; validation, not this event, decides what the files are worth.
        self._set(checkpoint, "error", event.error)

    def _on_checkpoint_saved(self, run: Run, event) -> None:
        checkpoint = self._checkpoint(run, event.step, event.time)
        self._step_seen(run, event.step)
        if checkpoint.saved_at is not None and event.time < checkpoint.saved_at:
            return  # an older report of a step that was saved again since
        files = [(f.path, f.size, f.sha256) for f in event.files]
        same = (
            checkpoint.saved_at is not None
            and checkpoint.location == event.location
            and sorted(files) == self._files_of(checkpoint)
        )
        self._set(checkpoint, "saved_at", event.time)
        self._set(checkpoint, "epoch", event.epoch)
        self._set(checkpoint, "save_seconds", event.save_seconds)
        self._set(checkpoint, "metrics", self.safe(event.metrics))
        self._set(checkpoint, "format", event.format)
        if same:
            return
        # New, or the step was written again with other bytes: check it from scratch.
        self._set(checkpoint, "location", event.location)
        self._set(checkpoint, "total_size", sum(size for _, size, _ in files))
        self._set(checkpoint, "file_count", len(files))
        self._set(checkpoint, "status", CheckpointStatus.REPORTED)
        self._set(checkpoint, "status_message", "")
        self._set(checkpoint, "verified_at", None)
        self._set(checkpoint, "deleted_at", None)
        self.replaced_files[(run.pk, event.step)] = sorted(files)
        self.to_validate.add((run.pk, event.step))

    def _files_of(self, checkpoint: Checkpoint) -> list:
        key = (checkpoint.run_id, checkpoint.step)
        if key in self.replaced_files:
            return self.replaced_files[key]
        if checkpoint.pk is None:
            return []
        return self.known_files.get(checkpoint.pk, [])

    def _load_checkpoints(self, events: list, existing: list[Checkpoint]) -> None:
        wanted = {(self.runs[e.run].pk, e.step) for e in events if e.type in CHECKPOINT_TYPES}
        if not wanted:
            return
        for checkpoint in existing:
            key = (checkpoint.run_id, checkpoint.step)
            if key in wanted:
                self.checkpoints[key] = checkpoint
        # The files of existing checkpoints, in one query, to tell a repeated report from
        # a re-save without a query per checkpoint.
        saved_ids = [c.pk for c in self.checkpoints.values() if c.saved_at is not None]
        self.known_files: dict[int, list] = {pk: [] for pk in saved_ids}
        if not saved_ids:
            return
        for pk, path, size, sha in CheckpointFile.objects.filter(
            checkpoint_id__in=saved_ids
        ).values_list("checkpoint_id", "path", "size", "sha256"):
            self.known_files[pk].append((path, size, sha))
        for files in self.known_files.values():
            files.sort()

    # --- writing --------------------------------------------------------------------

    def flush(self, commit: bool = False) -> list[int]:
        """Write everything folded so far; return the ids of checkpoints to validate.
        commit: send the COMMIT with the last writes (the caller's atomic block is the
        outermost and ends right after)."""
        now = timezone.now()
        for key in self.to_validate:
            checkpoint = self.checkpoints[key]
            self._set(checkpoint, "validation_enqueued_at", now)
        if self.changed_checkpoints:
            by_pk = {c.pk: c for c in self.checkpoints.values() if c.pk is not None}
            changed = [by_pk[pk] for pk in sorted(self.changed_checkpoints)]
            for checkpoint in changed:
                checkpoint.updated_at = now
            names = set().union(*self.changed_checkpoints.values()) | {"updated_at"}
            Checkpoint.objects.bulk_update(changed, sorted(names), batch_size=500)
        new_keys = {(c.run_id, c.step) for c in self.new_checkpoints}
        resaved = [
            self.checkpoints[key].pk
            for key in self.replaced_files
            if key not in new_keys and self.known_files.get(self.checkpoints[key].pk)
        ]
        if resaved:  # a step saved again with other files: the old list goes
            CheckpointFile.objects.filter(checkpoint_id__in=resaved).delete()
        self._flush_metrics()
        # What is left does not depend on answers: one round trip for all of it.
        with pipeline():
            created = _insert_checkpoints_later(
                self.new_checkpoints,
                [
                    (*key, path, size, sha)
                    for key, files in self.replaced_files.items()
                    if key in new_keys
                    for path, size, sha in files
                ],
            )
            files_of_existing = insert_rows_later(
                CheckpointFile,
                _FILE_COLUMNS,
                [
                    (self.checkpoints[key].pk, path, size, sha)
                    for key, files in self.replaced_files.items()
                    if key not in new_keys
                    for path, size, sha in files
                ],
            )
            runs = [
                update_rows_later(Run, attnames, rows)
                for attnames, rows in self._run_updates().items()
            ]
            ids = {(run_id, step): pk for pk, run_id, step in created.result()}
            files_of_existing.result()
            if commit:
                committed = commit_later()
            for update in runs:
                update.result()
            if commit:
                committed.result()
        for checkpoint in self.new_checkpoints:
            checkpoint.pk = ids[(checkpoint.run_id, checkpoint.step)]
            checkpoint._state.adding = False

        to_validate = sorted(self.checkpoints[key].pk for key in self.to_validate)
        if to_validate:
            transaction.on_commit(partial(publish_after_commit, to_validate))
        return to_validate

    def _flush_metrics(self) -> None:
        if not self.metric_points:
            return
        runs = {run_id for run_id, _ in self.metric_points}
        steps = {step for _, step in self.metric_points}
        for existing in MetricPoint.objects.filter(run_id__in=runs, step__in=steps):
            point = self.metric_points.get((existing.run_id, existing.step))
            if point is not None:
                point.values = {**existing.values, **point.values}
        MetricPoint.objects.bulk_create(
            [
                MetricPoint(run=p.run, step=p.step, values=json_safe(p.values), time=p.time)
                for p in self.metric_points.values()
            ],
            update_conflicts=True,
            unique_fields=["run", "step"],
            update_fields=["values", "time"],
            batch_size=2000,
        )

    def _run_updates(self) -> dict[tuple, list[tuple]]:
        """{attnames: [(pk, *values)]}: runs that changed the same columns are updated
        by one statement."""
        by_pk = {r.pk: r for r in self.runs.values()}
        out: dict[tuple, list[tuple]] = {}
        for pk, names in sorted(self.dirty_runs.items()):
            run = by_pk[pk]
            attnames = tuple(sorted(_attname(Run, name) for name in names))
            out.setdefault(attnames, []).append((pk, *(getattr(run, a) for a in attnames)))
        return out


def _new_checkpoint(**values) -> Checkpoint:
    """Checkpoint(**values) at a fifth of the cost: every field's default, then the
    values. Model.__init__ checks each keyword against every field, which was a sixth of
    a batch's CPU; this makes the same instance from the same defaults."""
    checkpoint = Checkpoint.__new__(Checkpoint)
    checkpoint._state = ModelState()
    fields = checkpoint.__dict__
    constant, made = _checkpoint_defaults()
    fields.update(constant)
    for attname, default in made:
        fields[attname] = default()
    fields.update(values)
    return checkpoint


@cache
def _checkpoint_defaults() -> tuple[dict, tuple]:
    """The defaults that are constants (None, '', 0, an enum member), computed once, and
    the callables of those made anew for each instance (a dict, the time now)."""
    constant, made = {}, []
    for model_field in Checkpoint._meta.concrete_fields:
        if model_field.has_default() and callable(model_field.default):
            made.append((model_field.attname, model_field.get_default))
        else:
            constant[model_field.attname] = model_field.get_default()
    return constant, tuple(made)


def _attname(model, name: str) -> str:
    return model._meta.get_field(name).attname


_CHECKPOINT_FIELDS: tuple | None = None


_FILE_COLUMNS = ("checkpoint_id", "path", "size", "sha256")


def _insert_checkpoints_later(checkpoints: list[Checkpoint], files: list[tuple]) -> Pending:
    """Insert new checkpoints and their files ((run_id, step, path, size, sha256)) in one
    statement; the answer is (pk, run_id, step) for each checkpoint."""
    global _CHECKPOINT_FIELDS
    if _CHECKPOINT_FIELDS is None:
        _CHECKPOINT_FIELDS = tuple(
            f.attname for f in Checkpoint._meta.concrete_fields if not f.primary_key
        )
    values_of = attrgetter(*_CHECKPOINT_FIELDS)
    rows = [values_of(c) for c in checkpoints]
    return insert_with_children_later(
        Checkpoint,
        _CHECKPOINT_FIELDS,
        rows,
        ("run_id", "step"),
        CheckpointFile,
        _FILE_COLUMNS,
        files,
    )


def enqueue_validations(checkpoint_ids: list[int]) -> None:
    """Put validations on the queue (called after commit).

    One checkpoint: its validation task. Several: one dispatch message that a worker fans
    out, because publishing costs about a millisecond per message and a batch of 1000
    must not spend a second of the request doing it.

    If the broker is down the events are already safe in the database: the checkpoints
    keep validation_enqueued_at NULL and workers.sweeper puts them on the queue later."""
    from workers.validate import dispatch_validations

    if len(checkpoint_ids) > 1:
        try:
            # argsrepr: Celery would otherwise write a repr of every id into the header.
            dispatch_validations.apply_async(
                (list(checkpoint_ids),), argsrepr=f"[{len(checkpoint_ids)} checkpoint ids]"
            )
        except Exception:
            log.exception(
                "could not reach the broker to enqueue %d validations", len(checkpoint_ids)
            )
            Checkpoint.objects.filter(pk__in=checkpoint_ids).update(validation_enqueued_at=None)
        return
    publish_validations(checkpoint_ids)


def publish_validations(checkpoint_ids: list[int]) -> None:
    """One validation task per checkpoint, over one broker connection."""
    from workers.validate import validate_checkpoint

    failed: list[int] = []
    try:
        with validate_checkpoint.app.producer_or_acquire() as producer:
            for checkpoint_id in checkpoint_ids:
                try:
                    validate_checkpoint.apply_async((checkpoint_id,), producer=producer)
                except Exception:
                    failed.append(checkpoint_id)
                    if len(failed) == 1:
                        log.exception(
                            "could not enqueue validation of checkpoint %s", checkpoint_id
                        )
    except Exception:
        log.exception("could not reach the broker to enqueue %d validations", len(checkpoint_ids))
        failed = list(checkpoint_ids)
    if failed:
        Checkpoint.objects.filter(pk__in=failed).update(validation_enqueued_at=None)
