"""The human pages: projects, a project's runs, a run, a checkpoint, and the actions on
it. Function-based views; `project_view` resolves the project and the person's role
(viewers see, operators act, admins configure) and every action is a POST with a CSRF
token and an audit Event."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from webapp.dashboard.access import actor_of, project_view, visible_projects
from webapp.dashboard.run_sorting import RUN_SORTS, pager_labels, run_ordering, sort_and_direction
from webapp.domain import actions
from webapp.domain.actions import ActionRefused
from webapp.domain.health import families, live_workers, problems, run_health
from webapp.domain.models import Checkpoint, Run
from webapp.domain.models.projects import Role
from webapp.domain.models.recovery import (
    ReplicaStatus,
    ResumeStatus,
    ValidationKind,
)
from webapp.domain.models.runs import Health, RunStatus
from webapp.domain.recovery.resume import output_tail

RUNS_PER_PAGE = 50

# Polling backoff: the n-th poll of a fragment waits 1 s * 1.5**n, at most 10 s; the
# fragment carries n+1 in its next URL, and the last answer is 286 (htmx stops).
POLL_FIRST_MS, POLL_FACTOR, POLL_MAX_MS = 1000, 1.5, 10_000

STATUS_FILTERS = [(s.value, s.label) for s in RunStatus] + [
    (Health.UP.value, "Up"),
    (Health.LATE.value, "Late"),
    (Health.OVERDUE.value, "Overdue"),
    (problems.UNRESUMED_FAILED, "Failed, not resumed"),
    (problems.DAMAGED, "Corrupt, suspicious or incomplete checkpoints"),
]


def poll_delay_ms(request) -> tuple[int, int]:
    """(delay before the next poll, the next poll's number) from ?poll=n."""
    try:
        n = max(0, min(int(request.GET.get("poll", 0)), 50))
    except ValueError:
        n = 0
    return int(min(POLL_FIRST_MS * POLL_FACTOR**n, POLL_MAX_MS)), n + 1


def page_number(request, name: str = "page") -> int:
    try:
        return max(1, int(request.GET.get(name, 1)))
    except ValueError:
        return 1


@require_GET
@login_required
def projects(request):
    return render(request, "dashboard/projects.html", {"projects": visible_projects(request.user)})


# --- The project page -----------------------------------------------------------------


@require_GET
@vary_on_headers("HX-Request")
@project_view()
def runs(request):
    project = request.project
    if "problems" in request.GET and request.htmx:
        # The problems summary in a request of its own (problems.summary says why).
        context = {"project": project, "problems": problems.summary(project.pk)}
        context["workers"] = live_workers.by_queue()
        return render(request, "dashboard/runs.html#problems", context)
    q = request.GET.get("q", "").strip()
    tag = request.GET.get("tag", "").strip()
    status = request.GET.get("status", "")
    sort, direction = sort_and_direction(request)
    run_list = (
        Run.objects.filter(project=project)
        .with_dashboard_stats()
        .with_health()
        .with_problem_counts()
    )
    if q:
        run_list = run_list.filter(Q(name__icontains=q) | Q(key__icontains=q))
    if tag:
        run_list = run_list.tagged(tag)
    if status in RunStatus.values:
        run_list = run_list.filter(status=status)
    elif status in (Health.UP, Health.LATE, Health.OVERDUE):
        run_list = run_health.watched(run_list).filter(health=status)
    elif status == problems.UNRESUMED_FAILED:
        run_list = run_list.filter(problems.unresumed_failed_q())
    elif status == problems.DAMAGED:
        run_list = run_list.filter(problems.damaged_q())
    else:
        status = ""
    page = Paginator(run_list.order_by(*run_ordering(sort, direction)), RUNS_PER_PAGE).get_page(
        page_number(request)
    )
    filtered = bool(q or tag or status)
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "project": project,
        "access": request.access,
        "page": page,
        "groups": families.grouped(project.pk, page.object_list),
        # Without JavaScript, ?problems=1 draws the summary in the page.
        "problems": problems.summary(project.pk) if "problems" in request.GET else None,
        "refresh_s": settings.RUNS_REFRESH_S,
        "problems_refresh_s": settings.PROBLEMS_REFRESH_S,
        "refresh_url": f"{request.path}?{request.GET.urlencode()}",
        "q": q,
        "tag": tag,
        "status": status,
        "sort": sort,
        "direction": direction,
        "pager_labels": pager_labels(sort, direction),
        "sorts": list(RUN_SORTS),
        "status_filters": STATUS_FILTERS,
        "filtered": filtered,
        "query": query.urlencode(),
    }
    if request.htmx and request.htmx.target == "run-list":
        return render(request, "dashboard/runs.html#run-list", context)
    return render(request, "dashboard/runs.html", context)


# --- The checkpoint page and its actions ------------------------------------------------


def _replica_progress(replica, now) -> dict:
    end = replica.verified_at or now
    elapsed = (end - replica.started_at).total_seconds() if replica.started_at else 0.0
    rate = replica.bytes_done / elapsed if elapsed > 0 else 0.0
    remaining = max(replica.bytes_total - replica.bytes_done, 0)
    active = replica.status in (ReplicaStatus.PENDING, ReplicaStatus.UPLOADING)
    return {
        "bytes_done": replica.bytes_done,
        "bytes_total": replica.bytes_total,
        "rate": rate,
        "eta_s": remaining / rate if rate > 0 and active else None,
        "percent": int(100 * replica.bytes_done / replica.bytes_total)
        if replica.bytes_total
        else 0,
    }


# The phases of a restore test, in the order they happen (docs/restore.md).
RESTORE_PHASES = (
    ("download_verify_s", "Download + verify"),
    ("load_s", "Load"),
    ("to_device_s", "To device"),
    ("total_s", "Total (time to recover)"),
)
RESUMES_SHOWN = 20
RESUME_FINAL = (ResumeStatus.SUCCEEDED, ResumeStatus.FAILED, ResumeStatus.CANCELLED)


def restore_phases(validation) -> list[tuple[str, float | None]]:
    timings = validation.timings or {}
    return [(label, timings.get(key)) for key, label in RESTORE_PHASES]


def _checkpoint_context(request, checkpoint) -> dict:
    now = timezone.now()
    validations = list(checkpoint.validations.order_by("-created_at")[:20])
    for validation in validations:
        validation.p = validation.progress(now)
        if validation.kind == ValidationKind.RESTORE:
            validation.phases = restore_phases(validation)
        validation.p["percent"] = (
            int(100 * validation.bytes_done / validation.bytes_total)
            if validation.bytes_total
            else 0
        )
    # Only the columns shown: the page keeps working while the replica table grows.
    replicas = list(
        checkpoint.replicas.select_related("target")
        .only(
            "id", "checkpoint_id", "status", "bytes_total", "bytes_done", "attempts",
            "last_error", "manifest_key", "started_at", "verified_at",
            "target__name", "target__bucket", "target__prefix",
        )
        .order_by("target__name")
    )  # fmt: skip
    for replica in replicas:
        replica.p = _replica_progress(replica, now)
    # The resumes from this checkpoint, with the end of each one's output (a file on the
    # launch worker's host, when it is this host: var/launch/resume-<id>/output.log).
    resumes = list(
        checkpoint.resumes.select_related("profile", "requested_by", "new_run").order_by(
            "-created_at"
        )[:RESUMES_SHOWN]
    )
    for resume in resumes:
        resume.is_final = resume.status in RESUME_FINAL
        # A job's output may hold secrets it printed: operators and above only, redacted.
        resume.tail = output_tail(resume, lines=20) if request.access.can_operate else ""
    running = (
        not checkpoint.is_settled
        or any(not v.is_final for v in validations)
        or any(r.status in (ReplicaStatus.PENDING, ReplicaStatus.UPLOADING) for r in replicas)
        or any(not r.is_final for r in resumes)
    )
    delay, next_poll = poll_delay_ms(request)
    path = reverse("dashboard:checkpoint", args=[request.project.slug, checkpoint.pk])
    return {
        "project": request.project,
        "access": request.access,
        "checkpoint": checkpoint,
        "validations": [v for v in validations if v.kind != ValidationKind.RESTORE],
        "restores": [v for v in validations if v.kind == ValidationKind.RESTORE],
        "has_verified_replica": any(r.status == ReplicaStatus.VERIFIED for r in replicas),
        # The one rule (models/checkpoints.resumable_q), also on every poll: the buttons
        # of the live part follow it.
        "resume_refusal": checkpoint.resume_refusal(),
        "replicas": replicas,
        "resumes": resumes,
        "restore_phase_labels": RESTORE_PHASES,
        "running": running,
        "poll_ms": delay,
        "poll_url": f"{path}?poll={next_poll}",
    }


def _live_fragment(request, checkpoint, notice: tuple[str, str] | None = None):
    """The part of the checkpoint page that changes. A poll gets 286 once nothing runs
    (htmx stops polling); an action's answer is a plain 200 with its notice inside."""
    context = _checkpoint_context(request, checkpoint)
    context["notice"] = notice
    response = render(request, "dashboard/checkpoint_detail.html#live", context)
    if not context["running"] and notice is None:
        response.status_code = HttpResponseStopPolling.status_code
    return response


def _get_checkpoint(request, checkpoint_id: int) -> Checkpoint:
    return get_object_or_404(
        Checkpoint.objects.select_related("run"), project=request.project, pk=checkpoint_id
    )


@require_GET
@vary_on_headers("HX-Request")
@project_view()
def checkpoint_detail(request, checkpoint_id: int):
    checkpoint = _get_checkpoint(request, checkpoint_id)
    if request.htmx:
        return _live_fragment(request, checkpoint)
    context = _checkpoint_context(request, checkpoint)
    context["files"] = checkpoint.files.order_by("path")
    context["parts"] = checkpoint.parts.order_by("rank") if checkpoint.world_size else []
    context["missing_ranks"] = checkpoint.missing_parts(50)
    tensors = (checkpoint.content or {}).get("keys") or {}
    context["tensors"] = sorted(tensors.items())[:200]
    context["tensor_count"] = len(tensors)
    context["launch_profiles"] = list(request.project.launch_profiles.order_by("name"))
    return render(request, "dashboard/checkpoint_detail.html", context)


def _after_action(request, checkpoint, text: str, level=messages.SUCCESS):
    """htmx: the live fragment again (with the polling it needs); plain form: back to the
    page with a message."""
    if request.htmx:
        # 200 even when refused: htmx swaps only 2xx answers, and the notice must show.
        return _live_fragment(request, checkpoint, notice=(messages.DEFAULT_TAGS[level], text))
    messages.add_message(request, level, text)
    return redirect("dashboard:checkpoint", request.project.slug, checkpoint.pk)


@require_POST
@project_view(Role.OPERATOR)
def checkpoint_validate(request, checkpoint_id: int):
    checkpoint = _get_checkpoint(request, checkpoint_id)
    try:
        requested = actions.validate(checkpoint, actor_of(request))
    except ActionRefused as exc:
        return _after_action(request, checkpoint, f"Not checked: {exc}.", messages.ERROR)
    checkpoint.refresh_from_db()
    if requested.coalesced:
        return _after_action(
            request,
            checkpoint,
            f"A check of step {checkpoint.step} is already {requested.validation.status}.",
            messages.INFO,
        )
    return _after_action(request, checkpoint, f"Step {checkpoint.step} is queued for a check.")


@require_POST
@project_view(Role.OPERATOR)
def checkpoint_pin(request, checkpoint_id: int):
    checkpoint = _get_checkpoint(request, checkpoint_id)
    pinned = request.POST.get("pinned", "1") not in ("0", "false", "")
    actions.pin(checkpoint, actor_of(request), pinned)
    verb = "pinned: no retention policy will delete it" if pinned else "unpinned"
    return _after_action(request, checkpoint, f"Step {checkpoint.step} is {verb}.")


@require_POST
@project_view(Role.OPERATOR)
def checkpoint_replicate(request, checkpoint_id: int):
    """Copy a verified checkpoint to every enabled storage target, whatever their
    policies say (as POST /api/v1/checkpoints/<id>/replicate: both call
    webapp.domain.actions.replicate); the replicate workers do the copying and the page
    shows their progress."""
    checkpoint = _get_checkpoint(request, checkpoint_id)
    try:
        queued = actions.replicate(checkpoint, actor_of(request))
    except ActionRefused as exc:
        return _after_action(request, checkpoint, f"Not copied: {exc}.", messages.ERROR)
    if queued:
        copies = f"{len(queued)} cop{'y' if len(queued) == 1 else 'ies'}"
        return _after_action(request, checkpoint, f"Step {checkpoint.step}: {copies} queued.")
    return _after_action(
        request,
        checkpoint,
        f"Nothing to queue: every target has a copy of step {checkpoint.step}, "
        "verified or on its way.",
    )


def forbidden(request, exception=None):
    """403 with the reason (which role is needed), as a page or an htmx fragment."""
    reason = str(exception) if exception and str(exception) else "You may not do this."
    if getattr(request, "htmx", False):
        fragment = format_html('<p class="notice notice-error">{}</p>', reason)
        return HttpResponse(fragment, status=403)
    return render(request, "403.html", {"reason": reason}, status=403)
