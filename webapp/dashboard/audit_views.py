"""The audit log, for a project's admins: what people did in the project (events whose
actor is user:…), newest first, filtered by actor, action and run, with links to the
run and the checkpoint each line is about."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.shortcuts import render

from webapp.dashboard.access import project_view
from webapp.dashboard.settings_views import _settings_context
from webapp.dashboard.views import page_number
from webapp.domain.models import Checkpoint, Event, Run
from webapp.domain.models.projects import Role

AUDIT_PER_PAGE = 50


@project_view(Role.ADMIN)
def audit_log(request):
    """What people did (actor user:…), newest first, filtered by actor, action (the
    event type) and run, 50 a page; each line links its run and its checkpoint."""
    people = Event.objects.filter(project=request.project, actor__startswith="user:")
    actor = request.GET.get("actor", "").strip()
    action = request.GET.get("action", "").strip()
    run_key = request.GET.get("run", "").strip()
    events = people
    if actor:
        events = events.filter(actor=actor if actor.startswith("user:") else f"user:{actor}")
    if action:
        events = events.filter(type=action)
    run = None
    if run_key:
        run = Run.objects.filter(project=request.project, key=run_key).first()
        events = events.filter(run=run) if run else events.none()
    page = Paginator(
        events.select_related("run").order_by("-received_at", "-id"), AUDIT_PER_PAGE
    ).get_page(page_number(request))
    rows = list(page.object_list)
    # One query for every line's checkpoint: the events name the run and the step.
    wanted = {(e.run_id, e.step) for e in rows if e.run_id and e.step is not None}
    by_step = {}
    if wanted:
        found = Checkpoint.objects.filter(
            run_id__in={r for r, _ in wanted}, step__in={s for _, s in wanted}
        ).values_list("run_id", "step", "pk")
        by_step = {(r, s): pk for r, s, pk in found}
    for e in rows:
        e.checkpoint_id = (e.data or {}).get("checkpoint") or by_step.get((e.run_id, e.step))
    query = request.GET.copy()
    query.pop("page", None)
    choices = people.order_by()
    return render(
        request,
        "dashboard/settings_audit.html",
        _settings_context(
            request,
            events=rows,
            page=page,
            query=query.urlencode(),
            actor=actor,
            action=action,
            run_key=run_key,
            actors=sorted(set(choices.values_list("actor", flat=True).distinct())),
            actions=sorted(set(choices.values_list("type", flat=True).distinct())),
            tab="audit",
        ),
    )
