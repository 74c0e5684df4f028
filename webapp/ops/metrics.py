"""GET /metrics in Prometheus' text format (docs/deployment.md lists every series).

Every series is read from PostgreSQL and Redis when Prometheus scrapes, by one
prometheus_client Collector, so it is right whichever process (or host) answers: the
gauges from the rows, the repair counter and the API latency histogram from what every
web process adds up in Redis. Nothing is counted in this process, so the library's
multiprocess mode (PROMETHEUS_MULTIPROC_DIR) has nothing to do. Every query here uses an
index or scans only what is unsettled or running.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

import redis
from django.conf import settings
from django.db.models import Count, Max, Min, Sum
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, exposition, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from webapp.domain import repair
from webapp.domain.health.goodput import CAUSES
from webapp.domain.models import Checkpoint, Replica, Run, RunGoodput, StorageSnapshot, Validation
from webapp.domain.replication.ledger import GB
from webapp.ops import latency

QUEUES = ("validate", "replicate", "restore", "launch", "gpu")
# The classic text format (0.0.4), which every Prometheus reads: from 0.22 on, the
# library's CONTENT_TYPE_LATEST names version 1.0.0 (UTF-8 names), which ours do not need.
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)


class LifeboatCollector(Collector):
    """Every family, read fresh from the database and Redis at each scrape: the collector
    keeps nothing between scrapes, so no value outlives the rows it was read from."""

    def collect(self) -> Iterator[Metric]:
        # One `now` for every age in a scrape, so the ages agree with each other.
        now = timezone.now()
        yield from _checkpoints()
        yield from _queues()
        yield from _lags(now)
        yield from _run_ages(now)
        yield from _restores()
        yield from _goodput()
        yield from _storage()
        yield from _repairs()
        yield from _latency()


# Created once: the collector holds no state, and a registry of its own keeps the
# library's default process and platform collectors out of the scrape.
REGISTRY = CollectorRegistry()
REGISTRY.register(LifeboatCollector())


def collect() -> str:
    """The exposition Prometheus gets (text format 0.0.4)."""
    return generate_latest(REGISTRY).decode()


def _repairs() -> Iterator[Metric]:

    family = CounterMetricFamily(
        "lifeboat_repairs_total",
        "Work the sweeper found owed and nobody doing, and sent again, by stage.",
        labels=["stage"],
    )
    try:
        counts = repair.totals()
    except redis.RedisError:
        counts = {}
    for stage in ("validate", "replicate", "retention", "restore", "launch"):
        family.add_metric([stage], counts.get(stage, 0))
    yield family


def _checkpoints() -> Iterator[Metric]:

    family = GaugeMetricFamily("lifeboat_checkpoints", "Checkpoints by status.", labels=["status"])
    for row in Checkpoint.objects.values("status").annotate(n=Count("pk")).order_by("status"):
        family.add_metric([row["status"]], row["n"])
    yield family


def _queues() -> Iterator[Metric]:
    """Queue depths, and whether the broker answered at all: a broker that is down
    shows as broker_up 0 rather than failing the whole scrape."""
    depth = GaugeMetricFamily(
        "lifeboat_queue_depth", "Tasks waiting in each Celery queue.", labels=["queue"]
    )
    try:
        broker = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=1)
        for queue in QUEUES:
            depth.add_metric([queue], broker.llen(queue))
        broker_up = 1
    except redis.RedisError:
        broker_up = 0
    yield depth
    yield GaugeMetricFamily(
        "lifeboat_broker_up", "1 if the Celery broker answered.", value=broker_up
    )


def _lags(now) -> Iterator[Metric]:

    lags = (
        (
            "validation",
            Checkpoint,
            ["reported", "verifying"],
            "checkpoint waiting for (or in) validation",
        ),
        ("replication", Replica, ["pending", "uploading"], "replica waiting for (or in) upload"),
    )
    for name, model, statuses, what in lags:
        # Both filters match a partial index on the unsettled rows (see the models).
        oldest = model.objects.filter(status__in=statuses).aggregate(t=Min("created_at"))["t"]
        yield GaugeMetricFamily(
            f"lifeboat_{name}_lag_seconds",
            f"Age of the oldest {what}; 0 when none.",
            value=(now - oldest).total_seconds() if oldest else 0,
        )


def _run_ages(now) -> Iterator[Metric]:

    family = GaugeMetricFamily(
        "lifeboat_run_last_checkpoint_age_seconds",
        "Seconds since the last checkpoint of each running run (since its start if none).",
        labels=["project", "run"],
    )
    running = (
        Run.objects.filter(status="running")
        .annotate(last=Max("checkpoints__saved_at"))
        .values_list("project__slug", "key", "last", "started_at", "created_at")
    )
    for slug, key, last, started, created in running:
        since = last or started or created
        family.add_metric([slug, key], (now - since).total_seconds())
    yield family


def _restores() -> Iterator[Metric]:

    family = GaugeMetricFamily(
        "lifeboat_restore_seconds",
        "Measured time to recover: the latest passed restore test of each run.",
        labels=["project", "run"],
    )
    # Newest first: the first row seen for a run is its latest passed restore test.
    seen = set()
    restores = (
        Validation.objects.filter(kind="restore", status="passed")
        .order_by("-finished_at")
        .values_list("checkpoint__run__project__slug", "checkpoint__run__key", "timings")[:1000]
    )
    for slug, key, timings in restores:
        if (slug, key) in seen:
            continue
        seen.add((slug, key))
        total = (timings or {}).get("total_s")
        if isinstance(total, int | float):
            family.add_metric([slug, key], total)
    yield family


def _goodput() -> Iterator[Metric]:
    """Each project's goodput from the rows the workers keep (health/goodput_store.py):
    a sum per project, whatever the number of runs behind it."""

    names = ("wall_seconds", "productive_seconds", "gpu_seconds", "productive_gpu_seconds")
    rows = (
        RunGoodput.objects.values("project__slug")
        .annotate(**{n: Sum(n) for n in (*names, *CAUSES)})
        .order_by("project__slug")
    )
    project = ["project"]
    ratio = GaugeMetricFamily(
        "lifeboat_goodput_ratio",
        "Kept progress over elapsed time of the project's runs.",
        labels=project,
    )
    gpu = GaugeMetricFamily(
        "lifeboat_gpu_hours", "GPU-hours the project's runs held (goodput ledger).", labels=project
    )
    productive = GaugeMetricFamily(
        "lifeboat_productive_gpu_hours",
        "Of those, GPU-hours that became kept progress.",
        labels=project,
    )
    badput = GaugeMetricFamily(
        "lifeboat_badput_seconds",
        "Run time that did not become kept progress, by cause.",
        labels=["cause", "project"],
    )
    for row in rows:
        slug = row["project__slug"]
        if row["wall_seconds"]:
            ratio.add_metric([slug], row["productive_seconds"] / row["wall_seconds"])
        gpu.add_metric([slug], row["gpu_seconds"] / 3600)
        productive.add_metric([slug], row["productive_gpu_seconds"] / 3600)
        for cause in CAUSES:
            badput.add_metric([cause, slug], row[cause])
    yield from (ratio, gpu, productive, badput)


def _storage() -> Iterator[Metric]:
    """The storage ledger's newest history row of each target and of the local copies
    (webapp/domain/replication/ledger.py, written every STORAGE_LEDGER_S): one query,
    however many objects are stored."""

    newest = (
        StorageSnapshot.objects.values("project_id", "target_id")
        .annotate(at=Max("taken_at"))
        .order_by()
    )
    latest = {(row["project_id"], row["target_id"]): row["at"] for row in newest}
    rows = StorageSnapshot.objects.filter(taken_at__in=set(latest.values())).values(
        "project_id", "project__slug", "target_id", "target__name", "target__gb_month_price",
        "taken_at", "stored_bytes", "stored_objects", "logical_bytes", "would_free_bytes",
    )  # fmt: skip
    labels = ["project", "target", "where"]
    stored, logical, objects, would_free, cost = (
        GaugeMetricFamily(name, help_text, labels=labels)
        for name, help_text in (
            ("lifeboat_storage_stored_bytes", "Bytes stored, each object once."),
            ("lifeboat_storage_logical_bytes", "Bytes the copies would take, not deduplicated."),
            ("lifeboat_storage_objects", "Objects stored (files, where=local)."),
            ("lifeboat_storage_would_free_bytes", "Bytes the retention policies would free now."),
            ("lifeboat_storage_monthly_cost", "What the stored bytes cost a month."),
        )
    )
    for row in sorted(rows, key=lambda r: (r["project__slug"], r["target__name"] or "")):
        if latest.get((row["project_id"], row["target_id"])) != row["taken_at"]:
            continue
        values = [
            row["project__slug"],
            row["target__name"] or "",
            "target" if row["target_id"] else "local",
        ]
        stored.add_metric(values, row["stored_bytes"])
        logical.add_metric(values, row["logical_bytes"])
        objects.add_metric(values, row["stored_objects"])
        would_free.add_metric(values, row["would_free_bytes"])
        price = row["target__gb_month_price"]
        if price is not None:
            cost.add_metric(values, row["stored_bytes"] / GB * price)
    yield from (stored, logical, objects, would_free, cost)


def _latency() -> Iterator[Metric]:
    """Prometheus histograms are cumulative: each bucket counts every request at or
    under its bound, so the stored per-bucket counts are summed as they are written."""
    family = HistogramMetricFamily(
        "lifeboat_http_request_duration_seconds",
        "API request latency by route, all web processes.",
        labels=["method", "route"],
    )
    try:
        stored = latency.histograms()
    except redis.RedisError:
        stored = {}
    for label in sorted(stored):
        values = stored[label]
        method, _, route = label.partition(" ")
        running_total = 0.0
        buckets = []
        for bucket in [*map(str, latency.BUCKETS), "+Inf"]:
            running_total += values.get(bucket, 0.0)
            buckets.append((bucket, running_total))
        family.add_metric([method, route], buckets, values.get("sum", 0.0))
    yield family


def metrics_view(request):
    """Wants `Authorization: Bearer <METRICS_TOKEN>` (Prometheus' `authorization`), since
    the series name every project's running runs. Open to anyone only when the
    deployment says so (METRICS_PUBLIC=1); with neither, every caller gets 401."""
    expected = settings.METRICS_TOKEN
    if not settings.METRICS_PUBLIC:
        header = request.headers.get("Authorization", "")
        given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
            return JsonResponse(
                {
                    "error": "/metrics needs the METRICS_TOKEN as a bearer token"
                    if expected
                    else "/metrics is closed: set METRICS_TOKEN (or METRICS_PUBLIC=1)"
                },
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
            )
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE)
