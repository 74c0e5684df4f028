"""The human pages. Minimal for now: a project's runs and a run's checkpoints; the full
dashboard is issue #7."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from webapp.dashboard.access import project_for, visible_projects
from webapp.domain.models import Checkpoint, Run


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


@require_GET
@login_required
def checkpoint_detail(request, slug: str, checkpoint_id: int):
    project = project_for(request.user, slug)
    checkpoint = get_object_or_404(
        Checkpoint.objects.select_related("run"), project=project, pk=checkpoint_id
    )
    validations = list(checkpoint.validations.order_by("-created_at")[:20])
    running = any(not v.is_final for v in validations) or not checkpoint.is_settled
    context = {
        "project": project,
        "checkpoint": checkpoint,
        "files": checkpoint.files.order_by("path"),
        "validations": validations,
        "running": running,
    }
    if request.htmx:
        response = render(request, "dashboard/checkpoint_detail.html#checks", context)
        if not running:
            response.status_code = 286  # htmx: stop polling, the check is done
        return response
    return render(request, "dashboard/checkpoint_detail.html", context)
