"""A storage target's audit: what a listing of it found that no record accounts for, and
its cleanup (webapp/domain/retention/orphans.py). Admins only: the page shows object keys
of the store, and the cleanup deletes. Both buttons go through webapp.domain.actions."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.dashboard.access import actor_of, project_view
from webapp.domain import actions
from webapp.domain.models import StorageAudit, StorageTarget
from webapp.domain.models.projects import Role

SHOWN = 100  # orphans listed on the page; the API and the row hold up to orphans.SHOWN


@project_view(Role.ADMIN)
def storage_audit(request, target_id: int):
    target = get_object_or_404(StorageTarget, project=request.project, pk=target_id)
    audits = list(StorageAudit.objects.filter(target=target).order_by("-started_at")[:10])
    newest = audits[0] if audits else None
    return render(
        request,
        "dashboard/storage_audit.html",
        {
            "project": request.project,
            "access": request.access,
            "tab": "storage",
            "target": target,
            "audit": newest,
            "orphans": newest.orphans[:SHOWN] if newest else [],
            "history": audits,
            "cleanable": bool(
                newest
                and newest.status == "done"
                and newest.cleaned_at is None
                and (newest.orphan_objects or newest.uploads)
            ),
        },
    )


@require_POST
@project_view(Role.ADMIN)
def storage_audit_run(request, target_id: int):
    target = get_object_or_404(StorageTarget, project=request.project, pk=target_id)
    actions.audit_storage(target, actor_of(request))
    messages.success(request, f"Storage target {target.name} is being listed; reload in a while.")
    return redirect("dashboard:settings-storage-audit", request.project.slug, target.pk)


@require_POST
@project_view(Role.ADMIN)
def storage_audit_clean(request, target_id: int, audit_id: int):
    row = get_object_or_404(
        StorageAudit, target__project=request.project, target_id=target_id, pk=audit_id
    )
    try:
        actions.clean_storage(row, actor_of(request))
    except actions.ActionRefused as exc:
        messages.error(request, f"Not cleaned: {exc}.")
    else:
        messages.success(
            request,
            "The objects are being deleted, each checked again first; the event log says "
            "what went.",
        )
    return redirect("dashboard:settings-storage-audit", request.project.slug, target_id)
