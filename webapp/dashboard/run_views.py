"""The run page: its checkpoints (paged, polled while one is unsettled), timeline,
family, resumes, charts and analytics, the last three each in a request of its own."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from webapp.dashboard import charts
from webapp.dashboard.access import project_view
from webapp.dashboard.analytics_views import analytics_context
from webapp.dashboard.recovery_views import recovery_offer, resumes_context, resumes_fragment
from webapp.dashboard.views import page_number, poll_delay_ms
from webapp.domain.health import families
from webapp.domain.models import Run, Validation
from webapp.domain.models.recovery import ValidationKind, ValidationStatus

CHECKPOINTS_PER_PAGE = 50
TIMELINE_LENGTH = 100
METRIC_CHARTS = 4


def _checkpoint_table(request, run) -> dict:
    checkpoints = run.checkpoints.order_by("-step").only(
        "id", "step", "epoch", "status", "status_message", "pinned", "total_size",
        "file_count", "saved_at", "save_seconds", "location", "run_id", "quarantined_at",
        "quarantine_reason",
    )  # fmt: skip
    paginator = Paginator(checkpoints, CHECKPOINTS_PER_PAGE)
    # The count the triggers keep (RunStats), instead of COUNT(*) over 100,000 rows.
    paginator.count = run.checkpoint_count
    page = paginator.get_page(page_number(request))
    if page.number > 1:
        # A seek instead of OFFSET: the first step of the page from the (run, step) index
        # alone, then 50 rows from there (page 1,000 of a long run read 49,950 rows).
        skip = (page.number - 1) * CHECKPOINTS_PER_PAGE
        first = list(
            run.checkpoints.order_by("-step").values_list("step", flat=True)[skip : skip + 1]
        )
        page.object_list = (
            list(checkpoints.filter(step__lte=first[0])[:CHECKPOINTS_PER_PAGE]) if first else []
        )
    unsettled = any(not c.is_settled for c in page.object_list)
    delay, next_poll = poll_delay_ms(request)
    return {
        "page": page,
        "checkpoints": page.object_list,
        "polling": unsettled,
        "poll_ms": delay,
        "poll_url": f"{request.path}?page={page.number}&poll={next_poll}",
    }


def _metric_keys(run) -> list[str]:
    values = run.last_metrics or (
        run.metric_points.order_by("-step").values_list("values", flat=True).first() or {}
    )
    numeric = [k for k, v in values.items() if isinstance(v, int | float)]
    return sorted(numeric)[:METRIC_CHARTS]


@require_GET
@vary_on_headers("HX-Request")
@project_view()
def run_detail(request, key: str):
    project = request.project
    if "charts" in request.GET and request.htmx:
        # The charts come in their own request once the page is up: they aggregate every
        # checkpoint and metric point of the run, which costs more than the rest of the
        # page at 100,000 rows (docs/benchmarks.md).
        run = get_object_or_404(Run, project=project, key=key)
        context = {"run": run, "charts": charts.run_charts(run, _metric_keys(run))}
        return render(request, "dashboard/run_detail.html#charts", context)
    if "resumes" in request.GET and request.htmx:
        # The run's resumes, polled while one is on its way.
        run = get_object_or_404(Run.objects.filter(project=project).with_health(), key=key)
        return resumes_fragment(request, run)
    if "analytics" in request.GET and request.htmx:
        # What checkpointing costs and the interval that costs least: for_run() reads every
        # checkpoint of the run and the project's runs, so it has a request of its own too.
        run = get_object_or_404(Run, project=project, key=key)
        return render(
            request, "dashboard/run_detail.html#analytics", analytics_context(request, run)
        )
    run = get_object_or_404(
        Run.objects.filter(project=project)
        .with_dashboard_stats()
        .with_health()
        .select_related("resumed_from__run"),
        key=key,
    )
    table = _checkpoint_table(request, run)
    context = {"project": project, "run": run, "access": request.access, **table}
    if request.htmx:
        response = render(request, "dashboard/run_detail.html#checkpoint-table", context)
        if not table["polling"]:
            response.status_code = HttpResponseStopPolling.status_code
        return response
    family = families.families_of(project.pk, [run])[run.pk]
    run.label, run.member = family.label(run.pk), family.get(run.pk)
    parent = family.get(run.member.parent_id) if run.member.parent_id in family else None
    context.update(
        timeline=list(run.events.order_by("-time", "-id")[:TIMELINE_LENGTH]),
        family=family,
        parent=parent,
        children=family.children_of(run.pk),
        recover=recovery_offer(request, run, family),
        **resumes_context(request, run),
        # Without JavaScript, ?charts=1 draws them in the page itself.
        charts=charts.run_charts(run, _metric_keys(run)) if "charts" in request.GET else None,
        charts_url=f"{request.path}?charts=1",
        recovery=_time_to_recover(run),
        analytics_url=f"{request.path}?analytics=1",
    )
    if "analytics" in request.GET:  # without JavaScript: drawn in the page
        context.update(analytics_context(request, run))
    return render(request, "dashboard/run_detail.html", context)


def _time_to_recover(run) -> dict | None:
    """The latest passed restore test of any checkpoint of the run: its total is the
    measured time to recover (as analytics._restore_seconds reads it)."""
    row = (
        Validation.objects.filter(
            checkpoint__run=run, kind=ValidationKind.RESTORE, status=ValidationStatus.PASSED
        )
        .order_by("-finished_at")
        .values("timings", "finished_at", "device", "checkpoint_id", "checkpoint__step")
        .first()
    )
    if row is None:
        return None
    timings = row["timings"] or {}
    total = timings.get("total_s")
    if total is None:
        phases = [v for k, v in timings.items() if k.endswith("_s") and isinstance(v, int | float)]
        total = sum(phases)
    return {**row, "seconds": total}
