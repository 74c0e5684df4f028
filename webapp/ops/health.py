"""GET /healthz: is this web process able to do its job? For load balancers and the
container health checks: 200 when the database and the broker answer, 503 otherwise,
naming what failed. Anyone may ask, so it says "ok" or "unavailable" per dependency and
nothing more: the exception (host names, user names, versions) goes to the log."""

from __future__ import annotations

import logging

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse

log = logging.getLogger(__name__)


def healthz(request):
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception:  # noqa: BLE001 (reported, not raised)
        log.exception("healthz: the database does not answer")
        checks["database"] = "unavailable"
    try:
        redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=1).ping()
        checks["broker"] = "ok"
    except redis.RedisError:
        log.exception("healthz: the broker does not answer")
        checks["broker"] = "unavailable"
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unhealthy", **checks}, status=200 if healthy else 503
    )
