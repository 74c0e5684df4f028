"""The rules of applying v1 events: how new events fold into runs, checkpoints and
metric points (docs/api.md), and the bulk writes that follow. The one text of these
rules; webapp/domain/ingest/apply.py decides which events are new and holds the transaction.

Tolerant of late and out-of-order events: events are folded in time order, and each
field of a run keeps the value of the newest event that set it, so a late heartbeat
cannot move a run backwards and a checkpoint.saved before its run.started still
creates the run."""

from __future__ import annotations

from datetime import datetime
from functools import cache, partial
from operator import attrgetter

from django.db import transaction
from django.db.models.base import ModelState
from django.utils import timezone

from webapp.domain.ingest.bulk_sql import (
    insert_rows_later,
    insert_with_children_later,
    update_rows_later,
)
from webapp.domain.ingest.event_schema import CHECKPOINT_TYPES, json_safe
from webapp.domain.ingest.parts import PartsFolding
from webapp.domain.ingest.sql_pipeline import Pending, commit_later, pipeline
from webapp.domain.models import Checkpoint, CheckpointFile, MetricPoint, Project, Run
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.runs import RunStatus
from webapp.domain.validation.outbox import publish_after_commit


def _later(current: datetime | None, new: datetime) -> bool:
    return current is None or new >= current


class Applier(PartsFolding):
    """Folds new events into runs, checkpoints and metric points, then writes them in
    bulk. Parts of checkpoints written by many ranks: parts.py."""

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
        self._init_parts()

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
        if not getattr(event, "clock_off", False) and (
            run.ended_at is None or event.time > run.ended_at
        ):
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

    def _on_run_preempted(self, run: Run, event) -> None:
        self._end(run, event, RunStatus.PREEMPTED)

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
            checkpoint = new_checkpoint(
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
        if event.part is not None:
            self._on_checkpoint_part(run, event)
            return
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
        self._set(checkpoint, "world_size", None)  # one report holds the whole
        self.new_parts.pop((run.pk, event.step), None)
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
        # Parts of checkpoints written by many ranks: their rows, not their files.
        parted = [c.pk for c in self.checkpoints.values() if c.world_size is not None]
        if parted:
            self._load_parts(parted)
        # The files of existing checkpoints that a whole report names, in one query, to
        # tell a repeated report from a re-save without a query per checkpoint.
        whole = {
            (self.runs[e.run].pk, e.step)
            for e in events
            if e.type == "checkpoint.saved" and e.part is None
        }
        saved_ids = [
            c.pk for key, c in self.checkpoints.items() if c.saved_at is not None and key in whole
        ]
        self.known_files = {pk: [] for pk in saved_ids}
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
        self._delete_replaced_parts()
        # Parts are written after the checkpoints have their ids: not with the COMMIT.
        commit = commit and not self.new_parts
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
        self._write_parts()

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


def new_checkpoint(**values) -> Checkpoint:
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
