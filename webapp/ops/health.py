"""GET /healthz: is this web process able to do its job? For load balancers and the
container health checks: 200 when the database and the broker answer, 503 otherwise,
with what failed."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse


def healthz(request):
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 (reported, not raised)
        checks["database"] = f"error: {exc}"
    try:
        redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=1).ping()
        checks["broker"] = "ok"
    except redis.RedisError as exc:
        checks["broker"] = f"error: {exc}"
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unhealthy", **checks}, status=200 if healthy else 503
    )
