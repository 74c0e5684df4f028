"""Analytics tasks (queue `alerts`): keeping the project's goodput view up to date
(webapp/domain/health/goodput_store.py). Safe to run twice: a pass writes what the events
say at its time."""

from __future__ import annotations

from celery import shared_task

from webapp.domain.health import goodput_store
from webapp.domain.models import Project
from webapp.domain.replication import ledger


@shared_task(name="workers.analytics.refresh_goodput", ignore_result=True)
def refresh_goodput() -> int:
    """Beat, every GOODPUT_REFRESH_S: compute again the trainings that changed."""

    return goodput_store.refresh_all()


@shared_task(name="workers.analytics.measure_storage", ignore_result=True)
def measure_storage() -> int:
    """Beat, every STORAGE_LEDGER_S: the storage ledger's history, one task a project."""

    ids = list(Project.objects.values_list("pk", flat=True))
    for project_id in ids:
        measure_project.delay(project_id)
    return len(ids)


@shared_task(name="workers.analytics.measure_project", ignore_result=True)
def measure_project(project_id: int) -> int:
    """One project's ledger written as history rows (webapp/domain/replication/ledger.py):
    reads only, each run a row set of its own."""

    project = Project.objects.filter(pk=project_id).first()
    return 0 if project is None else len(ledger.snapshot(project))
