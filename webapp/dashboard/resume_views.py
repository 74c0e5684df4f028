"""Cancelling a resume from its row on the run page, as the API's
POST /api/v1/resumes/{id}/cancel does: the launch host's worker stops the process or the
Slurm job (webapp.domain.resume.cancel), so the page queues that worker's task, on the
queue the API uses, and says so. For operators, like the API's operate scope."""

from __future__ import annotations

from celery import current_app
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.settings_views import audit
from webapp.domain import resume as resumes
from webapp.domain.models import Resume
from webapp.domain.models.projects import Role

FINAL = ("succeeded", "failed", "cancelled")


def queue_cancel(resume) -> None:
    """The API's cancel, by task name (nothing under webapp/ imports workers/)."""
    queue = resumes.queue_for(resume.profile) if resume.profile_id else "launch"
    current_app.send_task("workers.launch.cancel_resume", args=[resume.pk], queue=queue)


@require_POST
@project_view(Role.OPERATOR)
def resume_cancel(request, resume_id: int):
    resume = get_object_or_404(
        Resume.objects.select_related("run", "checkpoint", "profile"),
        project=request.project,
        pk=resume_id,
    )
    if resume.status in FINAL:
        messages.info(request, f"Resume {resume.pk} has already ended: {resume.status}.")
    else:
        queue_cancel(resume)
        audit(
            request,
            "resume.cancel_requested",
            f"cancel of resume {resume.pk} (from step {resume.checkpoint.step}) requested",
            run=resume.run,
            step=resume.checkpoint.step,
            resume=resume.pk,
            checkpoint=resume.checkpoint_id,
        )
        messages.success(
            request,
            f"Resume {resume.pk} is being cancelled: the launch worker stops its job.",
        )
    url = reverse("dashboard:run", args=[request.project.slug, resume.run.key])
    return redirect(f"{url}#resume-{resume.pk}")
