"""The sweeper: work the database says is owed and nobody is doing, sent again.

The database is the truth; the broker can lose a message (a publish while Redis was
down, a Redis restarted without persistence), and a worker can die with work it had
taken (SIGKILL, a lost node). Each stage names the work it is owed in one function, next
to its own code:

    validate   webapp/domain/validation/owed.py   checks never sent, lost, or whose
                                                   worker's lease lapsed
    replicate  webapp/domain/replication/owed.py  copies pending or uploading past their
                                                   lease; verified checkpoints missing a
                                                   copy their targets' policies ask for
    retention  webapp/domain/retention/owed.py    deletions a worker left half done
    restore    webapp/domain/recovery/owed.py     restore tests queued or running too long
    launch     webapp/domain/recovery/owed.py     resumes never launched, not followed,
                                                   or stuck while being prepared

sweep() (Celery beat, every SWEEP_INTERVAL_S) runs them all. Each sends its work again
(every task is idempotent, so a copy too many costs a lookup), and returns what it sent;
each is counted in Redis (`lifeboat_repairs_total{stage}` in /metrics, and per project and
hour for the runs list's problems) and noted on the run's timeline.

"Lost" never means "slow": a message that may still be waiting in a queue behind a
backlog is sent again only once that queue is empty (publish.waiting) or after the
broker's visibility timeout, and work a live worker holds is never sent while its lease
runs.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.utils import timezone

from webapp.domain.models import Event
from webapp.domain.owed_work import Owed
from webapp.domain.recovery import owed as recovery
from webapp.domain.replication import owed as replication
from webapp.domain.retention import owed as retention
from webapp.domain.validation import owed as validation

log = logging.getLogger(__name__)

COUNTS = "lifeboat:repairs"  # hash: stage -> repairs since Redis started
HOURLY = "lifeboat:repairs:{hour}"  # hash: "<project id>:<stage>" -> repairs that hour
KEEP_HOURS = 48


def _stages():
    return (
        validation.resend,
        replication.resend,
        replication.request_missing,
        retention.resend,
        recovery.resend_restore_tests,
        recovery.resend_resumes,
    )


def sweep(now: datetime | None = None, limit: int = 1000) -> list[Owed]:
    """Every stage's owed work, sent again; one stage's failure does not stop the rest."""
    now = now or timezone.now()
    done: list[Owed] = []
    for stage in _stages():
        try:
            done += stage(now, limit)
        except Exception:  # noqa: BLE001 (the next sweep tries again)
            log.exception("sweep: %s failed", stage.__module__ + "." + stage.__name__)
    if done:
        _note(done, now)
    return done


def _note(done: list[Owed], now: datetime) -> None:
    for owed in done:
        log.warning("sweep: %s (%s)", owed.what, owed.stage)
        Event.record(
            "repair.resent",
            project=owed.project_id,
            run=owed.run_id,
            actor="system:sweeper",
            message=owed.what,
            data={"stage": owed.stage, "checkpoint": owed.checkpoint_id},
            time=now,
        )
    try:
        client = _redis()
        hour = HOURLY.format(hour=now.strftime("%Y%m%d%H"))
        with client.pipeline() as pipe:
            for owed in done:
                pipe.hincrby(COUNTS, owed.stage, 1)
                pipe.hincrby(hour, f"{owed.project_id}:{owed.stage}", 1)
            pipe.expire(hour, KEEP_HOURS * 3600)
            pipe.execute()
    except Exception as exc:  # noqa: BLE001 (counts are for people; the work is sent)
        log.warning("sweep: could not count %d repairs: %s", len(done), exc)


def _redis():
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)


def totals() -> dict[str, int]:
    """Repairs by stage since Redis started (a Prometheus counter: it may reset)."""
    return {k.decode(): int(v) for k, v in _redis().hgetall(COUNTS).items()}


def recent(project_id: int, now: datetime | None = None) -> dict[str, int]:
    """This project's repairs by stage over the last hour and the one before."""
    now = now or timezone.now()
    counts: dict[str, int] = {}
    try:
        client = _redis()
        for hour in (now, now - timedelta(hours=1)):
            for key, value in client.hgetall(HOURLY.format(hour=hour.strftime("%Y%m%d%H"))).items():
                project, _, stage = key.decode().partition(":")
                if project == str(project_id):
                    counts[stage] = counts.get(stage, 0) + int(value)
    except Exception:  # noqa: BLE001 (no counts is no problem shown)
        return {}
    return counts
