"""The project's goodput page: how much of its GPU time became kept progress, day by day,
where the rest went, the trainings that lost most and the hosts that fail most
(webapp/domain/health/goodput_report.py; docs/analytics.md, "A project's goodput")."""

from __future__ import annotations

from datetime import timedelta

from django.shortcuts import render
from django.utils import timezone

from webapp.dashboard.access import project_view
from webapp.dashboard.analytics_views import CAUSES
from webapp.domain.health import goodput_report

PERIODS = (7, 30, 90, 365)  # days the page offers
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 640, 180, 40, 20, 8
MIN_BAR = 2.0  # viewBox units: a day of one run still shows


@project_view()
def goodput_page(request):
    project = request.project
    try:
        days = int(request.GET.get("days", 30))
    except ValueError:
        days = 30
    days = days if days in PERIODS else 30
    since = timezone.now() - timedelta(days=days)
    report = goodput_report.report(project, since, "run", limit=10)
    _, hosts = goodput_report.groups(project, since, "host", limit=10, order="failures")
    for group in report["groups"]:
        group["most_lost"] = most_lost(group["badput"])
    context = {
        "project": project,
        "access": request.access,
        "r": report,
        "causes": [(key, label, report["badput"][key]) for key, label in CAUSES],
        "hosts": hosts,
        "days": days,
        "periods": PERIODS,
        "chart": day_chart(goodput_report.daily(project, since)),
    }
    return render(request, "dashboard/goodput.html", context)


def most_lost(badput: dict) -> str:
    """The cause that took most of a training's lost time, in the page's words."""
    seconds, label = max((badput[key], label) for key, label in CAUSES)
    return label if seconds > 0 else "—"


def day_chart(days: list[dict]) -> dict | None:
    """A bar a day (the days runs started), as tall as 100 %: kept progress at the foot,
    then each cause of badput, so goodput reads as the height of the first segment."""
    days = [d for d in days if d["wall_seconds"] > 0]
    if not days:
        return None
    plot_w, plot_h = WIDTH - LEFT - 4, HEIGHT - TOP - BOTTOM
    step = plot_w / len(days)
    width = max(MIN_BAR, step * 0.8)
    bars = []
    for i, day in enumerate(days):
        wall, x = day["wall_seconds"], LEFT + i * step + (step - width) / 2
        parts = [("productive", "kept progress", day["productive_seconds"])]
        parts += [(key, label, day["badput"][key]) for key, label in CAUSES]
        y, segments = TOP + plot_h, []
        for key, label, seconds in parts:
            height = max(0.0, seconds - (day["overlap_seconds"] if key == "other" else 0)) / wall
            height = min(height, 1.0) * plot_h
            if height <= 0:
                continue
            y -= height
            share = seconds / wall
            segments.append({"key": key, "label": label, "y": y, "height": height, "share": share})
        bars.append({"x": x, "width": width, "day": day["day"], "goodput": day["goodput"],
                     "runs": day["runs"], "segments": segments})  # fmt: skip
    first, last = days[0]["day"], days[-1]["day"]
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "top": TOP,
        "bottom": TOP + plot_h,
        "bars": bars,
        "y_ticks": [(TOP + plot_h * (1 - f), f"{f:.0%}") for f in (0, 0.5, 1)],
        "first": first,
        "last": last,
        "summary": f"Goodput by day from {first} to {last}: "
        + ", ".join(f"{b['day']} {b['goodput']:.0%}" for b in bars if b["goodput"] is not None),
    }
