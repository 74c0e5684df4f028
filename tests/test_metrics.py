"""GET /metrics: what Prometheus scrapes, from the real database and Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.events import T0, event, saved
from tests.support.metrics import sample

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_shows_checkpoints_queues_lag_and_api_latency(client, api, token, queues, settings):
    settings.METRICS_TOKEN = "scrape-token"
    body = {
        "events": [
            event("run.started", run="r1"),
            saved(run="r1", step=1),
            saved(run="r1", step=2, t=5),
        ]
    }
    assert api.post_events(token, body).status_code == 202
    for _ in range(3):
        assert api.get(token, "/runs").status_code == 200

    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    assert sample(text, "lifeboat_checkpoints", status="reported") == 2
    # One dispatch message for the batch of two checkpoints.
    assert sample(text, "lifeboat_queue_depth", queue="validate") == 1
    assert sample(text, "lifeboat_broker_up") == 1
    assert sample(text, "lifeboat_validation_lag_seconds") > 0
    age = sample(text, "lifeboat_run_last_checkpoint_age_seconds", project="alpha", run="r1")
    expected = (timezone.now() - (T0 + timedelta(seconds=5))).total_seconds()  # step 2
    assert age == pytest.approx(expected, abs=30)
    runs = {"method": "GET", "route": "api/v1/runs"}
    assert sample(text, "lifeboat_http_request_duration_seconds_count", **runs) == 3
    assert sample(text, "lifeboat_http_request_duration_seconds_bucket", **runs, le="+Inf") == 3
    events = {"method": "POST", "route": "api/v1/events"}
    assert sample(text, "lifeboat_http_request_duration_seconds_count", **events) == 1


def test_it_wants_the_metrics_token_when_one_is_set(client, settings, queues):
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_healthz_says_what_is_down(client, settings, queues):
    assert client.get("/healthz").json() == {"status": "ok", "database": "ok", "broker": "ok"}
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    answer = client.get("/healthz")
    assert answer.status_code == 503
    assert answer.json() == {"status": "unhealthy", "database": "ok", "broker": "unavailable"}


def test_latency_counts_are_buffered_and_none_is_lost(settings, queues):
    """Each process writes its counts to Redis at most every LATENCY_FLUSH_MS; the
    requests in between are added with the next write, not dropped."""
    from webapp.ops import latency

    latency.client().delete(latency.KEY)
    latency._pending.clear()
    latency._last_flush = 0.0  # long ago: the next request writes
    settings.LATENCY_FLUSH_MS = 60_000
    latency.record("events", "POST", 0.003)  # the first write of this interval
    latency.record("events", "POST", 0.004)
    latency.record("events", "POST", 0.2)
    stored = latency.histograms()["POST events"]
    assert sum(v for k, v in stored.items() if k != "sum") == 1  # two are still buffered

    settings.LATENCY_FLUSH_MS = 0
    latency.record("events", "POST", 0.004)
    stored = latency.histograms()["POST events"]
    assert stored["0.005"] == 3 and stored["0.25"] == 1
    assert stored["sum"] == pytest.approx(0.211)
