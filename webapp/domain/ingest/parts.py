"""Checkpoints written by many ranks: each rank reports its own part (a `checkpoint.saved`
with a `part`: its rank, the world size, its host, and only the files it wrote), and the
parts of one (run, step) are joined into one checkpoint (docs/api.md).

The rules, folded in event time order like every event (rules.py):
- A checkpoint is `saving` until every rank below the world size has reported, then
  `reported` and checked as one; it is never checked, so never verified, with a part
  missing. The sweeper marks it `incomplete` after CHECKPOINT_PARTS_WAIT_S, naming the
  ranks that never reported (webapp/domain/parts_deadline.py); a part that arrives after
  that still completes it.
- A repeated part (same rank, same files, same location) changes nothing, whenever it
  arrives. The same rank reporting other files, newer than its part, replaces its part
  (that rank saved again): the checkpoint is checked again once complete.
- A part at another location or world size, newer than the checkpoint, is a new save of
  the step: the parts and files recorded so far go. So does a whole report (no `part`)
  newer than the parts, and a part newer than a whole report.
- A path reported by two ranks is kept once, as the first report named it; validation
  compares it with the bytes on disk either way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from webapp.domain.models import CheckpointFile, CheckpointPart
from webapp.domain.models.checkpoints import Checkpoint, CheckpointStatus
from webapp.domain.ranks import incomplete_message, waiting_message


@dataclass
class PartInfo:
    host: str
    digest: str
    file_count: int
    total_size: int
    saved_at: datetime
    files: list | None = None  # set when this batch writes the part


def files_digest(files: list[tuple]) -> str:
    return hashlib.sha256(json.dumps(sorted(files)).encode()).hexdigest()


class PartsFolding:
    """The part of rules.Applier that folds part reports (a mixin: it shares the
    Applier's checkpoints, _set and to_validate)."""

    # What rules.Applier, which mixes this in, provides.
    safe: Callable[[Any], Any]
    checkpoints: dict[tuple[int, int], Checkpoint]
    replaced_files: dict[tuple[int, int], list]
    to_validate: set[tuple[int, int]]
    _checkpoint: Callable[..., Checkpoint]
    _step_seen: Callable[..., None]
    _set: Callable[..., None]

    def _init_parts(self) -> None:
        self.parts: dict[int, dict[int, PartInfo]] = {}  # checkpoint pk -> rank -> part
        self.new_parts: dict[tuple[int, int], dict[int, PartInfo]] = {}  # (run, step) ->
        self.parts_reset: set[tuple[int, int]] = set()

    def _load_parts(self, pks: list[int]) -> None:
        for part in CheckpointPart.objects.filter(checkpoint_id__in=pks):
            self.parts.setdefault(part.checkpoint_id, {})[part.rank] = PartInfo(
                part.host, part.files_digest, part.file_count, part.total_size, part.saved_at
            )

    def _parts_of(self, checkpoint: Checkpoint) -> dict[int, PartInfo]:
        key = (checkpoint.run_id, checkpoint.step)
        if key not in self.new_parts:
            known = {} if checkpoint.pk is None else self.parts.get(checkpoint.pk, {})
            self.new_parts[key] = dict(known)
        return self.new_parts[key]

    def _reset_parts(self, checkpoint: Checkpoint) -> None:
        """Forget every part and file of the checkpoint: a new save of its step."""
        key = (checkpoint.run_id, checkpoint.step)
        self.new_parts[key] = {}
        self.parts_reset.add(key)
        self.replaced_files.pop(key, None)

    def _on_checkpoint_part(self, run, event) -> None:
        checkpoint = self._checkpoint(run, event.step, event.time)
        self._step_seen(run, event.step)
        part = event.part
        key = (run.pk, event.step)
        newer = checkpoint.saved_at is None or event.time >= checkpoint.saved_at
        files = sorted((f.path, f.size, f.sha256) for f in event.files)
        digest = files_digest(files)
        parts = self._parts_of(checkpoint)
        other_save = checkpoint.saved_at is not None and (
            checkpoint.world_size is None  # a whole report
            or checkpoint.world_size != part.world_size
            or checkpoint.location != event.location
        )
        if other_save:
            if not newer:
                return  # a part of an older save of this step, arriving late
            self._reset_parts(checkpoint)
            parts = self.new_parts[key]
        known = parts.get(part.rank)
        if known is not None and (known.digest == digest or event.time < known.saved_at):
            return  # repeated, or older than the part this rank reported since
        parts[part.rank] = PartInfo(
            part.host, digest, len(files), sum(size for _, size, _ in files), event.time, files
        )
        if newer:
            self._set(checkpoint, "saved_at", event.time)
        self._set(checkpoint, "location", event.location)
        self._set(checkpoint, "world_size", part.world_size)
        if event.format:
            self._set(checkpoint, "format", event.format)
        if event.epoch is not None:
            self._set(checkpoint, "epoch", event.epoch)
        if event.metrics:
            self._set(checkpoint, "metrics", self.safe(event.metrics))
        if event.save_seconds is not None:
            # The job waited for its slowest rank.
            slowest = max(event.save_seconds, checkpoint.save_seconds or 0.0)
            self._set(checkpoint, "save_seconds", slowest)
        self._set(checkpoint, "total_size", sum(p.total_size for p in parts.values()))
        self._set(checkpoint, "file_count", sum(p.file_count for p in parts.values()))
        self._set(checkpoint, "verified_at", None)
        self._set(checkpoint, "deleted_at", None)
        if len(parts) < part.world_size:  # every rank recorded is below it
            waiting = checkpoint.status == CheckpointStatus.INCOMPLETE
            status = CheckpointStatus.INCOMPLETE if waiting else CheckpointStatus.SAVING
            describe = incomplete_message if waiting else waiting_message
            self._set(checkpoint, "status", status)
            self._set(checkpoint, "status_message", describe(part.world_size, parts))
            self.to_validate.discard(key)
            return
        self._set(checkpoint, "status", CheckpointStatus.REPORTED)
        self._set(checkpoint, "status_message", "")
        self.to_validate.add(key)

    # --- writing --------------------------------------------------------------------

    def _delete_replaced_parts(self) -> None:
        """Before the inserts: the rows of parts (and saves) that are replaced."""
        reset = [self.checkpoints[k].pk for k in self.parts_reset if self.checkpoints[k].pk]
        # A whole report that replaces a save in parts takes its parts' rows too.
        reset += [
            self.checkpoints[k].pk
            for k in self.replaced_files
            if self.checkpoints[k].pk and self.parts.get(self.checkpoints[k].pk)
        ]
        if reset:
            CheckpointFile.objects.filter(checkpoint_id__in=reset).delete()
            CheckpointPart.objects.filter(checkpoint_id__in=reset).delete()
        for key, parts in self.new_parts.items():
            pk = self.checkpoints[key].pk
            if pk is None or key in self.parts_reset:
                continue
            known = self.parts.get(pk, {})
            ranks = [r for r, p in parts.items() if p.files is not None and r in known]
            if ranks:  # a rank that saved its part again
                CheckpointFile.objects.filter(checkpoint_id=pk, rank__in=ranks).delete()

    def _write_parts(self) -> None:
        """After the inserts (every checkpoint has its id): the parts written by this
        batch, and their files."""
        rows, files = [], []
        for key, parts in self.new_parts.items():
            checkpoint = self.checkpoints[key]
            for rank, part in sorted(parts.items()):
                if part.files is None:
                    continue
                rows.append(
                    CheckpointPart(
                        checkpoint_id=checkpoint.pk,
                        rank=rank,
                        host=part.host,
                        file_count=part.file_count,
                        total_size=part.total_size,
                        files_digest=part.digest,
                        saved_at=part.saved_at,
                    )
                )
                files += [
                    CheckpointFile(
                        checkpoint_id=checkpoint.pk, path=path, size=size, sha256=sha, rank=rank
                    )
                    for path, size, sha in part.files
                ]
        if not rows:
            return
        CheckpointPart.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["checkpoint", "rank"],
            update_fields=[
                "host",
                "file_count",
                "total_size",
                "files_digest",
                "saved_at",
                "received_at",
            ],
            batch_size=1000,
        )
        # A path that another rank reported first is kept as that rank reported it.
        CheckpointFile.objects.bulk_create(files, ignore_conflicts=True, batch_size=2000)
