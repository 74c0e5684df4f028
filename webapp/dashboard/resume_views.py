"""Cancelling a resume from its row on the run page, as the API's
POST /api/v1/resumes/{id}/cancel does: the launch host's worker stops the process or the
Slurm job (webapp.domain.resume.cancel), so the page queues that worker's task on the
queue the API uses (webapp.domain.resume.enqueue_cancel), and says so. For operators,
like the API's operate scope and the resume itself."""

from __future__ import annotations

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
        resumes.enqueue_cancel(resume)  # the API's cancel (webapp/api/reads.py)
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
