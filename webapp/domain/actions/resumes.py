"""The actions on a resume: ask for one (restart a run from a checkpoint with a launch
profile) and cancel one. Both lock a row, write one audit Event and publish their task
to the launch queue of the profile's host once the transaction commits."""

from __future__ import annotations

from django.db import transaction

from webapp.domain import publish
from webapp.domain.actions.common import ActionRefused, lock
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Event, LaunchProfile, Resume
from webapp.domain.models.recovery import ResumeStatus
from webapp.domain.recovery import resume as resumes

ENDED = (ResumeStatus.SUCCEEDED, ResumeStatus.FAILED, ResumeStatus.CANCELLED)


def resume(
    checkpoint: Checkpoint, profile: LaunchProfile, actor: str, user=None,
    world_size: int | None = None,
) -> Resume:  # fmt: skip
    """Restart the checkpoint's run with `profile` (the checkpoint is restored from a
    replica first if its local copy is unusable), on `world_size` ranks when given:
    webapp.domain.recovery.resume.request, under the checkpoint's lock. Raises
    ActionRefused with the reason."""

    with transaction.atomic():
        locked = lock(checkpoint.pk)
        try:
            return resumes.request(locked, profile, user=user, actor=actor, world_size=world_size)
        except resumes.ResumeError as exc:
            raise ActionRefused(str(exc)) from None


def cancel_resume(resume: Resume, actor: str) -> Resume:
    """Stop a resume that has not ended: the launch host of its profile stops the
    process (or Slurm job) there. Raises ActionRefused once it has ended."""

    with transaction.atomic():
        locked = for_update(Resume.objects.select_related("checkpoint", "profile"))
        locked = locked.get(pk=resume.pk)
        if locked.status in ENDED:
            raise ActionRefused(f"resume {locked.pk} has already ended: {locked.status}")
        Event.record(
            "resume.cancel_requested",
            project=locked.project_id,
            run=locked.run_id,
            step=locked.checkpoint.step,
            actor=actor,
            message=f"{actor} asked to cancel the resume from step {locked.checkpoint.step}",
            data={"resume": locked.pk},
        )
        # A profile deleted since (SET_NULL) leaves the resume on the shared launch queue.
        queue = resumes.queue_for(locked.profile) if locked.profile_id else "launch"
        publish.after_commit("workers.launch.cancel_resume", (locked.pk,), queue=queue)
    return locked
