"""Every action of the API (scope operate): validate, pin, restore-test, replicate,
resume, cancel a resume, apply retention.

Each view is a thin caller of the function the dashboard calls (webapp.domain.actions),
so both audiences take the same lock, write the same audit Event and coalesce a repeat
into the request already queued: the answer is then 202 with that request's validation
id and "coalesced": true. A checkpoint of another project is simply not found."""

from __future__ import annotations

from typing import Annotated

from ninja import Router, Schema, Status
from pydantic import Field, WithJsonSchema

from webapp.api.auth import operate_auth
from webapp.api.errors import ApiError, ErrorOut
from webapp.api.lookups import checkpoint_in_project as _checkpoint
from webapp.api.lookups import resume_in_project
from webapp.api.params import BodyIn, CheckpointId, Name, ResumeId
from webapp.api.reads import ResumeOut
from webapp.domain import actions
from webapp.domain.actions import ActionRefused
from webapp.domain.ingest.event_schema import Integer
from webapp.domain.models import LaunchProfile

router = Router(tags=["runs and checkpoints"])


class RequestedOut(Schema):
    """A queued (or coalesced) check or restore test: GET /checkpoints/<id> shows its
    progress and verdict among the checkpoint's validations."""

    checkpoint: int
    validation: int
    status: str
    coalesced: bool
    message: str


def _requested(checkpoint_id: int, requested, what: str) -> Status:
    validation = requested.validation
    if requested.coalesced:
        message = f"{what} {validation.pk} is already {validation.status}; not queued again"
    else:
        message = f"{what} {validation.pk} queued"
    return Status(
        202,
        {
            "checkpoint": checkpoint_id,
            "validation": validation.pk,
            "status": validation.status,
            "coalesced": requested.coalesced,
            "message": message,
        },
    )


@router.post(
    "/checkpoints/{checkpoint_id}/validate",
    auth=operate_auth,
    response={202: RequestedOut, 404: ErrorOut, 409: ErrorOut},
)
def validate(request, checkpoint_id: CheckpointId):
    """Check the checkpoint again (bits rot). Its status stays as it is until the new
    check has a verdict; the Validation row shows progress meanwhile. A check already
    queued or running is named instead of a second one ("coalesced": true)."""
    checkpoint = _checkpoint(request, checkpoint_id)
    try:
        requested = actions.validate(checkpoint, request.auth.actor)
    except ActionRefused as exc:
        raise ApiError(409, f"checkpoint {checkpoint_id}: {exc}; nothing to check") from None
    return _requested(checkpoint_id, requested, "check")


@router.post(
    "/checkpoints/{checkpoint_id}/restore-test",
    auth=operate_auth,
    response={202: RequestedOut, 404: ErrorOut, 409: ErrorOut},
)
def restore_test(request, checkpoint_id: CheckpointId):
    """Prove the checkpoint comes back: download it from a verified replica, verify every
    file, load it (on a GPU when a GPU worker listens), and time each phase. A restore
    test already queued or running is named instead of a second one."""
    checkpoint = _checkpoint(request, checkpoint_id)
    try:
        requested = actions.restore_test(checkpoint, request.auth.actor)
    except ActionRefused as exc:
        raise ApiError(409, f"checkpoint {checkpoint_id}: {exc}") from None
    return _requested(checkpoint_id, requested, "restore test")


class ActionOut(Schema):
    checkpoint: int
    status: str
    message: str


class PinIn(BodyIn):
    pinned: bool = True


@router.post(
    "/checkpoints/{checkpoint_id}/pin",
    auth=operate_auth,
    response={200: ActionOut, 404: ErrorOut},
)
def pin(request, checkpoint_id: CheckpointId, body: PinIn | None = None):
    """Pin (or, with {"pinned": false}, unpin) a checkpoint: pinned checkpoints are never
    deleted by a retention policy."""
    pinned = True if body is None else body.pinned
    checkpoint = _checkpoint(request, checkpoint_id)
    actions.pin(checkpoint, request.auth.actor, pinned)
    return Status(
        200,
        {
            "checkpoint": checkpoint.pk,
            "status": checkpoint.status,
            "message": "pinned" if pinned else "unpinned",
        },
    )


@router.post(
    "/checkpoints/{checkpoint_id}/release",
    auth=operate_auth,
    response={200: ActionOut, 404: ErrorOut},
)
def release(request, checkpoint_id: CheckpointId):
    """Take a checkpoint out of quarantine: resumes and `latest` may take it again. The
    release is audited with the reason it was quarantined."""
    checkpoint = _checkpoint(request, checkpoint_id)
    released = actions.release(checkpoint, request.auth.actor)
    return Status(
        200,
        {
            "checkpoint": checkpoint.pk,
            "status": checkpoint.status,
            "message": "released from quarantine" if released else "was not quarantined",
        },
    )


class ReplicateIn(BodyIn):
    target: Name | None = None


class ReplicateOut(ActionOut):
    replicas: list[int]


@router.post(
    "/checkpoints/{checkpoint_id}/replicate",
    auth=operate_auth,
    response={202: ReplicateOut, 404: ErrorOut, 409: ErrorOut},
)
def replicate(request, checkpoint_id: CheckpointId, body: ReplicateIn | None = None):
    """Copy the checkpoint to every enabled storage target of the project (or the one
    named), whatever their policies say. A failed copy is tried again from scratch; a
    verified copy of the same files, or one on its way, is left alone."""
    checkpoint = _checkpoint(request, checkpoint_id)
    try:
        queued = actions.replicate(
            checkpoint, request.auth.actor, body.target if body is not None else None
        )
    except actions.NoSuchTarget as exc:
        raise ApiError(404, str(exc)) from None
    except ActionRefused as exc:
        raise ApiError(409, f"checkpoint {checkpoint_id}: {exc}") from None
    return Status(
        202,
        {
            "checkpoint": checkpoint.pk,
            "status": checkpoint.status,
            "message": f"{len(queued)} replica(s) queued" if queued else "already replicated",
            "replicas": queued,
        },
    )


# A whole number, 5 or 5.0 (JSON does not tell them apart), never true or "5"; the schema
# says so itself: the validator in front of the bounds would hide them from it.
WorldSize = Annotated[
    Integer,
    Field(ge=1, le=100_000),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 100_000}),
]


class ResumeIn(BodyIn):
    profile: Name
    # Launch on this many ranks ({{world_size}} in the profile's command); a DCP
    # checkpoint is first loaded on it when it is not the world size that saved it.
    world_size: WorldSize | None = None


@router.post(
    "/checkpoints/{checkpoint_id}/resume",
    auth=operate_auth,
    response={202: ResumeOut, 400: ErrorOut, 404: ErrorOut, 409: ErrorOut},
)
def resume_from(request, checkpoint_id: CheckpointId, body: ResumeIn):
    """Restart the run from this checkpoint with one of the project's launch profiles:
    the checkpoint is restored from a replica first if its local copy is unusable."""

    checkpoint = _checkpoint(request, checkpoint_id)
    profile = LaunchProfile.objects.filter(project=request.auth.project, name=body.profile).first()
    if profile is None:
        raise ApiError(404, f"no launch profile {body.profile!r} in this project")
    try:
        resume = actions.resume(checkpoint, profile, request.auth.actor, world_size=body.world_size)
    except ActionRefused as exc:
        raise ApiError(409, str(exc)) from None
    return Status(202, resume)


@router.post(
    "/resumes/{resume_id}/cancel",
    auth=operate_auth,
    response={200: ResumeOut, 404: ErrorOut, 409: ErrorOut},
)
def cancel_resume(request, resume_id: ResumeId):
    """Stop a resume that has not ended (on the launch host of its profile)."""
    try:
        actions.cancel_resume(resume_in_project(request, resume_id), request.auth.actor)
    except ActionRefused as exc:
        raise ApiError(409, str(exc)) from None
    return resume_in_project(request, resume_id)


class QueuedOut(Schema):
    message: str


@router.post("/retention/apply", auth=operate_auth, response={202: QueuedOut})
def retention_apply(request):
    """Carry the policies out, on a worker that sees the checkpoint files (the validate
    queue); each deletion is recorded in the event log."""
    actions.apply_retention(request.auth.project, request.auth.actor)
    return Status(202, {"message": "queued"})
