"""Resumes (queue `launch`, or `launch.<host>` for a profile pinned to a host): see
webapp/domain/recovery/resume.py. Tasks take ids and are safe to run twice: a resume is claimed
with a conditional update, and following a finished one does nothing."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from webapp.domain.models import Event, Resume
from webapp.domain.models.recovery import ResumeStatus
from webapp.domain.recovery import reshard
from webapp.domain.recovery import resume as resumes

log = logging.getLogger(__name__)

FINAL = ("succeeded", "failed", "cancelled")


def _record(resume, type_: str, message: str) -> None:
    """One line of the run's timeline about this resume, by the launch worker."""

    Event.record(
        type_,
        checkpoint=resume.checkpoint,
        time=resume.updated_at,
        actor="worker:launch",
        message=message,
        data={"resume": resume.pk},
    )


@shared_task(name="workers.launch.launch_resume", ignore_result=True)
def launch_resume(resume_id: int) -> str:
    resume = resumes.claim(resume_id)
    if resume is None:
        return "not claimed"
    try:
        done = resumes.prepare(resume)
        _record(resume, "resume.prepared", f"Checkpoint ready for the job: {done}")
        loaded = reshard.before_launch(resume)  # ResumeError: the job is never launched
        if loaded:
            _record(resume, "resume.resharded", f"Loaded on {resume.world_size} ranks: {loaded}")
        resumes._set(resume, status=ResumeStatus.LAUNCHING)
        resumes.start(resume)
    except Exception as exc:  # noqa: BLE001 (recorded on the row, for the person who asked)
        log.exception("resume %s failed to start", resume_id)
        resumes._set(resume, status=ResumeStatus.FAILED, error=f"{exc}")
        _record(resume, "resume.failed", f"The resume could not start: {exc}")
        return "failed"
    resumes.enqueue_follow(resume, countdown=settings.LAUNCH_FOLLOW_S)
    return resume.status


@shared_task(name="workers.launch.follow_resume", ignore_result=True)
def follow_resume(resume_id: int) -> str:
    resume = Resume.objects.select_related("checkpoint", "run", "profile").get(pk=resume_id)
    if resume.status in FINAL:
        return resume.status
    if not resumes.follow_due(resume_id):
        return "followed by another task"
    if not resumes.follow(resume):
        resumes.enqueue_follow(resume, countdown=settings.LAUNCH_FOLLOW_S)
    return resume.status


@shared_task(name="workers.launch.cancel_resume", ignore_result=True)
def cancel_resume(resume_id: int) -> str:
    """On the launch host: the process (or the Slurm job) is stopped there."""

    resume = Resume.objects.select_related("profile").get(pk=resume_id)
    if resume.status in FINAL:
        return resume.status
    resumes.cancel(resume)
    return "cancelled"
