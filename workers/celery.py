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
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

QUEUES = ("validate", "replicate", "restore", "gpu", "launch", "alerts")

app = Celery("lifeboat")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Django's LOGGING (structured, with run and checkpoint ids) rather than Celery's own.
app.conf.worker_hijack_root_logger = False
app.conf.task_queues = [Queue(name) for name in QUEUES]
app.conf.task_routes = {
    "workers.validate.*": {"queue": "validate"},
    "workers.sweeper.*": {"queue": "validate"},
    "workers.replicate.*": {"queue": "replicate"},
    # Restore tests are sent to `gpu` or `restore` explicitly (restore_test.enqueue).
    "workers.restore.*": {"queue": "restore"},
    # Resumes go to `launch`, or `launch.<host>` for a pinned profile (resume.queue_for).
    "workers.launch.*": {"queue": "launch"},
    # Quick and urgent: never behind a 100 GB validation.
    "workers.alerts.*": {"queue": "alerts"},
    # Retention deletes local copies: it runs where the training file system is seen.
    "workers.retention.*": {"queue": "validate"},
}
app.conf.beat_schedule = {
    "requeue-unvalidated-checkpoints": {
        "task": "workers.sweeper.requeue_unvalidated",
        "schedule": 60.0,
    },
    "revalidate-pinned-and-latest": {
        "task": "workers.sweeper.revalidate_stale",
        "schedule": 3600.0,
    },
    "requeue-unfinished-replicas": {
        "task": "workers.replicate.requeue_unfinished",
        "schedule": 60.0,
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
)
