"""Actions on a checkpoint (scope operate): validate, pin, restore-test, replicate.

Each calls the domain function the dashboard calls (Checkpoint.request_validation,
Checkpoint.set_pinned, webapp/domain/checkpoint_requests.py), so both audiences take the
same lock, write the same audit Event and coalesce a repeat into the request already
queued: the answer is then 202 with that request's validation id and "coalesced": true.
A checkpoint of another project is simply not found."""

from __future__ import annotations

from ninja import Router, Schema, Status

from webapp.api.auth import operate_auth
from webapp.api.errors import ApiError, ErrorOut
from webapp.api.lookups import checkpoint_in_project as _checkpoint
from webapp.api.params import BodyIn, CheckpointId, Name
from webapp.domain.models.checkpoints import CheckpointActionRefused

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
        requested = checkpoint.request_validation(request.auth.actor)
    except CheckpointActionRefused as exc:
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
    from webapp.domain.checkpoint_requests import request_restore_test

    _checkpoint(request, checkpoint_id)
    try:
        requested = request_restore_test(checkpoint_id, request.auth.actor)
    except CheckpointActionRefused as exc:
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
    checkpoint.set_pinned(pinned, request.auth.actor)
    return Status(
        200,
        {
            "checkpoint": checkpoint.pk,
            "status": checkpoint.status,
            "message": "pinned" if pinned else "unpinned",
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
    from webapp.domain.checkpoint_requests import NoSuchTarget, request_replication

    checkpoint = _checkpoint(request, checkpoint_id)
    try:
        queued = request_replication(
            checkpoint_id, request.auth.actor, body.target if body is not None else None
        )
    except NoSuchTarget as exc:
        raise ApiError(404, str(exc)) from None
    except CheckpointActionRefused as exc:
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
