"""The base of every Lifeboat task: a failure that passes on its own is tried again.

A deadlock victim, a database connection cut mid-task, a broker that did not answer or
S3 asking to slow down (webapp/domain/transient.py says which) used to end the task
with its message acknowledged: the work was dropped, and only validation had a sweeper
to find it again. Now the task is published again with a growing delay, up to
TASK_TRANSIENT_RETRIES times; tasks take ids and are safe to run twice. Whatever is still
owed after that (or after a retry that could not be published) is found from the
database by the sweeper (webapp/domain/repair.py). Permanent errors are the task's own
to record (a failed replica, an `error` validation) and are raised as before.
"""

from __future__ import annotations

import logging

from celery import Task
from celery.exceptions import Retry
from django.conf import settings
from django.db import close_old_connections

from webapp.domain.transient import backoff_s, is_transient

log = logging.getLogger(__name__)


class RetryTransient(Task):
    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except Retry:
            raise
        except Exception as exc:
            if self.request.called_directly or not is_transient(exc):
                raise
            retries = self.request.retries or 0
            limit = settings.TASK_TRANSIENT_RETRIES
            if retries >= limit:
                log.error("%s%s: %s; given up after %d tries", self.name, list(args), exc, limit)
                raise
            # A connection the database cut is unusable: the next try opens a new one.
            close_old_connections()
            delay = backoff_s(retries, cap=settings.TASK_RETRY_MAX_S)
            log.warning(
                "%s%s: %s: %s; tried again in %.1f s (%d of %d)",
                self.name, list(args), type(exc).__name__, str(exc).splitlines()[0][:300],
                delay, retries + 1, limit,
            )  # fmt: skip
            raise self.retry(exc=exc, countdown=delay, max_retries=limit) from None
