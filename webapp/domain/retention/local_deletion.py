"""Deleting a checkpoint's local copy, recorded only once it happened.

The states, each written in its own transaction under the checkpoint's row lock:

    verified --(retention decides, re-checked under lock)--> deleting
    deleting --(files removed)--> deleted (deleted_at set, checkpoint.deleted event)
    deleting --(removal failed)--> verified (checkpoint.delete_failed event, the error)

A worker killed while a checkpoint is `deleting` leaves it so; the next apply of the
project (finish_interrupted) removes what is left and marks it `deleted`, or puts it back
to `verified` with the error. Removing is idempotent: files already gone (removed by
hand, or by the killed worker) are no error. Rows that older versions marked `deleted`
before removing the files (deleted_at empty) are finished the same way.

What is removed (confined_files, no window between check and use):
- a single-file checkpoint: the entry at its location (a symlink there: the link only);
- a directory checkpoint: each listed file, walked inside the checkpoint's directory,
  following no symlink that leaves it; a symlink met on the way (a file or a directory
  shared with another checkpoint, or pointing anywhere else) is removed as an entry, its
  target untouched; then the directories left empty, the location's last.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import stat

from django.db import transaction
from django.utils import timezone

from webapp.domain import confined_files, publish
from webapp.domain.confined_files import Refused
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Event
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.replication.storage import s3_client
from webapp.domain.validation import integrity, node_local

log = logging.getLogger(__name__)


class RemovalFailed(Exception):
    """The local copy could not be removed (whole); the message says why."""


def remove_local_copy(checkpoint, paths: list[str] | None = None) -> None:
    """Removes the checkpoint's files (see the module docstring), or only `paths` of
    them (one host's share of a node-local checkpoint). RemovalFailed if any listed file
    is still there afterwards or its path was refused."""
    if paths is None:
        paths = list(checkpoint.files.values_list("path", flat=True))
    if checkpoint.location.startswith("s3://"):
        _remove_s3(checkpoint, paths)
        return
    try:
        with confined_files.Tree(checkpoint.project.allowed_roots) as tree:
            _remove_local(tree, checkpoint.location, paths)
    except Refused as exc:
        raise RemovalFailed(f"refused: {exc}") from None
    except OSError as exc:
        raise RemovalFailed(
            f"{exc.strerror or exc}: {exc.filename or checkpoint.location}"
        ) from None


def _remove_local(tree, location: str, paths: list[str]) -> None:
    place = tree.locate(location, "location")
    try:
        info = tree.lstat(place)
    except (FileNotFoundError, NotADirectoryError):
        return  # gone already
    if not stat.S_ISDIR(info.st_mode):
        tree.unlink(place)  # a single file, or a symlink: the entry itself
        return
    relative = [confined_files.relative_parts(p, "file path") for p in paths]
    try:
        inside = tree.subtree(place)
    except FileNotFoundError:
        return  # removed meanwhile (by hand, or by another run finishing it)
    with inside:
        top = inside.locate(str(place))
        for parts in relative:
            _remove_entry(inside, top, parts)
        for parts in sorted(relative, key=len, reverse=True):
            _remove_empty_parents(inside, top, parts)
    try:
        tree.rmdir(place)
    except OSError as exc:  # only if empty: anything else the job left there stays
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            raise


def _remove_entry(tree, top, parts: list[str]) -> None:
    """Unlinks `parts` below `top`; if a component on the way is a symlink, that link
    (the checkpoint's own entry) is removed instead and nothing it points to."""
    for depth in range(1, len(parts) + 1):
        place = confined_files.Place(tree, top.root, top.parts + tuple(parts[:depth]))
        try:
            info = tree.lstat(place)
        except (FileNotFoundError, NotADirectoryError):
            return  # removed by hand, or by an earlier run
        if depth == len(parts) or stat.S_ISLNK(info.st_mode):
            if stat.S_ISDIR(info.st_mode):
                return  # a listed "file" that is a directory: left as the job made it
            with contextlib.suppress(FileNotFoundError):
                tree.unlink(place)
            return


def _remove_empty_parents(tree, top, parts: list[str]) -> None:
    for depth in range(len(parts) - 1, 0, -1):
        place = confined_files.Place(tree, top.root, top.parts + tuple(parts[:depth]))
        try:
            tree.rmdir(place)
        except OSError:
            return  # not empty, not a directory, or gone: stop climbing


def _remove_s3(checkpoint, paths: list[str]) -> None:
    location = checkpoint.location
    if ".." in location.split("/") or not integrity.s3_allowed(
        location, checkpoint.project.allowed_roots
    ):
        raise RemovalFailed(f"refused: {location} is not under an s3:// allowed root")
    bucket, prefix = integrity.split_s3(location.rstrip("/") + "/")
    try:
        keys = [prefix + "/".join(confined_files.relative_parts(p, "file path")) for p in paths]
    except Refused as exc:
        raise RemovalFailed(f"refused: {exc}") from None
    client = s3_client(checkpoint.project, bucket)
    try:
        for key in keys:
            client.delete_object(Bucket=bucket, Key=key)  # absent: no error
    except Exception as exc:  # noqa: BLE001 (the store's error goes to the event log)
        raise RemovalFailed(f"the object store refused: {exc}") from None


# -- the recorded steps ------------------------------------------------------------------


def carry_out(checkpoint_id: int, actor: str, why: str, previous_message: str | None) -> bool:
    """Removes the files of a checkpoint marked `deleting` (or left `deleted` without
    deleted_at), then records the outcome. True when it is now deleted."""

    checkpoint = Checkpoint.objects.select_related("project").filter(pk=checkpoint_id).first()
    if checkpoint is None:
        return False
    if node_local.applies(checkpoint):
        # Its files are on its hosts' disks: each host's worker removes its share
        # (host_deletion.py), and the last one records the deletion.
        hosts = checkpoint.parts.filter(removed_at__isnull=True).values_list("host", flat=True)
        for host in sorted(set(hosts)):
            publish.send(
                "workers.retention.remove_share",
                (checkpoint.pk, host, actor, why, previous_message),
                queue=node_local.queue_for(host),
            )
        return False
    error = None
    try:
        remove_local_copy(checkpoint)
    except RemovalFailed as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 (recorded; later checkpoints still go)
        log.exception("retention: removing %s failed", checkpoint.location)
        error = f"{type(exc).__name__}: {exc}"
    return record(checkpoint_id, actor, why, previous_message, error)


def record(checkpoint_id, actor: str, why: str, previous_message, error) -> bool:
    now = timezone.now()
    with transaction.atomic():
        checkpoint = for_update(Checkpoint.objects.filter(pk=checkpoint_id)).first()
        unfinished = checkpoint is not None and (
            checkpoint.status == CheckpointStatus.DELETING
            or (checkpoint.status == CheckpointStatus.DELETED and checkpoint.deleted_at is None)
        )
        if not unfinished:
            return False  # another worker settled it meanwhile
        assert checkpoint is not None  # unfinished: the row is there
        fields = ["status", "status_message", "updated_at"]
        if error:
            checkpoint.status = CheckpointStatus.VERIFIED
            checkpoint.status_message = (
                previous_message
                if previous_message is not None
                else f"The local copy is kept: deleting it failed ({error})."
            )
            event_type = "checkpoint.delete_failed"
            message = (
                f"Local copy of step {checkpoint.step} not deleted: {error}. It stays "
                "verified (some of its files may be gone; its verified replica is whole); "
                "the next retention run tries again."
            )
        else:
            checkpoint.status = CheckpointStatus.DELETED
            checkpoint.status_message = f"Local copy deleted by the retention policy ({why})."
            checkpoint.deleted_at = now
            fields.append("deleted_at")
            event_type, message = "checkpoint.deleted", checkpoint.status_message
        checkpoint.updated_at = now
        checkpoint.save(update_fields=fields)
        Event.record(
            event_type,
            checkpoint=checkpoint,
            time=now,
            actor=actor,
            message=message,
            data={
                "scope": "local",
                "location": checkpoint.location,
                **({"error": error} if error else {}),
            },
        )
    return not error


def finish_interrupted(project, actor: str, before=None) -> None:
    """Completes the deletions a killed worker left `deleting` (and rows older versions
    marked `deleted` before removing their files); with `before`, only those marked
    before then. Never raises for one checkpoint: a failure is recorded and the others
    go on."""

    stuck = Checkpoint.objects.filter(project=project, status=CheckpointStatus.DELETING)
    if before is not None:
        stuck = stuck.filter(updated_at__lt=before)
    legacy = Checkpoint.objects.filter(
        project=project, status=CheckpointStatus.DELETED, deleted_at__isnull=True
    )
    for checkpoint_id in (stuck | legacy).order_by("pk").values_list("pk", flat=True):
        carry_out(checkpoint_id, actor, "an interrupted retention run, finished", None)
