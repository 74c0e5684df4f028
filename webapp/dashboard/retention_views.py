"""Retention from the dashboard: carry the project's policies out now (operators), as
POST /api/v1/retention/apply does; both call webapp.domain.actions.apply_retention."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from webapp.dashboard.access import actor_of, project_view
from webapp.domain import actions
from webapp.domain.models.projects import Role


@require_POST
@project_view(Role.OPERATOR)
def retention_apply(request):
    actions.apply_retention(request.project, actor_of(request))
    messages.success(
        request,
        "The retention policies are being applied; each deletion is in the event log.",
    )
    return redirect("dashboard:runs", request.project.slug)
