"""What every action shares: the checkpoint's row lock, the coalescing rule and the
answers.

A repeat of a request that is still queued or running is coalesced into it: the answer
names the request already there, and nothing new is stored or published, so pressing a
button (or looping over the API) a thousand times queues one piece of work.

A request that has been queued or running for longer than any check may take
(VALIDATION_TIMEOUT_S plus ten minutes: restore_test.claim's lease) is presumed lost (a
message the broker dropped, a worker that died): a new request publishes its task again,
with an audit line, instead of being coalesced into it forever."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Validation
from webapp.domain.models.checkpoints import CheckpointActionRefused
from webapp.domain.models.recovery import ValidationStatus

# What an action raises when it cannot apply (the API answers 409, the page says why).
ActionRefused = CheckpointActionRefused


class NoSuchTarget(ActionRefused):
    """No enabled storage target (of the name asked for) in the project."""


@dataclass(frozen=True)
class Requested:
    """The request's Validation, and whether it was already there (coalesced): then
    nothing was stored, audited or published by this call."""

    validation: Validation
    coalesced: bool


def lost_after() -> timedelta:
    return timedelta(seconds=settings.VALIDATION_TIMEOUT_S + 600)


def pending(checkpoint: Checkpoint, kind: str, now=None) -> tuple[Validation | None, bool]:
    """The newest queued or running Validation of `kind`, and whether it is alive (not
    presumed lost: see the module's docstring). Call with the checkpoint locked."""
    row = (
        checkpoint.validations.filter(
            kind=kind, status__in=(ValidationStatus.QUEUED, ValidationStatus.RUNNING)
        )
        .order_by("-created_at")
        .first()
    )
    if row is None:
        return None, False
    since = row.started_at if row.status == ValidationStatus.RUNNING else row.created_at
    return row, (since or row.created_at) >= (now or timezone.now()) - lost_after()


def lock(checkpoint_id: int, project=None) -> Checkpoint:
    """The checkpoint, locked until the caller's transaction ends; DoesNotExist if it is
    not there (or not in `project`). Only its row: its run and project are read, not
    locked, so an action never holds a run's lock that ingest takes (in its own order)."""
    rows = for_update(Checkpoint.objects.select_related("project", "run"))
    if project is not None:
        rows = rows.filter(project=project)
    return rows.get(pk=checkpoint_id)
