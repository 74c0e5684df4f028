"""Restore tests and resumes owed and nobody doing them (the sweeper:
webapp/domain/repair.py).

* A restore test queued before owed_work.lost_before() (its message was lost), or running
  past the longest a test may take (its worker died): sent again; restore_test.claim
  takes a running one over only once that time has passed.
* A resume `requested` and never launched (its message was lost): sent again;
  resume.claim takes it once.
* Neither while a worker took its message within SWEEP_LOST_AFTER_S and has not
  finished it (owed_work.taken_ids).
* A resume whose job runs (or was submitted to Slurm) and that nobody has looked at for
  several follow intervals (the follow task's message was lost): a follow task again,
  which ends any second chain of itself (resume.follow_due).
* A resume `restoring` or `launching` with nothing started and no sign of life for
  SWEEP_STUCK_S: its worker died while preparing. Failed, with the reason, since only
  the person who asked knows whether to ask again.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q

from webapp.domain import owed_work
from webapp.domain.launch import job_token
from webapp.domain.models import Event, Resume, Validation
from webapp.domain.models.recovery import ResumeStatus, ValidationKind, ValidationStatus
from webapp.domain.recovery import restore_test
from webapp.domain.recovery import resume as resumes


def resend_restore_tests(now, limit: int) -> list[owed_work.Owed]:
    lost = owed_work.lost_before(now, ["restore", "gpu"])
    in_hand = owed_work.taken_ids(now, ["restore", "gpu"], {restore_test.TASK: False})
    dead = now - timedelta(seconds=settings.VALIDATION_TIMEOUT_S + 600)
    rows = (
        Validation.objects.filter(kind=ValidationKind.RESTORE)
        .filter(
            Q(status=ValidationStatus.QUEUED, created_at__lt=lost)
            | Q(status=ValidationStatus.RUNNING, started_at__lt=dead)
        )
        .exclude(pk__in=in_hand)
        .order_by("pk")
        .values_list("pk", "status", "checkpoint_id", "checkpoint__project_id",
                     "checkpoint__run_id", "checkpoint__step")[:limit]
    )  # fmt: skip
    owed = []
    for pk, status, checkpoint, project, run, step in rows:
        restore_test.enqueue(pk)
        why = "its message was lost" if status == ValidationStatus.QUEUED else "its worker stopped"
        owed.append(
            owed_work.Owed(
                "restore",
                project,
                f"the restore test of step {step}: {why}; sent again",
                run_id=run,
                checkpoint_id=checkpoint,
            )
        )
    return owed


def follow_lapsed_before(now):
    return now - timedelta(seconds=max(5 * settings.LAUNCH_FOLLOW_S, 60))


def resend_resumes(now, limit: int) -> list[owed_work.Owed]:
    owed = []
    requested = Resume.objects.filter(status=ResumeStatus.REQUESTED).select_related("profile")
    in_hand: dict[str, set[int]] = {}  # by queue
    for resume in requested.order_by("pk")[:limit]:
        queue = resumes.queue_for(resume.profile) if resume.profile else "launch"
        if resume.created_at >= owed_work.lost_before(now, queue):
            continue
        if queue not in in_hand:
            in_hand[queue] = owed_work.taken_ids(now, queue, {resumes.LAUNCH: False})
        if resume.pk in in_hand[queue]:
            continue
        resumes.enqueue_launch(resume.pk, queue)
        owed.append(_owed(resume, "was never launched (its message was lost): sent again"))

    unfollowed = (
        Resume.objects.filter(
            Q(status=ResumeStatus.RUNNING) | Q(status=ResumeStatus.LAUNCHING) & ~Q(external_id="")
        )
        .filter(
            Q(followed_at__lt=follow_lapsed_before(now))
            | Q(followed_at__isnull=True, updated_at__lt=follow_lapsed_before(now))
        )
        .select_related("profile")
    )
    for resume in unfollowed.order_by("pk")[:limit]:
        resumes.enqueue_follow(resume)
        owed.append(_owed(resume, "was not being followed to its end: followed again"))

    stuck = Resume.objects.filter(
        Q(status=ResumeStatus.RESTORING) | Q(status=ResumeStatus.LAUNCHING, external_id=""),
        updated_at__lt=owed_work.stuck_before(now),
    ).select_related("checkpoint")
    for resume in stuck.order_by("pk")[:limit]:
        was = resume.status
        reason = (
            f"the launch worker stopped while the resume was {was} (nothing was seen to start "
            f"for {settings.SWEEP_STUCK_S // 60} minutes); ask for it again"
        )
        if Resume.objects.filter(pk=resume.pk, status=was).update(
            status=ResumeStatus.FAILED, error=reason, updated_at=now
        ):
            resume.status = ResumeStatus.FAILED
            job_token.revoke(resume)
            Event.record(
                "resume.failed", checkpoint=resume.checkpoint, actor="system:sweeper",
                message=f"Resume {resume.pk} failed: {reason}.", data={"resume": resume.pk},
            )  # fmt: skip
            owed.append(_owed(resume, f"was stuck while {was}: recorded as failed"))
    return owed


def _owed(resume, what: str) -> owed_work.Owed:
    return owed_work.Owed(
        "launch",
        resume.project_id,
        f"resume {resume.pk} {what}",
        run_id=resume.run_id,
        checkpoint_id=resume.checkpoint_id,
    )
