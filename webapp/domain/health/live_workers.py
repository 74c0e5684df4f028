"""Which workers are alive, on which queues, and the hosts whose work nobody takes.

Celery answers the first question itself: a broadcast `active_queues` (remote control,
over the broker) reaches every worker alive and each says which queues it consumes. The
sweeper asks every SWEEP_INTERVAL_S (workers/sweeper.py) and keeps the answer in Redis,
so that pages read it without waiting for a broadcast.

A node-local checkpoint's work waits on its hosts' queues: `validate.<host>`
(validation/node_local.py) and `replicate.<host>` (replication/host_legs.py). With no
live worker on that queue it would wait forever in silence. Work queued longer than
SWEEP_LOST_AFTER_S on such a queue is a problem, "no worker for host node-17", on the
project's runs list, in the API, and as one alert per project, host and hour.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.utils import timezone

from webapp.domain import publish
from webapp.domain.health import alerts
from webapp.domain.models import Replica, ValidationPart

log = logging.getLogger(__name__)

KEY = "lifeboat:workers"


def _redis():
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)


def ask(timeout: float = 1.0) -> dict[str, list[str]]:
    """{worker name: [queues]} of every worker that answers within `timeout`."""

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
    """{host: {"waiting": n, "queues": {names}, "projects": {ids}}}: node-local work (a
    validation part, a replica's leg) queued on a host's queue longer than
    SWEEP_LOST_AFTER_S, with no live worker on that queue."""

    known = snapshot()
    if known is None:
        return {}
    live = by_queue(known)
    now = now or timezone.now()
    before = now - timedelta(seconds=settings.SWEEP_LOST_AFTER_S)
    parts = ValidationPart.objects.filter(
        finished_at__isnull=True,
        validation__finished_at__isnull=True,
        validation__created_at__lt=before,
    ).exclude(host="")
    replicas = Replica.objects.filter(status="uploading", started_at__lt=before).exclude(legs={})
    if project_id is not None:
        parts = parts.filter(validation__checkpoint__project_id=project_id)
        replicas = replicas.filter(checkpoint__project_id=project_id)
    waiting = [
        (f"validate.{host}", host, project)
        for host, project in parts.values_list("host", "validation__checkpoint__project_id")
    ]
    for legs, project in replicas.values_list("legs", "checkpoint__project_id"):
        waiting += [(f"replicate.{h}", h, project) for h, state in legs.items() if state != "done"]
    found: dict[str, dict] = {}
    for queue, host, project in waiting:
        if not host or live.get(queue):
            continue
        entry = found.setdefault(host, {"waiting": 0, "queues": set(), "projects": set()})
        entry["waiting"] += 1
        entry["queues"].add(queue)
        entry["projects"].add(project)
    return found


def alert_stranded(now: datetime | None = None) -> list:
    """One alert per project, host and hour while its parts wait with no worker."""

    now = now or timezone.now()
    flips = []
    for host, entry in stranded_hosts(now=now).items():
        queues = ",".join(sorted(entry["queues"]))
        for project_id in sorted(entry["projects"]):
            flip = alerts.record(
                "host.no_worker",
                f"host.no_worker:{project_id}:{host}:{now:%Y-%m-%dT%H}",
                f"No worker for host {host}: {entry['waiting']} piece(s) of work on "
                f"node-local checkpoints wait on {queues}. Start a worker on {host} with "
                f"-Q {queues} (docs/deployment.md).",
                project_id=project_id,
                data={"host": host, "waiting": entry["waiting"], "queues": sorted(entry["queues"])},
            )
            if flip is not None:
                flips.append(flip)
    return flips
