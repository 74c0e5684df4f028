"""The Celery app. Broker: Redis (REDIS_URL); serializer: JSON; tasks take ids.

Queues, one per kind of work so that slow work cannot starve quick work:
  validate   read the files where the job wrote them, check them
  replicate  stream them to S3 targets
  restore    fetch from a replica and prove it loads
  launch     start a resumed job
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

QUEUES = ("validate", "replicate", "restore", "launch")

app = Celery("lifeboat")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [Queue(name) for name in QUEUES]
app.conf.task_routes = {
    "workers.validate.*": {"queue": "validate"},
    "workers.sweeper.*": {"queue": "validate"},
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
}
app.conf.imports = ("workers.validate", "workers.sweeper")
