"""Cancelling a resume from its row on the run or checkpoint page: the same action as the
API's POST /api/v1/resumes/{id}/cancel (webapp.domain.actions.cancel_resume: its lock, its
audit line, the launch host's task). For operators, like the API's operate scope and the
resume itself."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from webapp.dashboard.access import actor_of, project_view
from webapp.dashboard.views import _after_action
from webapp.domain import actions
from webapp.domain.actions import ActionRefused
from webapp.domain.models import Resume
from webapp.domain.models.projects import Role


@require_POST
@project_view(Role.OPERATOR)
def resume_cancel(request, resume_id: int):
    resume = get_object_or_404(
        Resume.objects.select_related("run", "checkpoint"), project=request.project, pk=resume_id
    )
    try:
        actions.cancel_resume(resume, actor_of(request))
    except ActionRefused as exc:
        text, level = f"Not cancelled: {exc}.", messages.ERROR
    else:
        text = f"Resume {resume.pk} is being cancelled: the launch worker stops its job."
        level = messages.SUCCESS
    if request.htmx:
        return _after_action(request, resume.checkpoint, text, level)
    messages.add_message(request, level, text)
    url = reverse("dashboard:run", args=[request.project.slug, resume.run.key])
    return redirect(f"{url}#resume-{resume.pk}")
