"""The Celery app. Broker: Redis (REDIS_URL); serializer: JSON; tasks take ids.

Queues, one per kind of work so that slow work cannot starve quick work:
  validate   read the files where the job wrote them, check them
  replicate  stream them to S3 targets
  restore    fetch from a replica and prove it loads (gpu: the same, on a GPU host)
  launch     start a resumed job
  alerts     find overdue runs and bad news, and tell people
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

from django.conf import settings  # noqa: E402

from webapp.domain.publish import APP_NAME, QUEUES, configure  # noqa: E402

__all__ = ["QUEUES", "app"]

# The queues and routes are webapp.domain.publish's: the web side publishes by task name
# with the very same routes, without importing this package.
# Every task retries what passes on its own (a deadlock, a lost connection): workers/retrying.py.
app = configure(Celery(APP_NAME, task_cls="workers.retrying:RetryTransient"))
# Django's LOGGING (structured, with run and checkpoint ids) rather than Celery's own.
app.conf.worker_hijack_root_logger = False
app.conf.beat_schedule = {
    # Work the database says is owed and nobody is doing, sent again (repair.py).
    "sweep": {
        "task": "workers.sweeper.sweep",
        "schedule": float(settings.SWEEP_INTERVAL_S),
    },
    "revalidate-pinned-and-latest": {
        "task": "workers.sweeper.revalidate_stale",
        "schedule": 3600.0,
    },
    "schedule-restore-tests": {
        "task": "workers.restore.schedule",
        "schedule": 3600.0,
    },
    "alerts-check": {
        "task": "workers.alerts.check",
        "schedule": 60.0,
    },
    "abort-abandoned-uploads": {
        "task": "workers.replicate.abort_abandoned_uploads",
        "schedule": 3600.0,
    },
    "refresh-goodput": {
        "task": "workers.analytics.refresh_goodput",
        "schedule": float(settings.GOODPUT_REFRESH_S),
    },
    # Objects no record accounts for, listed and alerted on (retention/orphans.py).
    "audit-storage": {
        "task": "workers.replicate.audit_storage",
        "schedule": float(settings.STORAGE_AUDIT_S),
    },
    # The storage ledger's history: the chart of stored bytes (replication/ledger.py).
    "measure-storage": {
        "task": "workers.analytics.measure_storage",
        "schedule": float(settings.STORAGE_LEDGER_S),
    },
    "apply-retention": {
        "task": "workers.retention.apply_all",
        "schedule": 3600.0,
    },
}
from webapp.ops.logs import connect_celery_signals  # noqa: E402

connect_celery_signals()

app.conf.imports = (
    "workers.validate",
    "workers.sweeper",
    "workers.replicate",
    "workers.retention",
    "workers.alerts",
    "workers.restore",
    "workers.launch",
    "workers.analytics",
)
