"""The run page's "What checkpointing costs" section, drawn in a request of its own
(webapp/dashboard/views.py asks for it): the modelled intervals (health/analytics.py) and
the measured goodput of the run's training (health/goodput.py). Both read every
checkpoint or event of the run's family, so the page itself does not wait for them."""

from __future__ import annotations

import contextlib

from webapp.dashboard import charts
from webapp.domain.health import analytics, goodput

MTBF_HOURS_MAX = 24 * 365 * 10
# The causes of lost time in the order the page lists them, with the words it uses.
CAUSES = (
    ("lost_work", "lost work"),
    ("restart", "restarts"),
    ("restore", "restores"),
    ("checkpoint_save", "saves"),
    ("idle", "idle"),
    ("other", "other"),
)


def analytics_context(request, run) -> dict:
    mtbf_hours = None
    with contextlib.suppress(ValueError):
        mtbf_hours = float(request.GET.get("mtbf_hours", ""))
    if mtbf_hours is not None and not 0 < mtbf_hours <= MTBF_HOURS_MAX:
        mtbf_hours = None
    run.project = request.project  # for_run asks for it; no second query
    figures = analytics.for_run(run, mtbf_seconds=mtbf_hours * 3600 if mtbf_hours else None)
    measured = goodput.for_run(run)
    ledger = measured.as_dict(request.project.gpu_hour_price)
    return {
        "project": request.project,
        "run": run,
        "a": figures,
        "g": ledger,
        "g_causes": [(label, ledger["badput"][key]) for key, label in CAUSES],
        "what_if": analytics.what_if(run, measured.wall_seconds, figures=figures),
        "mtbf_hours": mtbf_hours,
        "interval_chart": charts.interval_chart(figures),
        "analytics_path": request.path,
    }
