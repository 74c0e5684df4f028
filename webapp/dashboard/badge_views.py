"""Status badges: served to anyone who has the URL (no sign-in, no token; the project's
badge_key is the secret), and the page where members copy the URLs and admins
regenerate the key (webapp/domain/health/badges.py)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_GET, require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.setting_changes import change
from webapp.domain import actions
from webapp.domain.health import badges
from webapp.domain.models import Project, Run
from webapp.domain.models.projects import Role

LABEL_MAX = 60


def _project(badge_key: str) -> Project:
    project = Project.objects.filter(badge_key=badge_key).first()
    if project is None:
        raise Http404("no such badge")
    return project


def _answer(request, badge: badges.Badge, fmt: str):
    if fmt == "json":
        response = JsonResponse(badge.as_dict())
        # A status page on another site may read it: the URL is the only secret.
        response["Access-Control-Allow-Origin"] = "*"
    else:
        label = badge.label if len(badge.label) <= LABEL_MAX else badge.label[: LABEL_MAX - 1] + "…"
        response = render(
            request,
            "badges/badge.svg",
            {
                "label": label,
                "state": badge.state,
                "colour": badge.colour,
                **badges.svg_widths(label, badge.state),
            },
            content_type="image/svg+xml; charset=utf-8",
        )
        # An SVG opened on its own is a document: no script, nothing fetched.
        response["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'"
    patch_cache_control(response, public=True, max_age=settings.BADGE_MAX_AGE_S)
    return response


@require_GET
def project_badge(request, badge_key: str, fmt: str):
    return _answer(request, badges.for_runs(_project(badge_key)), fmt)


def _named(badge_key: str, kind: str, name_key: str, name: str) -> Project:
    """The project, once the name's key is the one its badge key makes for this name:
    else 404, the same answer as for a name the project does not have."""
    project = _project(badge_key)
    if not hmac.compare_digest(name_key, badges.name_key(project.badge_key, kind, name)):
        raise Http404("no such badge")
    return project


@require_GET
def tag_badge(request, badge_key: str, name_key: str, name: str, fmt: str):
    project = _named(badge_key, "tag", name_key, name)
    return _answer(request, badges.for_runs(project, tag=name), fmt)


@require_GET
def run_badge(request, badge_key: str, name_key: str, name: str, fmt: str):
    project = _named(badge_key, "run", name_key, name)
    run = Run.objects.filter(project=project, key=name).first()
    if run is None:
        raise Http404("no such badge")
    return _answer(request, badges.for_run(run), fmt)


def badge_urls(request, project: Project, tags: list[str], run_keys: list[str]) -> list[dict]:
    """What the badges page lists: the project's badge, one per tag in use and one per
    recent run, each with its SVG and JSON URLs."""
    url = request.build_absolute_uri
    rows = [{"what": "Project", "name": project.name, "url": url(badges.path(project))}]
    rows += [{"what": "Tag", "name": t, "url": url(badges.path(project, "tag", t))} for t in tags]
    rows += [
        {"what": "Run", "name": k, "url": url(badges.path(project, "run", k))} for k in run_keys
    ]
    return [{**row, "svg": row["url"] + ".svg", "json": row["url"] + ".json"} for row in rows]


RECENT_RUNS = 20


@require_GET
@project_view()
def badges_page(request):
    project = request.project
    recent = list(
        Run.objects.filter(project=project)
        .order_by("-last_seen_at", "-id")
        .values_list("key", "tags")[:RECENT_RUNS]
    )
    tags = sorted({t for _, ts in recent for t in (ts or []) if isinstance(t, str)})
    context = {
        "project": project,
        "access": request.access,
        "ended_hours": settings.BADGE_ENDED_HOURS,
        "rows": badge_urls(request, project, tags, [key for key, _ in recent]),
    }
    return render(request, "dashboard/badges.html", context)


@require_POST
@project_view(Role.ADMIN)
def badges_regenerate(request):
    return change(
        request,
        actions.regenerate_badge_key,
        "dashboard:badges",
        done=lambda _: "New badge URLs: the old ones no longer answer.",
    )
