"""Celery tasks published by name: the web side never imports workers/ (that package
imports this one, and an arrow each way was a 15-module import cycle).

The queues and routes live here, once: workers/celery.py builds the worker's app from
them, and a web process that has no app of its own gets a publishing one with the same
broker (Django's CELERY_* settings) and the same routes, so a task sent by name lands on
the queue its module's worker listens on.

Task names are "workers.<module>.<function>"; the functions that call send() name
theirs in one place each (test_import_graph.py checks that nothing imports workers)."""

from __future__ import annotations

import base64
import functools
import json
from contextlib import AbstractContextManager
from typing import cast

import redis
from celery import Celery, current_app
from celery.canvas import Signature
from django.conf import settings
from django.db import transaction
from kombu import Queue

QUEUES = ("validate", "replicate", "restore", "gpu", "launch", "alerts")

ROUTES = {
    "workers.validate.*": {"queue": "validate"},
    # The sweeper only reads rows and publishes: never behind a 100 GB validation.
    "workers.sweeper.*": {"queue": "alerts"},
    "workers.replicate.*": {"queue": "replicate"},
    # Restore tests are sent to `gpu` or `restore` explicitly (restore_test.enqueue).
    "workers.restore.*": {"queue": "restore"},
    # Resumes go to `launch`, or `launch.<host>` for a pinned profile (resume.queue_for).
    "workers.launch.*": {"queue": "launch"},
    # Quick and urgent: never behind a 100 GB validation.
    "workers.alerts.*": {"queue": "alerts"},
    # Bounded passes (GOODPUT_REFRESH_MAX_RUNS runs), reading rows: beside the alerts.
    "workers.analytics.*": {"queue": "alerts"},
    # Retention deletes local copies: it runs where the training file system is seen.
    "workers.retention.*": {"queue": "validate"},
}

APP_NAME = "lifeboat"


def configure(app: Celery) -> Celery:
    """Broker and serializers from Django's settings, queues and routes from here."""
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.task_queues = [Queue(name) for name in QUEUES]
    app.conf.task_routes = ROUTES
    return app


@functools.cache
def _publisher() -> Celery:
    return configure(Celery(APP_NAME, set_as_current=False))


def app() -> Celery:
    """The worker's app inside a worker (or wherever workers/ was imported), else this
    process's publishing app."""
    current = current_app._get_current_object()
    return current if current.main == APP_NAME else _publisher()


def send(name: str, args=(), kwargs=None, **options):
    """Publish task `name` now; raises what the broker raises."""
    return app().send_task(name, args=list(args), kwargs=kwargs or {}, **options)


def signature(name: str, args=(), kwargs=None, **options) -> Signature:
    return app().signature(name, args=list(args), kwargs=kwargs or {}, **options)


def after_commit(name: str, args=(), kwargs=None, **options) -> None:
    """Publish once the caller's transaction commits (at once outside one)."""
    transaction.on_commit(lambda: send(name, args, kwargs, **options))


def producer() -> AbstractContextManager:
    """One broker connection for many send(..., producer=p) calls."""
    return app().producer_or_acquire()


def waiting(queue: str) -> int | None:
    """Messages waiting on `queue` (not those a worker has taken), or None when the
    broker does not answer. With a Redis broker a queue is a list of that name."""
    try:
        client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2)
        return int(client.llen(queue))
    except redis.RedisError:
        return None


def taken_since(queue: str, since: float) -> list[tuple[str, list]]:
    """Tasks a worker took from `queue` at or after `since` (a Unix time) and has not
    finished: with acks_late a Redis broker keeps each in kombu's `unacked` hash, by
    delivery time in `unacked_index`, until the task ends. As (task name, args); [] when
    the broker does not answer, or for a message this cannot read."""
    try:
        client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2)
        # redis-py's synchronous client answers lists (its types also name its async one's).
        tags = cast(list[bytes], client.zrangebyscore("unacked_index", since, "+inf"))
        raws = cast(list[bytes | None], client.hmget("unacked", tags)) if tags else []
    except redis.RedisError:
        return []
    tasks = []
    for raw in raws:
        if raw is None:  # acknowledged since the index was read
            continue
        try:
            payload, _exchange, routing_key = json.loads(raw)
            if routing_key != queue:
                continue
            body = payload["body"]
            if payload["properties"].get("body_encoding") == "base64":
                body = base64.b64decode(body)
            args = json.loads(body)[0]
            tasks.append((str(payload["headers"]["task"]), list(args)))
        except (TypeError, ValueError, KeyError, IndexError, AttributeError):
            continue
    return tasks
