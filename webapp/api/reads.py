"""Reads and actions on runs and checkpoints (scopes: read, operate).

Every query starts from request.auth.project: a run key or checkpoint id of another
project is simply not found."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.shortcuts import get_object_or_404
from django.utils import timezone
from ninja import Router, Schema, Status

from webapp.api.auth import operate_auth, read_auth
from webapp.api.errors import ApiError
from webapp.domain.models import Checkpoint, Event, Run
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus

router = Router(tags=["runs and checkpoints"])


class RunOut(Schema):
    key: str
    name: str
    status: str
    host: str
    framework: str
    world_size: int | None
    config: dict[str, Any]
    tags: list[str]
    expected_interval_s: float | None
    resumed_from: int | None
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    error: str
    last_seen_at: datetime | None
    last_heartbeat_at: datetime | None
    last_step: int | None
    last_metrics: dict[str, Any]

    @staticmethod
    def resolve_resumed_from(run: Run) -> int | None:
        return run.resumed_from_id


class FileOut(Schema):
    path: str
    size: int
    sha256: str


class ReplicaOut(Schema):
    target: str
    bucket: str
    prefix: str
    endpoint_url: str
    status: str
    bytes_total: int
    bytes_done: int
    attempts: int
    last_error: str
    manifest_key: str
    verified_at: datetime | None

    @staticmethod
    def resolve_target(replica) -> str:
        return replica.target.name

    @staticmethod
    def resolve_bucket(replica) -> str:
        return replica.target.bucket

    @staticmethod
    def resolve_prefix(replica) -> str:
        return replica.target.prefix

    @staticmethod
    def resolve_endpoint_url(replica) -> str:
        return replica.target.endpoint_url


class ValidationOut(Schema):
    id: int
    kind: str
    status: str
    device: str
    message: str
    findings: list[Any]
    timings: dict[str, Any]
    progress: dict[str, Any]
    requested_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @staticmethod
    def resolve_progress(validation) -> dict:
        return validation.progress()


class CheckpointOut(Schema):
    id: int
    run: str
    step: int
    epoch: int | None
    saved_at: datetime | None
    location: str
    format: str
    total_size: int
    file_count: int
    save_seconds: float | None
    metrics: dict[str, Any]
    status: str
    status_message: str
    pinned: bool
    verified_at: datetime | None

    @staticmethod
    def resolve_run(checkpoint: Checkpoint) -> str:
        return checkpoint.run.key


class CheckpointDetailOut(CheckpointOut):
    content: dict[str, Any]
    files: list[FileOut]
    replicas: list[ReplicaOut]
    validations: list[ValidationOut]

    @staticmethod
    def resolve_files(checkpoint: Checkpoint):
        return list(checkpoint.files.order_by("path"))

    @staticmethod
    def resolve_replicas(checkpoint: Checkpoint):
        return list(checkpoint.replicas.select_related("target").exclude(status="deleted"))

    @staticmethod
    def resolve_validations(checkpoint: Checkpoint):
        return list(checkpoint.validations.order_by("-created_at")[:20])


class LatestOut(CheckpointDetailOut):
    """The newest verified checkpoint and its verified replicas: what a restarting job
    asks for."""

    @staticmethod
    def resolve_replicas(checkpoint: Checkpoint):
        return list(
            checkpoint.replicas.select_related("target").filter(status=ReplicaStatus.VERIFIED)
        )


class RunPage(Schema):
    runs: list[RunOut]
    next_offset: int | None


class CheckpointPage(Schema):
    checkpoints: list[CheckpointOut]
    next_before_step: int | None


class ErrorOut(Schema):
    error: str


def _run(request, key: str) -> Run:
    run = Run.objects.filter(project=request.auth.project, key=key).first()
    if run is None:
        raise ApiError(404, f"no run {key!r} in this project")
    return run


def _checkpoint(request, checkpoint_id: int) -> Checkpoint:
    checkpoint = (
        Checkpoint.objects.select_related("run")
        .filter(project=request.auth.project, pk=checkpoint_id)
        .first()
    )
    if checkpoint is None:
        raise ApiError(404, f"no checkpoint {checkpoint_id} in this project")
    return checkpoint


@router.get("/runs", auth=read_auth, response={200: RunPage})
def list_runs(request, status: str | None = None, limit: int = 100, offset: int = 0):
    """Runs of the project, most recently active first."""
    limit = max(1, min(limit, 1000))
    runs = Run.objects.filter(project=request.auth.project)
    if status:
        runs = runs.filter(status=status)
    page = list(runs.order_by("-last_seen_at", "-id")[offset : offset + limit + 1])
    more = len(page) > limit
    return {"runs": page[:limit], "next_offset": offset + limit if more else None}


# Routes with a suffix come before the bare run route: run keys may contain "/".
@router.get(
    "/runs/{path:key}/checkpoints", auth=read_auth, response={200: CheckpointPage, 404: ErrorOut}
)
def list_checkpoints(
    request, key: str, status: str | None = None, limit: int = 100, before_step: int | None = None
):
    """Checkpoints of a run, newest step first; filter by status, page with before_step."""
    run = _run(request, key)
    limit = max(1, min(limit, 1000))
    checkpoints = run.checkpoints.select_related("run")
    if status:
        if status not in CheckpointStatus.values:
            raise ApiError(400, f"status must be one of {', '.join(CheckpointStatus.values)}")
        checkpoints = checkpoints.filter(status=status)
    if before_step is not None:
        checkpoints = checkpoints.filter(step__lt=before_step)
    page = list(checkpoints.order_by("-step")[: limit + 1])
    more = len(page) > limit
    return {
        "checkpoints": page[:limit],
        "next_before_step": page[limit - 1].step if more else None,
    }


@router.get("/runs/{path:key}/latest", auth=read_auth, response={200: LatestOut, 404: ErrorOut})
def latest_checkpoint(request, key: str):
    """The newest verified checkpoint of a run, with its verified replicas."""
    run = _run(request, key)
    checkpoint = run.latest_verified_checkpoint()
    if checkpoint is None:
        raise ApiError(404, f"run {key!r} has no verified checkpoint yet")
    return checkpoint


@router.get("/runs/{path:key}", auth=read_auth, response={200: RunOut, 404: ErrorOut})
def get_run(request, key: str):
    return _run(request, key)


@router.get(
    "/checkpoints/{int:checkpoint_id}",
    auth=read_auth,
    response={200: CheckpointDetailOut, 404: ErrorOut},
)
def get_checkpoint(request, checkpoint_id: int):
    return _checkpoint(request, checkpoint_id)


class ActionOut(Schema):
    checkpoint: int
    status: str
    message: str


@router.post(
    "/checkpoints/{int:checkpoint_id}/validate",
    auth=operate_auth,
    response={202: ActionOut, 404: ErrorOut, 409: ErrorOut},
)
def validate(request, checkpoint_id: int):
    """Check the checkpoint again (bits rot). Its status stays as it is until the new
    check has a verdict; the Validation row shows progress meanwhile."""
    from workers.validate import validate_checkpoint

    with transaction.atomic():
        checkpoint = get_object_or_404(
            Checkpoint.objects.select_for_update(),
            project=request.auth.project,
            pk=checkpoint_id,
        )
        if checkpoint.status in (CheckpointStatus.SAVING, CheckpointStatus.FAILED):
            raise ApiError(409, f"checkpoint {checkpoint_id} was never saved; nothing to check")
        if checkpoint.status == CheckpointStatus.DELETED:
            raise ApiError(409, f"checkpoint {checkpoint_id} is deleted")
        Event.objects.create(
            project=checkpoint.project,
            run=checkpoint.run,
            type="checkpoint.validation_requested",
            step=checkpoint.step,
            time=timezone.now(),
            actor=request.auth.actor,
        )
        actor = request.auth.actor
        transaction.on_commit(
            lambda: validate_checkpoint.apply_async(
                (checkpoint.pk,), {"requested_by": actor, "revalidate": True}
            )
        )
    return Status(
        202, {"checkpoint": checkpoint.pk, "status": checkpoint.status, "message": "queued"}
    )


class PinIn(Schema):
    pinned: bool = True


@router.post(
    "/checkpoints/{int:checkpoint_id}/pin",
    auth=operate_auth,
    response={200: ActionOut, 404: ErrorOut},
)
def pin(request, checkpoint_id: int, body: PinIn | None = None):
    """Pin (or, with {"pinned": false}, unpin) a checkpoint: pinned checkpoints are never
    deleted by a retention policy."""
    pinned = True if body is None else body.pinned
    with transaction.atomic():
        checkpoint = get_object_or_404(
            Checkpoint.objects.select_for_update(),
            project=request.auth.project,
            pk=checkpoint_id,
        )
        if checkpoint.pinned != pinned:
            checkpoint.pinned = pinned
            checkpoint.save(update_fields=["pinned"])
            Event.objects.create(
                project=checkpoint.project,
                run_id=checkpoint.run_id,
                type="checkpoint.pinned" if pinned else "checkpoint.unpinned",
                step=checkpoint.step,
                time=timezone.now(),
                actor=request.auth.actor,
            )
    return Status(
        200,
        {
            "checkpoint": checkpoint.pk,
            "status": checkpoint.status,
            "message": "pinned" if pinned else "unpinned",
        },
    )
