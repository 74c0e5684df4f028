"""What needs a person on a project's runs, counted for the top of the runs list (as
healthchecks counts its checks that are down): runs that failed and were not resumed,
runs overdue or late, and runs with corrupt or suspicious checkpoints. Each count links
to the runs list filtered to it (the `status` values of dashboard.views.runs)."""

from __future__ import annotations

from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q

from webapp.domain import repair
from webapp.domain.health import live_workers
from webapp.domain.models import Checkpoint, Resume, Run
from webapp.domain.models.checkpoints import DAMAGED as DAMAGED_STATUSES
from webapp.domain.recovery.resume import FINAL

# Filter values of the runs list beyond RunStatus and Health.
UNRESUMED_FAILED = "failed-unresumed"
DAMAGED = "damaged"


def unresumed_failed_q() -> Q:
    """Failed, and no run resumed from it and no resume of it on its way."""

    child = Run.objects.filter(resumed_from__isnull=False, resumed_from__run=OuterRef("pk"))
    pending = Resume.objects.filter(run=OuterRef("pk")).exclude(status__in=FINAL)
    return Q(status="failed") & ~Q(Exists(child)) & ~Q(Exists(pending))


def damaged_q() -> Q:
    """A run with a corrupt or suspicious checkpoint."""

    bad = Checkpoint.objects.filter(run=OuterRef("pk"), status__in=DAMAGED_STATUSES)
    return Q(Exists(bad))


def summary(project_id: int) -> list[dict]:
    """[{filter, count, label, tone}] for the problems of the project's runs, the ones
    with a count only; three queries. The overdue and late count works out the health
    of every running run (about 200 ms at 10,000 runs), so the runs list asks for the
    summary in a request of its own, after the page is up."""

    runs = Run.objects.filter(project_id=project_id)
    failed = runs.filter(status="failed").filter(unresumed_failed_q()).count()
    # Only a running run can be late or overdue (Health.ENDED otherwise).
    counts = (
        runs.filter(status="running")
        .with_health()
        .aggregate(
            overdue=Count("pk", filter=Q(health="overdue")),
            late=Count("pk", filter=Q(health="late")),
        )
    )
    # The partial index checkpoint_damaged holds exactly these rows.
    checkpoints = dict(
        Checkpoint.objects.filter(project_id=project_id, status__in=DAMAGED_STATUSES)
        .values("status")
        .annotate(n=Count("pk"))
        .values_list("status", "n")
    )
    rows = [
        (UNRESUMED_FAILED, failed, "failed, not resumed", "bad"),
        ("overdue", counts["overdue"], "overdue", "bad"),
        ("late", counts["late"], "late", "warn"),
        (DAMAGED, checkpoints.get("corrupt", 0), "corrupt checkpoint", "bad"),
        (DAMAGED, checkpoints.get("suspicious", 0), "suspicious checkpoint", "warn"),
        (DAMAGED, checkpoints.get("incomplete", 0), "incomplete checkpoint", "bad"),
    ]
    found = [
        {
            "filter": f, "count": n, "tone": tone,
            "label": f"{label}s" if n != 1 and label.endswith("checkpoint") else label,
        }
        for f, n, label, tone in rows
        if n
    ]  # fmt: skip
    return found + _repairs(project_id) + _stranded(project_id)


def _stranded(project_id: int) -> list[dict]:
    """Hosts whose node-local parts wait with no live worker on their queue."""

    return [
        {
            "filter": None,
            "count": entry["waiting"],
            "tone": "bad",
            "label": f"no worker for host {host}",
            "title": f"Work on node-local checkpoints waits on {', '.join(sorted(entry['queues']))}"
            f", and no live worker listens there: start one on {host} (docs/deployment.md).",
        }
        for host, entry in sorted(live_workers.stranded_hosts(project_id).items())
    ]


def _repairs(project_id: int) -> list[dict]:
    """Work the sweeper found owed and sent again, over the last two hours, once it keeps
    happening (SWEEP_PROBLEM_PER_HOUR): something loses work (a broker without
    persistence, workers being killed). Each piece is on its run's timeline; no runs
    filter shows them, so the entry links nowhere."""
    counts = repair.recent(project_id)
    total = sum(counts.values())
    if total < settings.SWEEP_PROBLEM_PER_HOUR:
        return []
    stages = ", ".join(f"{stage} {n}" for stage, n in sorted(counts.items()))
    return [
        {
            "filter": None,
            "count": total,
            "tone": "warn",
            "label": f"tasks sent again by the sweeper ({stages})",
            "title": "Work nobody was doing was found and sent again in the last two hours: "
            "a broker without persistence, or workers being killed? See each run's timeline.",
        }
    ]
