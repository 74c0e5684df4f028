"""GET /metrics in Prometheus' text format (docs/deployment.md lists every series).

Gauges are read from PostgreSQL and Redis when Prometheus scrapes, so they are right
whichever process answers; every query here uses an index or scans only what is
unsettled or running.
"""

from __future__ import annotations

import hmac

import redis
from django.conf import settings
from django.db.models import Count, Max, Min, Sum
from django.http import HttpResponse, JsonResponse
from django.utils import timezone

from webapp.ops import latency

QUEUES = ("validate", "replicate", "restore", "launch", "gpu")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


class Exposition:
    def __init__(self):
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels: str) -> None:
        # Whole numbers (bytes, counts) exactly; measurements to six figures.
        shown = str(value) if isinstance(value, int) else f"{value:.6g}"
        self.lines.append(f"{name}{_labels(**labels)} {shown}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def collect() -> str:
    # One `now` for every age in a scrape, so the ages agree with each other.
    now = timezone.now()
    out = Exposition()
    _checkpoints(out)
    _queues(out)
    _lags(out, now)
    _run_ages(out, now)
    _restores(out)
    _goodput(out)
    _storage(out)
    _repairs(out)
    _latency(out)
    return out.text()


def _repairs(out: Exposition) -> None:
    from webapp.domain import repair

    out.family(
        "lifeboat_repairs_total",
        "counter",
        "Work the sweeper found owed and nobody doing, and sent again, by stage.",
    )
    try:
        counts = repair.totals()
    except redis.RedisError:
        counts = {}
    for stage in ("validate", "replicate", "retention", "restore", "launch"):
        out.sample("lifeboat_repairs_total", counts.get(stage, 0), stage=stage)


def _checkpoints(out: Exposition) -> None:
    from webapp.domain.models import Checkpoint

    out.family("lifeboat_checkpoints", "gauge", "Checkpoints by status.")
    for row in Checkpoint.objects.values("status").annotate(n=Count("pk")).order_by("status"):
        out.sample("lifeboat_checkpoints", row["n"], status=row["status"])


def _queues(out: Exposition) -> None:
    """Queue depths, and whether the broker answered at all: a broker that is down
    shows as broker_up 0 rather than failing the whole scrape."""
    out.family("lifeboat_queue_depth", "gauge", "Tasks waiting in each Celery queue.")
    try:
        broker = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=1)
        for queue in QUEUES:
            out.sample("lifeboat_queue_depth", broker.llen(queue), queue=queue)
        broker_up = 1
    except redis.RedisError:
        broker_up = 0
    out.family("lifeboat_broker_up", "gauge", "1 if the Celery broker answered.")
    out.sample("lifeboat_broker_up", broker_up)


def _lags(out: Exposition, now) -> None:
    from webapp.domain.models import Checkpoint, Replica

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
        metric = f"lifeboat_{name}_lag_seconds"
        out.family(metric, "gauge", f"Age of the oldest {what}; 0 when none.")
        # Both filters match a partial index on the unsettled rows (see the models).
        oldest = model.objects.filter(status__in=statuses).aggregate(t=Min("created_at"))["t"]
        out.sample(metric, (now - oldest).total_seconds() if oldest else 0)


def _run_ages(out: Exposition, now) -> None:
    from webapp.domain.models import Run

    out.family(
        "lifeboat_run_last_checkpoint_age_seconds",
        "gauge",
        "Seconds since the last checkpoint of each running run (since its start if none).",
    )
    running = (
        Run.objects.filter(status="running")
        .annotate(last=Max("checkpoints__saved_at"))
        .values_list("project__slug", "key", "last", "started_at", "created_at")
    )
    for slug, key, last, started, created in running:
        since = last or started or created
        out.sample(
            "lifeboat_run_last_checkpoint_age_seconds",
            (now - since).total_seconds(),
            project=slug,
            run=key,
        )


def _restores(out: Exposition) -> None:
    from webapp.domain.models import Validation

    out.family(
        "lifeboat_restore_seconds",
        "gauge",
        "Measured time to recover: the latest passed restore test of each run.",
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
            out.sample("lifeboat_restore_seconds", total, project=slug, run=key)


def _goodput(out: Exposition) -> None:
    """Each project's goodput from the rows the workers keep (health/goodput_store.py):
    a sum per project, whatever the number of runs behind it."""
    from webapp.domain.health.goodput import CAUSES
    from webapp.domain.models import RunGoodput

    names = ("wall_seconds", "productive_seconds", "gpu_seconds", "productive_gpu_seconds")
    rows = (
        RunGoodput.objects.values("project__slug")
        .annotate(**{n: Sum(n) for n in (*names, *CAUSES)})
        .order_by("project__slug")
    )
    families = (
        ("lifeboat_goodput_ratio", "Kept progress over elapsed time of the project's runs."),
        ("lifeboat_gpu_hours", "GPU-hours the project's runs held (goodput ledger)."),
        ("lifeboat_productive_gpu_hours", "Of those, GPU-hours that became kept progress."),
        ("lifeboat_badput_seconds", "Run time that did not become kept progress, by cause."),
    )
    for name, help_text in families:
        out.family(name, "gauge", help_text)
    for row in rows:
        slug = row["project__slug"]
        if row["wall_seconds"]:
            ratio = row["productive_seconds"] / row["wall_seconds"]
            out.sample("lifeboat_goodput_ratio", ratio, project=slug)
        out.sample("lifeboat_gpu_hours", row["gpu_seconds"] / 3600, project=slug)
        out.sample(
            "lifeboat_productive_gpu_hours", row["productive_gpu_seconds"] / 3600, project=slug
        )
        for cause in CAUSES:
            out.sample("lifeboat_badput_seconds", row[cause], cause=cause, project=slug)


def _storage(out: Exposition) -> None:
    """The storage ledger's newest history row of each target and of the local copies
    (webapp/domain/replication/ledger.py, written every STORAGE_LEDGER_S): one query,
    however many objects are stored."""
    from webapp.domain.models import StorageSnapshot
    from webapp.domain.replication.ledger import GB

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
    families = (
        ("lifeboat_storage_stored_bytes", "Bytes stored, each object once."),
        ("lifeboat_storage_logical_bytes", "Bytes the copies would take, not deduplicated."),
        ("lifeboat_storage_objects", "Objects stored (files, where=local)."),
        ("lifeboat_storage_would_free_bytes", "Bytes the retention policies would free now."),
        ("lifeboat_storage_monthly_cost", "What the stored bytes cost a month."),
    )
    for name, help_text in families:
        out.family(name, "gauge", help_text)
    for row in sorted(rows, key=lambda r: (r["project__slug"], r["target__name"] or "")):
        if latest.get((row["project_id"], row["target_id"])) != row["taken_at"]:
            continue
        labels = {
            "project": row["project__slug"],
            "target": row["target__name"] or "",
            "where": "target" if row["target_id"] else "local",
        }
        out.sample("lifeboat_storage_stored_bytes", row["stored_bytes"], **labels)
        out.sample("lifeboat_storage_logical_bytes", row["logical_bytes"], **labels)
        out.sample("lifeboat_storage_objects", row["stored_objects"], **labels)
        out.sample("lifeboat_storage_would_free_bytes", row["would_free_bytes"], **labels)
        price = row["target__gb_month_price"]
        if price is not None:
            cost = row["stored_bytes"] / GB * price
            out.sample("lifeboat_storage_monthly_cost", cost, **labels)


def _latency(out: Exposition) -> None:
    """Prometheus histograms are cumulative: each bucket counts every request at or
    under its bound, so the stored per-bucket counts are summed as they are written."""
    out.family(
        "lifeboat_http_request_duration_seconds",
        "histogram",
        "API request latency by route, all web processes.",
    )
    try:
        stored = latency.histograms()
    except redis.RedisError:
        stored = {}
    for label in sorted(stored):
        values = stored[label]
        method, _, route = label.partition(" ")
        running_total = 0.0
        for bucket in [*map(str, latency.BUCKETS), "+Inf"]:
            running_total += values.get(bucket, 0.0)
            out.sample(
                "lifeboat_http_request_duration_seconds_bucket",
                running_total,
                method=method,
                route=route,
                le=bucket,
            )
        out.sample(
            "lifeboat_http_request_duration_seconds_sum",
            values.get("sum", 0.0),
            method=method,
            route=route,
        )
        out.sample(
            "lifeboat_http_request_duration_seconds_count",
            running_total,
            method=method,
            route=route,
        )


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
    return HttpResponse(collect(), content_type="text/plain; version=0.0.4; charset=utf-8")
