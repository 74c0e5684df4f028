"""The human pages. Minimal for now: a project's runs and a run's checkpoints; the full
dashboard is issue #7."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from webapp.dashboard.access import project_for, visible_projects
from webapp.domain.models import Run


@require_GET
@login_required
def projects(request):
    return render(request, "dashboard/projects.html", {"projects": visible_projects(request.user)})


@require_GET
@login_required
def runs(request, slug: str):
    project = project_for(request.user, slug)
    run_list = project.runs.order_by("-last_seen_at", "-id")[:200]
    return render(request, "dashboard/runs.html", {"project": project, "runs": run_list})


@require_GET
@login_required
def run_detail(request, slug: str, key: str):
    project = project_for(request.user, slug)
    run = get_object_or_404(Run, project=project, key=key)
    checkpoints = run.checkpoints.order_by("-step")[:500]
    context = {"project": project, "run": run, "checkpoints": checkpoints}
    if request.htmx:
        return render(request, "dashboard/run_detail.html#checkpoint-table", context)
    return render(request, "dashboard/run_detail.html", context)
