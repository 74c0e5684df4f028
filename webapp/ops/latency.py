"""API request latency, shared by every gunicorn worker through Redis.

Each web process answers only its own requests, and Prometheus scrapes one of them at a
time, so the histogram lives in Redis, added to from a small buffer in each process at
most every LATENCY_FLUSH_MS. If Redis is away the request is answered anyway and its time is not
counted: metrics must never cost an event.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from django.conf import settings

log = logging.getLogger(__name__)

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
KEY = "lifeboat:metrics:latency"
_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=0.2, socket_connect_timeout=0.2
        )
    return _client


# Counts of this process not yet in Redis: {field: increment}. Flushed at most every
# LATENCY_FLUSH_MS, by the request that finds the buffer old enough: one Redis
# round trip per request cost as much CPU as a tenth of a single-event ingest, and on a
# busy server one a second is plenty. A process that dies loses at most that much.
_pending: dict[str, float] = {}
_pending_lock = threading.Lock()
_last_flush = 0.0


def record(route: str, method: str, seconds: float) -> None:
    global _last_flush
    label = f"{method} {route}"
    bucket = next((str(b) for b in BUCKETS if seconds <= b), "+Inf")
    now = time.monotonic()
    with _pending_lock:
        count_key, sum_key = f"{label}|{bucket}", f"{label}|sum"
        _pending[count_key] = _pending.get(count_key, 0) + 1
        _pending[sum_key] = _pending.get(sum_key, 0.0) + seconds
        if (now - _last_flush) * 1000 < settings.LATENCY_FLUSH_MS:
            return
        batch = dict(_pending)
        _pending.clear()
        _last_flush = now
    try:
        pipe = client().pipeline(transaction=False)
        for key, value in batch.items():
            if key.endswith("|sum"):
                pipe.hincrbyfloat(KEY, key, value)
            else:
                pipe.hincrby(KEY, key, int(value))
        pipe.execute()
    except redis.RedisError as exc:
        log.debug("latency not recorded: %s", exc)


def histograms() -> dict[str, dict[str, float]]:
    """{label: {bucket or 'sum': value}} as stored (buckets not cumulative)."""
    raw = client().hgetall(KEY)
    out: dict[str, dict[str, float]] = {}
    for field, value in raw.items():
        label, _, bucket = field.decode().rpartition("|")
        out.setdefault(label, {})[bucket] = float(value)
    return out


class LatencyMiddleware:
    """Times every /api/ request by its route pattern (not its path: bounded labels)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith("/api/"):
            return self.get_response(request)
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None else "unmatched"
        record(route, request.method, time.perf_counter() - started)
        return response
