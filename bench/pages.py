"""Server time of the dashboard's pages at large history.

Fills a PostgreSQL database of its own (lifeboat_bench_pages, dropped and created again
unless --reuse) with 10,000 runs and 1,000,000 checkpoints -- one run holds 100,000 of
them, with 100,000 metric points and 100,000 timeline events; the others about 90 each
-- then measures, with Django's test Client in this process (no network, no gunicorn),
repeated GETs of:

* the project page (10,000 runs, default sort, first page of 50), sorted by storage used,
  filtered to overdue runs, sorted by checkpoint age (each run's totals come from
  RunStats, which triggers keep: migration 0014),
* the run page of the run with 100,000 checkpoints (table, timeline), its charts (as
  htmx fetches them, and drawn in the page), its checkpoint table as htmx polls it, and
  page 1,000 of that table,
* a checkpoint page (16 files, 5 checks),
* the project's goodput page and its API (by training, host and tag) over the 10,000
  runs' rows, and one training's ledger read from its events (the run page's), after
  timing the workers' pass that writes those rows,

and, as baselines in the same run: a signed-in page that runs `SELECT 1` and renders the
base template (the fixed cost of a request), and Django admin's changelist of the same
runs (what Django offers out of the box).

    .venv/bin/python bench/pages.py                 # fill (25 s quiet, 80 s busy), measure
    .venv/bin/python bench/pages.py --reuse         # measure again on the filled database
    .venv/bin/python bench/pages.py --requests 100  # more samples per page

Target (issue #23): each dashboard page's p95 under 150 ms, or at most twice the admin
changelist's p95 in the same run, whichever is larger. The pages are measured in rounds
(one request of each page per round), so that a loaded machine slows all of them alike.
``--database NAME`` fills (or, with --reuse, migrates and reuses) another database.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DB_NAME = "lifeboat_bench_pages"
RUNS = 10_000
CHECKPOINTS = 1_000_000
BIG_RUN_CHECKPOINTS = 100_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def configure(server: str, database: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="webapp.settings",
        DATABASE_URL=f"{server}/{database}",
        DEBUG="0",  # DEBUG would record every query and slow every request
        SECRET_KEY="bench-pages-not-a-secret",  # noqa: S105
        ALLOWED_HOSTS="testserver",
        SECURE_COOKIES="0",
        LOG_LEVEL="WARNING",
    )


def create_database(server: str, database: str, reuse: bool) -> bool:
    """Returns whether the database must be filled."""
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if exists and reuse:
            return False
        conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
        conn.execute(f'CREATE DATABASE "{database}"')
    return True


def copy_rows(model, columns: list[str], rows) -> int:
    """COPY rows into the model's table; columns not named get the field's default."""
    from django.db import connection

    fields = {f.attname: f for f in model._meta.concrete_fields if not f.primary_key}
    rest = [name for name in fields if name not in columns]
    defaults = [
        fields[name].get_db_prep_save(fields[name].get_default(), connection) for name in rest
    ]
    all_columns = ", ".join(connection.ops.quote_name(fields[c].column) for c in columns + rest)
    n = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor
        with raw.copy(f"COPY {model._meta.db_table} ({all_columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row((*row, *defaults))
                n += 1
    return n


def fill_runs(project) -> list[int]:
    """RUNS runs, the first the big one; returns their ids in key order."""
    from psycopg.types.json import Jsonb

    from webapp.domain.models import Run

    statuses = ["running", "finished", "failed"]
    copy_rows(
        Run,
        ["project_id", "key", "name", "status", "tags", "expected_interval_s", "started_at",
         "last_seen_at", "last_step", "created_at", "config", "last_metrics"],
        (
            (project.pk, f"run-{i:05d}", f"Run {i:05d}", statuses[i % 3] if i else "running",
             Jsonb(["bench", f"group-{i % 10}"]), 1800.0, T0 + timedelta(minutes=i),
             T0 + timedelta(minutes=i, hours=1), 100_000 if i == 0 else 90 * 100,
             T0, Jsonb({}), Jsonb({"loss": 1.0} if i == 0 else {}))
            for i in range(RUNS)
        ),
    )  # fmt: skip
    return list(Run.objects.order_by("key").values_list("pk", flat=True))


def checkpoint_rows(project, run_ids: list[int]):
    """BIG_RUN_CHECKPOINTS checkpoints of the big run (all verified), the rest of
    CHECKPOINTS spread over the other runs (some reported, some corrupt)."""
    from psycopg.types.json import Jsonb

    big_run = run_ids[0]
    per_run = (CHECKPOINTS - BIG_RUN_CHECKPOINTS) // (RUNS - 1)
    spare = (CHECKPOINTS - BIG_RUN_CHECKPOINTS) - per_run * (RUNS - 1)
    kinds = ["verified"] * 18 + ["reported", "corrupt"]
    for index, run_id in enumerate(run_ids):
        count = BIG_RUN_CHECKPOINTS if run_id == big_run else per_run + (1 if index <= spare else 0)
        for s in range(count):
            step = (s + 1) * 100
            saved = T0 + timedelta(seconds=step)
            status = "verified" if run_id == big_run else kinds[s % 20]
            yield (
                project.pk,
                run_id,
                step,
                step // 5000,
                saved,
                f"/data/run/{run_id}/step-{step}",
                "torch",
                2_000_000_000 + (s * 7919) % 50_000_000,
                16,
                10.0 + (s % 13) / 3,
                Jsonb({"loss": 1 / (1 + s)}),
                Jsonb({}),
                status,
                "",
                "",
                False,
                saved if status == "verified" else None,
                saved,
                saved,
            )


def fill_big_run_history(project, big_run: int) -> None:
    """A metric point and a checkpoint.saved event per checkpoint of the big run."""
    from psycopg.types.json import Jsonb

    from webapp.domain.models import Event, MetricPoint

    copy_rows(
        MetricPoint,
        ["run_id", "step", "values", "time"],
        (
            (big_run, s * 100, Jsonb({"loss": 2.0 / (1 + s / 1000) + (s % 97) / 1000}),
             T0 + timedelta(seconds=s * 100))
            for s in range(1, BIG_RUN_CHECKPOINTS + 1)
        ),
    )  # fmt: skip
    copy_rows(
        Event,
        ["project_id", "run_id", "type", "step", "time", "received_at", "actor", "data", "message"],
        (
            (project.pk, big_run, "checkpoint.saved", s * 100, T0 + timedelta(seconds=s * 100),
             T0 + timedelta(seconds=s * 100), "token:bench",
             Jsonb({"location": f"/data/run/{big_run}/step-{s * 100}"}), "")
            for s in range(1, BIG_RUN_CHECKPOINTS + 1)
        ),
    )  # fmt: skip


def fill_target(big_run: int) -> None:
    """16 files and 5 validations on the big run's middle checkpoint, the detail page's."""
    from webapp.domain.models import Checkpoint, CheckpointFile, Validation

    target = Checkpoint.objects.get(run_id=big_run, step=BIG_RUN_CHECKPOINTS * 50)
    CheckpointFile.objects.bulk_create(
        [
            CheckpointFile(checkpoint=target, path=f"model-{i:05d}-of-00016.safetensors",
                           size=125_000_000, sha256=f"{i:064x}")
            for i in range(16)
        ]
    )  # fmt: skip
    Validation.objects.bulk_create(
        [
            Validation(checkpoint=target, kind="integrity", status="passed", bytes_total=2 * 10**9,
                       bytes_done=2 * 10**9, started_at=T0, finished_at=T0 + timedelta(seconds=2),
                       message="every file matches its sha256", timings={"hash_s": 1.9})
            for _ in range(5)
        ]
    )  # fmt: skip


def fill_goodput(project, run_ids: list[int]) -> None:
    """The events a goodput ledger reads, for every run: one attempt of an hour (started,
    two heartbeats, a 20 s save at step 3000, then finished or failed), on one of 64
    hosts, 8 GPUs; two runs in three resumed from the previous run's step-3000 checkpoint,
    so that the 10,000 runs make about 3,300 trainings. Dated over the last 25 days (the
    goodput page shows 30)."""
    from django.db import connection
    from django.utils import timezone
    from psycopg.types.json import Jsonb

    from webapp.domain.models import Checkpoint, Event, Run

    at_3000 = dict(Checkpoint.objects.filter(step=3000).values_list("run_id", "pk"))  # one per run
    start = timezone.now() - timedelta(days=25)
    status = dict(Run.objects.values_list("pk", "status"))
    resumed = {}
    for i, run_id in enumerate(run_ids):
        if i % 3 and i > 1:
            resumed[run_id] = at_3000[run_ids[i - 1]]
    with connection.cursor() as cursor:
        cursor.executemany(
            "UPDATE domain_run SET host = %s, world_size = 8, resumed_from_id = %s WHERE id = %s",
            [
                (f"gpu-{i % 64:02d}", resumed.get(run_id), run_id)
                for i, run_id in enumerate(run_ids)
            ],
        )

    def events():
        for i, run_id in enumerate(run_ids):
            t0 = start + timedelta(minutes=3 * i)
            first = {"resumed_from": resumed[run_id]} if run_id in resumed else {}
            timeline = [("run.started", None, 0, first), ("run.heartbeat", 100, 300, {}),
                        ("checkpoint.saved", 3000, 1200,
                         {"location": f"/data/run/{run_id}/step-3000", "save_seconds": 20.0}),
                        ("run.heartbeat", 4500, 1800, {})]  # fmt: skip
            if status[run_id] != "running":
                end = "run.finished" if status[run_id] == "finished" else "run.failed"
                timeline.append((end, 9000, 3600, {}))
            for type_, step, offset, data in timeline:
                when = t0 + timedelta(seconds=offset)
                yield (project.pk, run_id, type_, step, when, when, "token:bench", Jsonb(data), "")

    copy_rows(
        Event,
        ["project_id", "run_id", "type", "step", "time", "received_at", "actor", "data", "message"],
        events(),
    )


def fill() -> dict:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from webapp.domain.models import Checkpoint, Project

    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    project = Project.objects.create(name="Bench", slug="bench", allowed_roots=["/data"])
    get_user_model().objects.create_superuser("bench", password="bench")
    run_ids = fill_runs(project)
    n = copy_rows(
        Checkpoint,
        ["project_id", "run_id", "step", "epoch", "saved_at", "location", "format",
         "total_size", "file_count", "save_seconds", "metrics", "content", "status",
         "status_message", "error", "pinned", "verified_at", "created_at", "updated_at"],
        checkpoint_rows(project, run_ids),
    )  # fmt: skip
    fill_big_run_history(project, run_ids[0])
    fill_target(run_ids[0])
    fill_goodput(project, run_ids)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return {"checkpoints": n, "seconds": time.perf_counter() - started}


def count_queries(client, url: str, **headers) -> int:
    from django.db import connection

    for _ in range(3):  # warm caches, connections, templates
        response = client.get(url, **headers)
        assert response.status_code in (200, 286), (url, response.status_code)
    queries = []

    def count(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        client.get(url, **headers)
    return len(queries)


def measure(client, pages: list, requests: int) -> list[dict]:
    """Round after round, one GET of each page in turn: on a shared machine, whatever else
    runs slows every page of a round alike, the baselines included."""
    times = [[] for _ in pages]
    for _ in range(requests):
        for i, (_, url, headers) in enumerate(pages):
            start = time.perf_counter()
            client.get(url, **headers)
            times[i].append((time.perf_counter() - start) * 1000)
    results = []
    for page_times in times:
        page_times.sort()
        results.append(
            {
                "p50": statistics.median(page_times),
                "p95": page_times[max(0, int(len(page_times) * 0.95) - 1)],
                "max": page_times[-1],
            }
        )
    return results


def install_baseline_urls() -> None:
    """A URL configuration with the baseline page (signed in, `SELECT 1`, the base
    template) beside the project's own URLs."""
    import types

    from django.contrib.auth.decorators import login_required
    from django.db import connection
    from django.shortcuts import render
    from django.urls import include, path

    @login_required
    def select_one(request):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return render(request, "403.html", {"reason": "baseline"})

    urls = types.ModuleType("bench_pages_urls")
    urls.urlpatterns = [path("bench/select-1/", select_one), path("", include("webapp.urls"))]
    sys.modules["bench_pages_urls"] = urls


def pages_to_measure() -> list:
    """(name, url, headers) of every page measured, the two baselines first; prints what
    the database holds."""
    from webapp.domain.models import Checkpoint, Run

    big = Run.objects.get(key="run-00000")
    checkpoint = Checkpoint.objects.filter(run=big, files__isnull=False).first()
    counts = {
        "runs": Run.objects.count(),
        "checkpoints": Checkpoint.objects.count(),
        "big run": big.checkpoints.count(),
    }
    print("database:", ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    token = big.project.issue_token(f"bench-read-{time.time_ns()}", ["read"])[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    return [
        ("baseline: signed-in page, SELECT 1", "/bench/select-1/", {}),
        ("baseline: Django admin changelist of runs", "/admin/domain/run/", {}),
        ("project page (10,000 runs)", "/p/bench/", {}),
        ("project page, sorted by storage", "/p/bench/?sort=storage", {}),
        ("project page, filter overdue", "/p/bench/?status=overdue", {}),
        ("project page, sorted by checkpoint age", "/p/bench/?sort=age", {}),
        ("run page (100,000 checkpoints)", f"/p/bench/runs/{big.key}/", {}),
        ("run page, its charts (htmx, after load)", f"/p/bench/runs/{big.key}/?charts=1",
         {"HTTP_HX_REQUEST": "true"}),
        ("run page, charts drawn inline (no JS)", f"/p/bench/runs/{big.key}/?charts=1", {}),
        ("run page, checkpoint table (htmx)", f"/p/bench/runs/{big.key}/",
         {"HTTP_HX_REQUEST": "true"}),
        ("run page, table page 1000", f"/p/bench/runs/{big.key}/?page=1000",
         {"HTTP_HX_REQUEST": "true"}),
        ("checkpoint page", f"/p/bench/checkpoints/{checkpoint.pk}/", {}),
        ("goodput page (10,000 runs, 30 days)", "/p/bench/goodput/", {}),
        ("goodput page, 365 days", "/p/bench/goodput/?days=365", {}),
        ("API: project goodput by training", "/api/v1/goodput", auth),
        ("API: project goodput by host", "/api/v1/goodput?group_by=host", auth),
        ("API: project goodput by tag", "/api/v1/goodput?group_by=tag", auth),
        ("API: one training's ledger, from events", "/api/v1/runs/run-00005/goodput", auth),
    ]  # fmt: skip


def time_goodput_passes() -> None:
    """The workers' goodput pass (workers.analytics.refresh_goodput) over the project:
    every run when none has its row yet, then a pass as every GOODPUT_REFRESH_S (the
    running runs and their trainings again, the rest not)."""
    from webapp.domain.health import goodput_store
    from webapp.domain.models import Project

    project = Project.objects.get(slug="bench")
    for name in ("first pass (rows missing)", "next pass"):
        due = len(goodput_store.due(project))
        started = time.perf_counter()
        written = goodput_store.refresh_project(project, limit=RUNS)
        seconds = time.perf_counter() - started
        print(f"goodput {name}: {due:,} runs due, {written:,} rows written in {seconds:.1f} s "
              f"({seconds / max(written, 1) * 1000:.1f} ms a run)")  # fmt: skip


def print_results(pages: list, queries: list[int], results: list[dict], args, load: float) -> None:
    # Target (issue #23): p95 under 150 ms, or at most twice the admin changelist's p95
    # in the same run, whichever is larger.
    admin = results[1]["p95"]
    target = max(150.0, 2 * admin)
    print(
        f"\n{args.requests} rounds of one request per page, server time in ms (Django "
        f"test Client); load average {load:.1f} before, {os.getloadavg()[0]:.1f} after\n"
    )
    print(
        f"| page | p50 ms | p95 ms | max ms | queries | p95 / admin p95 | "
        f"target p95 < {target:.0f} ms |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for (name, _, _), n, r in zip(pages, queries, results, strict=True):
        verdict = (
            "" if name.startswith("baseline") else ("met" if r["p95"] < target else "**missed**")
        )
        print(f"| {name} | {r['p50']:.1f} | {r['p95']:.1f} | {r['max']:.1f} | {n} | "
              f"{r['p95'] / admin:.2f} | {verdict} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument(
        "--database", default=DB_NAME, help="its own database, dropped unless --reuse"
    )
    parser.add_argument("--reuse", action="store_true", help="keep a filled database")
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()

    configure(args.server, args.database)
    must_fill = create_database(args.server, args.database, args.reuse)
    import django

    django.setup()
    if must_fill:
        figures = fill()
        print(f"filled {figures['checkpoints']:,} checkpoints in {figures['seconds']:.0f} s")
    else:  # a database filled by an earlier version: bring its schema up to date
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    time_goodput_passes()

    from django.contrib.auth import get_user_model
    from django.test import Client, override_settings

    install_baseline_urls()
    pages = pages_to_measure()
    with override_settings(ROOT_URLCONF="bench_pages_urls"):
        client = Client()
        client.force_login(get_user_model().objects.get(username="bench"))
        queries = [count_queries(client, url, **headers) for _, url, headers in pages]
        load = os.getloadavg()[0]
        results = measure(client, pages, args.requests)
        print_results(pages, queries, results, args, load)


if __name__ == "__main__":
    main()
