"""The project's storage page: what its checkpoints take on each storage target and where
the jobs wrote them, what deduplication saved, what it costs a month, what retention
freed and what it would free now, and stored bytes over time
(webapp/domain/replication/ledger.py; docs/replication.md, "The storage ledger")."""

from __future__ import annotations

from datetime import timedelta

from django.shortcuts import render
from django.utils import timezone

from webapp.dashboard import charts
from webapp.dashboard.access import project_view
from webapp.dashboard.time_charts import over_time
from webapp.domain.replication import ledger
from webapp.domain.retention import orphans

HISTORY_DAYS = 90


@project_view()
def storage_page(request):
    project = request.project
    figures = ledger.latest(project)
    points = ledger.history(project, timezone.now() - timedelta(days=HISTORY_DAYS))
    return render(
        request,
        "dashboard/storage.html",
        {
            "project": project,
            "access": request.access,
            "l": figures,
            "proof": orphans.findings(project),
            "history_days": HISTORY_DAYS,
            "charts": [
                over_time(
                    "Stored on storage targets",
                    [(p["at"], p["replicas"]) for p in points],
                    charts.size,
                ),
                over_time("Local copies", [(p["at"], p["local"]) for p in points], charts.size),
            ],
        },
    )
