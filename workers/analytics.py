"""Analytics tasks (queue `alerts`): keeping the project's goodput view up to date
(webapp/domain/health/goodput_store.py). Safe to run twice: a pass writes what the events
say at its time."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="workers.analytics.refresh_goodput", ignore_result=True)
def refresh_goodput() -> int:
    """Beat, every GOODPUT_REFRESH_S: compute again the trainings that changed."""
    from webapp.domain.health import goodput_store

    return goodput_store.refresh_all()
