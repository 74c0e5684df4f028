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
from functools import partial

from django.db import transaction
from django.utils import timezone

from webapp.domain.bulk_sql import insert_rows, select_locked, update_row
from webapp.domain.event_schema import CHECKPOINT_TYPES, json_safe
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

_ENVELOPE = ("id", "type", "run", "time")
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
    project: Project, actor: str | Sequence[str], events: Sequence, raw: Sequence[dict]
) -> IngestResult:
    """Store and apply validated events (event_schema models) with their raw dicts.

    actor: who sent them, or one actor per event (webapp/domain/group_commit.py applies
    the requests of several tokens together). Returns which event ids were new and which
    were repeats (of an earlier delivery, or of an earlier event in the same batch)."""
    actors = [actor] * len(events) if isinstance(actor, str) else actor
    firsts: dict[uuid.UUID, int] = {}
    for i, event in enumerate(events):
        firsts.setdefault(event.id, i)
    unique = sorted(firsts.values())

    with transaction.atomic():
        runs = _lock_runs(project, sorted({events[i].run for i in unique}))
        now = timezone.now()
        rows = [
            _event_row(project, runs[events[i].run], actors[i], events[i], raw[i], now)
            for i in unique
        ]
        inserted = _insert_events(rows)
        fresh = [events[i] for i in unique if events[i].id in inserted]
        # Applied in time order so that a batch replayed from a spool, or events that
        # crossed on the network, end in the state the newest event describes.
        fresh.sort(key=lambda e: e.time)
        applier = _Applier(project, runs)
        applier.apply(fresh)
        enqueued = applier.flush()

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


def _event_row(project: Project, run: Run, actor: str, event, raw: dict, now) -> tuple:
    data = {k: v for k, v in raw.items() if k not in _ENVELOPE}
    step = getattr(event, "step", None)
    return (
        project.pk,
        run.pk,
        event.id,
        event.type,
        step,
        event.time,
        now,
        actor,
        json_safe(data),
        "",
    )


def _insert_events(rows: list[tuple]) -> set[uuid.UUID]:
    """INSERT ... ON CONFLICT DO NOTHING RETURNING event_id: the ids that are new."""
    inserted = insert_rows(
        Event,
        _EVENT_COLUMNS,
        rows,
        ignore_conflicts_on=("project_id", "event_id"),
        returning=("event_id",),
    )
    return {
        value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)) for (value,) in inserted
    }


def _later(current: datetime | None, new: datetime) -> bool:
    return current is None or new >= current


class _Applier:
    """Folds new events into runs, checkpoints and metric points, then writes them in
    bulk."""

    def __init__(self, project: Project, runs: dict[str, Run]):
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

    def apply(self, events: list) -> None:
        self.known_files: dict[int, list] = {}
        self._load_checkpoints(events)
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
        self._touch(run, "config", json_safe(event.config))
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
            self._touch(run, "last_metrics", json_safe(event.metrics))

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
            checkpoint = Checkpoint(
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
        self._set(checkpoint, "metrics", json_safe(event.metrics))
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

    def _load_checkpoints(self, events: list) -> None:
        wanted = {(self.runs[e.run].pk, e.step) for e in events if e.type in CHECKPOINT_TYPES}
        if not wanted:
            return
        run_ids = {run_id for run_id, _ in wanted}
        steps = {step for _, step in wanted}
        existing = select_locked(Checkpoint, {"run_id": sorted(run_ids), "step": sorted(steps)})
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

    def flush(self) -> list[int]:
        """Write everything folded so far; return the ids of checkpoints to validate."""
        now = timezone.now()
        for key in self.to_validate:
            checkpoint = self.checkpoints[key]
            self._set(checkpoint, "validation_enqueued_at", now)
        if self.new_checkpoints:
            _insert_checkpoints(self.new_checkpoints)
        if self.changed_checkpoints:
            by_pk = {c.pk: c for c in self.checkpoints.values()}
            changed = [by_pk[pk] for pk in sorted(self.changed_checkpoints)]
            for checkpoint in changed:
                checkpoint.updated_at = now
            names = set().union(*self.changed_checkpoints.values()) | {"updated_at"}
            Checkpoint.objects.bulk_update(changed, sorted(names), batch_size=500)
        if self.replaced_files:
            ids = {k: self.checkpoints[k].pk for k in self.replaced_files}
            resaved = [pk for pk in ids.values() if self.known_files.get(pk)]
            if resaved:  # new checkpoints have no files to replace
                CheckpointFile.objects.filter(checkpoint_id__in=resaved).delete()
            insert_rows(
                CheckpointFile,
                ("checkpoint_id", "path", "size", "sha256"),
                [
                    (ids[key], path, size, sha)
                    for key, files in self.replaced_files.items()
                    for path, size, sha in files
                ],
            )
        by_pk = {r.pk: r for r in self.runs.values()}
        for pk, names in sorted(self.dirty_runs.items()):
            run = by_pk[pk]
            update_row(
                Run, pk, {_attname(Run, name): getattr(run, _attname(Run, name)) for name in names}
            )
        self._flush_metrics()

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


def _attname(model, name: str) -> str:
    return model._meta.get_field(name).attname


_CHECKPOINT_FIELDS: tuple | None = None


def _insert_checkpoints(checkpoints: list[Checkpoint]) -> None:
    """Insert new checkpoints in one statement and give each its primary key."""
    global _CHECKPOINT_FIELDS
    if _CHECKPOINT_FIELDS is None:
        _CHECKPOINT_FIELDS = tuple(
            f.attname for f in Checkpoint._meta.concrete_fields if not f.primary_key
        )
    rows = [tuple(getattr(c, name) for name in _CHECKPOINT_FIELDS) for c in checkpoints]
    back = insert_rows(Checkpoint, _CHECKPOINT_FIELDS, rows, returning=("id", "run_id", "step"))
    ids = {(run_id, step): pk for pk, run_id, step in back}
    for checkpoint in checkpoints:
        checkpoint.pk = ids[(checkpoint.run_id, checkpoint.step)]
        checkpoint._state.adding = False


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
