"""Which workers are alive, on which queues, and the hosts whose work nobody takes.

Celery answers the first question itself: a broadcast `active_queues` (remote control,
over the broker) reaches every worker alive and each says which queues it consumes. The
sweeper asks every SWEEP_INTERVAL_S (workers/sweeper.py) and keeps the answer in Redis,
so that pages read it without waiting for a broadcast.

A node-local checkpoint's part waits on `validate.<host>` (validation/node_local.py):
with no live worker on that queue it would wait forever in silence. A part queued
longer than SWEEP_LOST_AFTER_S on such a queue is a problem, "no worker for host
node-17", on the project's runs list, in the API, and as one alert per host and outage.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

log = logging.getLogger(__name__)

KEY = "lifeboat:workers"


def _redis():
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)


def ask(timeout: float = 1.0) -> dict[str, list[str]]:
    """{worker name: [queues]} of every worker that answers within `timeout`."""
    from webapp.domain import publish

    replies = publish.app().control.inspect(timeout=timeout).active_queues() or {}
    return {name: sorted(q["name"] for q in queues) for name, queues in replies.items()}


def refresh(now: datetime | None = None) -> dict:
    """Ask the workers and keep the answer (for 3 sweeps); returns it."""
    now = now or timezone.now()
    snapshot = {"at": now.isoformat(), "workers": ask()}
    _redis().set(KEY, json.dumps(snapshot), ex=3 * settings.SWEEP_INTERVAL_S + 60)
    return snapshot


def snapshot() -> dict | None:
    """The last answer: {"at": iso time, "workers": {name: [queues]}}; None when no sweep
    asked lately (then nothing is said about missing workers)."""
    try:
        raw = _redis().get(KEY)
    except Exception:  # noqa: BLE001 (a page shows no worker list rather than a 500)
        log.warning("could not read the live workers from Redis", exc_info=True)
        return None
    return json.loads(raw) if raw else None


def by_queue(known: dict | None = None) -> dict[str, list[str]]:
    """{queue: [worker names]} from the snapshot."""
    known = known if known is not None else snapshot()
    queues: dict[str, list[str]] = {}
    for name, names in sorted(((known or {}).get("workers") or {}).items()):
        for queue in names:
            queues.setdefault(queue, []).append(name)
    return queues


def stranded_hosts(project_id: int | None = None, now: datetime | None = None) -> dict:
    """{host: {"parts": n, "projects": {project ids}}} of the node-local parts that wait
    on a host's queue with no live worker, queued longer than SWEEP_LOST_AFTER_S."""
    from webapp.domain.models import ValidationPart
    from webapp.domain.validation.node_local import queue_for

    known = snapshot()
    if known is None:
        return {}
    live = by_queue(known)
    now = now or timezone.now()
    waiting = ValidationPart.objects.filter(
        finished_at__isnull=True,
        validation__finished_at__isnull=True,
        validation__created_at__lt=now - timedelta(seconds=settings.SWEEP_LOST_AFTER_S),
    ).exclude(host="")
    if project_id is not None:
        waiting = waiting.filter(validation__checkpoint__project_id=project_id)
    found: dict[str, dict] = {}
    for host, project in waiting.values_list("host", "validation__checkpoint__project_id"):
        if live.get(queue_for(host)):
            continue
        entry = found.setdefault(host, {"parts": 0, "projects": set()})
        entry["parts"] += 1
        entry["projects"].add(project)
    return found


def alert_stranded(now: datetime | None = None) -> list:
    """One alert per project, host and hour while its parts wait with no worker."""
    from webapp.domain.health import alerts

    now = now or timezone.now()
    flips = []
    for host, entry in stranded_hosts(now=now).items():
        for project_id in sorted(entry["projects"]):
            flip = alerts.record(
                "host.no_worker",
                f"host.no_worker:{project_id}:{host}:{now:%Y-%m-%dT%H}",
                f"No worker for host {host}: {entry['parts']} part(s) of node-local "
                f"checkpoints wait on queue validate.{host}. Start a worker on {host} "
                f"with -Q validate.{host} (docs/deployment.md).",
                project_id=project_id,
                data={"host": host, "parts": entry["parts"]},
            )
            if flip is not None:
                flips.append(flip)
    return flips
