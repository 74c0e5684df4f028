"""Reads and actions on runs and checkpoints (scopes: read, operate).

Every query starts from request.auth.project: a run key or checkpoint id of another
project is simply not found."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.db import transaction
from django.shortcuts import get_object_or_404
from django.utils import timezone
from ninja import Router, Schema, Status

from webapp.api.auth import operate_auth, read_auth
from webapp.api.errors import ApiError
from webapp.domain import run_health
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
    # up / late / overdue against expected_interval_s; not_watched when the run ended or
    # has no interval (webapp/domain/run_health.py, the dashboard's rule).
    health: Literal["up", "late", "overdue", "not_watched"]
    # When it turns late (while up) or overdue (while late); null otherwise.
    next_deadline: datetime | None

    @staticmethod
    def resolve_resumed_from(run: Run) -> int | None:
        return run.resumed_from_id

    @staticmethod
    def resolve_health(run: Run) -> str:
        return run_health.of(run).api_state

    @staticmethod
    def resolve_next_deadline(run: Run) -> datetime | None:
        return run_health.of(run).next_deadline


class FileOut(Schema):
    path: str
    size: int
    sha256: str


class ReplicaFileOut(Schema):
    path: str
    size: int
    sha256: str
    url: str


class ReplicaOut(Schema):
    """A copy on a storage target. Its credentials are never part of it. A verified
    replica lists its files with presigned GET URLs (REPLICATION_URL_EXPIRES_S, 1 h), so
    a client can fetch them with a plain HTTP client and check each sha256."""

    id: int
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
    progress: dict[str, Any]
    files: list[ReplicaFileOut] | None

    @staticmethod
    def resolve_progress(replica) -> dict:
        return replica.progress()

    @staticmethod
    def resolve_files(replica):
        from webapp.domain.replication.restore import replica_files

        if replica.status != ReplicaStatus.VERIFIED:
            return None
        return replica_files(replica)

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


@router.get("/runs", auth=read_auth, response={200: RunPage, 400: ErrorOut})
def list_runs(
    request, status: str | None = None, health: str | None = None, limit: int = 100, offset: int = 0
):
    """Runs of the project, most recently active first; filter by status or health."""
    limit = max(1, min(limit, 1000))
    runs = Run.objects.filter(project=request.auth.project).with_health()
    if status:
        runs = runs.filter(status=status)
    if health:
        if health not in run_health.API_STATES:
            raise ApiError(400, f"health must be one of {', '.join(run_health.API_STATES)}")
        runs = runs.filter(run_health.api_filter(health))
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


@router.get(
    "/runs/{path:key}/analytics", auth=read_auth, response={200: dict[str, Any], 404: ErrorOut}
)
def run_analytics(request, key: str, mtbf_hours: float | None = None):
    """What checkpointing costs this run, and the Young and Daly intervals for its
    checkpoint time and the project's mean time between failures (docs/analytics.md)."""
    from webapp.domain import analytics

    if mtbf_hours is not None and mtbf_hours <= 0:
        raise ApiError(400, "mtbf_hours must be > 0")
    mtbf = mtbf_hours * 3600 if mtbf_hours is not None else None
    return analytics.for_run(_run(request, key), mtbf_seconds=mtbf).as_dict()


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


class RestoreTestOut(Schema):
    checkpoint: int
    validation: int
    status: str
    message: str


@router.post(
    "/checkpoints/{int:checkpoint_id}/restore-test",
    auth=operate_auth,
    response={202: RestoreTestOut, 404: ErrorOut, 409: ErrorOut},
)
def restore_test(request, checkpoint_id: int):
    """Prove the checkpoint comes back: download it from a verified replica, verify every
    file, load it (on a GPU when a GPU worker listens), and time each phase."""
    from webapp.domain import restore_test as rt

    with transaction.atomic():
        checkpoint = _checkpoint(request, checkpoint_id)
        if not checkpoint.replicas.filter(status=ReplicaStatus.VERIFIED).exists():
            raise ApiError(
                409,
                f"checkpoint {checkpoint_id} has no verified replica to restore from; "
                "replicate it first",
            )
        validation = rt.request(checkpoint, requested_by=request.auth.actor)
    return Status(
        202,
        {
            "checkpoint": checkpoint_id,
            "validation": validation.pk,
            "status": validation.status,
            "message": "restore test queued",
        },
    )


class ResumeIn(Schema):
    profile: str


class ResumeOut(Schema):
    id: int
    run: str
    checkpoint: int
    profile: str | None
    status: str
    command: str
    external_id: str
    error: str
    new_run: str | None
    automatic: bool
    created_at: datetime
    updated_at: datetime
    output: str

    @staticmethod
    def resolve_run(resume) -> str:
        return resume.run.key

    @staticmethod
    def resolve_checkpoint(resume) -> int:
        return resume.checkpoint_id

    @staticmethod
    def resolve_profile(resume) -> str | None:
        return resume.profile.name if resume.profile_id else None

    @staticmethod
    def resolve_new_run(resume) -> str | None:
        return resume.new_run.key if resume.new_run_id else None

    @staticmethod
    def resolve_output(resume, context) -> str:
        from webapp.domain.resume import output_tail  # redacted, operate-scope tokens only

        auth = getattr((context or {}).get("request"), "auth", None)
        return output_tail(resume) if auth is not None and auth.allows("operate") else ""


@router.post(
    "/checkpoints/{int:checkpoint_id}/resume",
    auth=operate_auth,
    response={202: ResumeOut, 400: ErrorOut, 404: ErrorOut, 409: ErrorOut},
)
def resume_from(request, checkpoint_id: int, body: ResumeIn):
    """Restart the run from this checkpoint with one of the project's launch profiles:
    the checkpoint is restored from a replica first if its local copy is unusable."""
    from webapp.domain import resume as resumes
    from webapp.domain.models import LaunchProfile

    with transaction.atomic():
        checkpoint = _checkpoint(request, checkpoint_id)
        profile = LaunchProfile.objects.filter(
            project=request.auth.project, name=body.profile
        ).first()
        if profile is None:
            raise ApiError(404, f"no launch profile {body.profile!r} in this project")
        try:
            resume = resumes.request(checkpoint, profile, actor=request.auth.actor)
        except resumes.ResumeError as exc:
            raise ApiError(409, str(exc)) from None
    return Status(202, resume)


def _resume(request, resume_id: int):
    from webapp.domain.models import Resume

    return get_object_or_404(
        Resume.objects.select_related("run", "profile", "new_run"),
        project=request.auth.project,
        pk=resume_id,
    )


@router.get("/resumes/{int:resume_id}", auth=read_auth, response={200: ResumeOut, 404: ErrorOut})
def get_resume(request, resume_id: int):
    return _resume(request, resume_id)


@router.post(
    "/resumes/{int:resume_id}/cancel",
    auth=operate_auth,
    response={200: ResumeOut, 404: ErrorOut, 409: ErrorOut},
)
def cancel_resume(request, resume_id: int):
    from webapp.domain import resume as resumes

    resume = _resume(request, resume_id)
    if resume.status in ("succeeded", "failed", "cancelled"):
        raise ApiError(409, f"resume {resume_id} has already ended: {resume.status}")
    from workers.launch import cancel_resume as cancel_task

    # The launch host stops it: the process (or Slurm's client) lives there.
    cancel_task.apply_async((resume.pk,), queue=resumes.queue_for(resume.profile))
    return resume


class ReplicateIn(Schema):
    target: str | None = None


class ReplicateOut(ActionOut):
    replicas: list[int]


@router.post(
    "/checkpoints/{int:checkpoint_id}/replicate",
    auth=operate_auth,
    response={202: ReplicateOut, 404: ErrorOut, 409: ErrorOut},
)
def replicate(request, checkpoint_id: int, body: ReplicateIn | None = None):
    """Copy the checkpoint to every enabled storage target of the project (or the one
    named), whatever their policies say. A failed copy is tried again from scratch; a
    verified copy of the same files is left alone."""
    from webapp.domain.replication.policy import request as request_replicas

    with transaction.atomic():
        checkpoint = get_object_or_404(
            Checkpoint.objects.select_for_update().select_related("project", "run"),
            project=request.auth.project,
            pk=checkpoint_id,
        )
        if checkpoint.status != CheckpointStatus.VERIFIED:
            raise ApiError(
                409,
                f"checkpoint {checkpoint_id} is {checkpoint.status}; only verified "
                "checkpoints are copied",
            )
        targets = checkpoint.project.storage_targets.filter(enabled=True).order_by("pk")
        if body is not None and body.target:
            targets = targets.filter(name=body.target)
        if not targets:
            raise ApiError(404, "no enabled storage target of that name in this project")
        queued = request_replicas(checkpoint, list(targets), by_policy=False)
        if queued:
            Event.objects.create(
                project=checkpoint.project,
                run=checkpoint.run,
                type="checkpoint.replication_requested",
                step=checkpoint.step,
                time=timezone.now(),
                actor=request.auth.actor,
                data={"replicas": queued},
            )
    return Status(
        202,
        {
            "checkpoint": checkpoint.pk,
            "status": checkpoint.status,
            "message": f"{len(queued)} replica(s) queued" if queued else "already replicated",
            "replicas": queued,
        },
    )


class RetentionDecisionOut(Schema):
    scope: str
    run: str
    step: int
    checkpoint_id: int
    delete: bool
    reasons: list[str]
    replica_id: int | None
    target: str | None


class RetentionPlanOut(Schema):
    local: list[RetentionDecisionOut]
    replicas: list[RetentionDecisionOut]


@router.get("/retention", auth=read_auth, response={200: RetentionPlanOut, 404: ErrorOut})
def retention_plan(request, run: str | None = None):
    """The dry run of the project's retention policies: every checkpoint (local copies)
    and replica, whether it would be deleted, and why."""
    from webapp.domain import retention

    run_row = _run(request, run) if run else None
    project = request.auth.project
    return {
        "local": [d.as_dict() for d in retention.plan(project, "local", run_row)],
        "replicas": [d.as_dict() for d in retention.plan(project, "replicas", run_row)],
    }


class QueuedOut(Schema):
    message: str


@router.post("/retention/apply", auth=operate_auth, response={202: QueuedOut})
def retention_apply(request):
    """Carry the policies out, on a worker that sees the checkpoint files (the validate
    queue); each deletion is recorded in the event log."""
    from workers.retention import apply_project

    project = request.auth.project
    Event.objects.create(
        project=project,
        type="retention.requested",
        time=timezone.now(),
        actor=request.auth.actor,
    )
    transaction.on_commit(lambda: apply_project.delay(project.pk))
    return Status(202, {"message": "queued"})
