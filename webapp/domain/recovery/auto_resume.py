"""Automatic resume: a failed or silent run resumed from the newest checkpoint its
lineage can start from, within the project's bounds (webapp/domain/launch/auto_limits.py).
The resume itself is resume.request's, as for a person."""

from __future__ import annotations

from django.db import transaction

from webapp.domain.health import flips
from webapp.domain.launch import auto_limits
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Event, Project, Resume
from webapp.domain.recovery import quarantine
from webapp.domain.recovery import resume as resumes


def lineage(run) -> list:
    """The run and the runs it was resumed from, newest first."""
    chain, seen = [], set()
    while run is not None and run.pk not in seen:
        chain.append(run)
        seen.add(run.pk)
        checkpoint = run.resumed_from
        run = checkpoint.run if checkpoint is not None else None
    return chain


def latest_resumable(chain) -> Checkpoint | None:
    """The newest checkpoint a resume can start from along the lineage (newest run
    first): a resumed job that died before its first checkpoint restarts from its
    parent's."""
    return next(
        (c for c in (r.latest_resumable_checkpoint() for r in chain) if c is not None), None
    )


def maybe_auto_resume(run, reason: str):
    """If the project asks for it, resume a failed or silent run from its latest verified
    checkpoint, at most project.max_restarts times along its lineage (Determined's
    max_restarts) and within the project's bounds (webapp/domain/launch/auto_limits.py).
    Returns the Resume, or None with nothing done and a resume.skipped event saying why."""

    project = run.project
    profile = project.auto_resume_profile
    if profile is None:
        return None
    chain = lineage(run)
    if loop := quarantine.restart_loop(chain, project):
        _stop_loop(run, chain, loop)
        return None
    preempted = reason == "preempted"
    used = Resume.objects.filter(run__in=chain, automatic=True, after_preemption=False).count()
    checkpoint = latest_resumable(chain)
    spent = used >= project.max_restarts and not preempted
    if checkpoint is None or spent:
        why: str | None = (
            f"it was resumed automatically {used} times already (max {project.max_restarts})"
            if spent
            else "no verified checkpoint to resume from"
        )
        Event.record(
            "resume.skipped", run=run, actor="system",
            message=f"Not resuming {run.key} automatically: {why}.",
        )  # fmt: skip
        return None
    with transaction.atomic():
        # One project row lock: two runs failing at once are counted one after the other.
        for_update(Project.objects.filter(pk=project.pk)).first()
        why = auto_limits.refusal(project)
        if why is None:
            try:
                resume = resumes.request(checkpoint, profile, actor="system", automatic=True)
            except resumes.ResumeError as exc:
                why = str(exc)
        if why is not None:
            Event.record(
                "resume.skipped", run=run, actor="system",
                message=f"Not resuming {run.key} automatically: {why}.",
            )  # fmt: skip
            return None
        count = (
            "after a preemption, not counted"
            if preempted
            else f"{used + 1} of {project.max_restarts}"
        )
        if preempted:
            Resume.objects.filter(pk=resume.pk).update(after_preemption=True)
        Event.objects.filter(type="resume.requested", data__resume=resume.pk).update(
            message=f"Automatic resume ({reason}) from step {checkpoint.step} "
            f"with profile {profile.name}, {count}"
        )
    return resume


def _stop_loop(run, chain, why: str) -> None:
    """Automatic resume stops for this lineage: recorded on the run, and one alert for
    the run whose failure showed the loop (no attempt follows it, so none repeats it)."""
    message = f"Not resuming {run.key} automatically: a restart loop, {why}."
    Event.record("resume.skipped", run=run, actor="system", message=message)
    root = chain[-1]
    flips.record(
        "run.restart_loop",
        f"run.restart_loop:{run.pk}",
        f"Automatic resumes of {root.key} stopped: {why}. Resume by hand once the cause is fixed.",
        project_id=run.project_id,
        run_id=run.pk,
    )
