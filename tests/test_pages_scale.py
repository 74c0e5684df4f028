"""The dashboard at scale (issue #23, point 9): each run's totals kept by triggers
(RunStats, migration 0014), so that no page sums or counts every checkpoint; every page
makes the same number of queries for 3 or 30 runs and checkpoints; the checkpoint table
seeks instead of OFFSET; charts read a bounded number of rows on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tests.support.dashboard import as_user, make_checkpoint, make_run
from webapp.domain.models import Checkpoint, MetricPoint, Run, RunStats

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def expected_totals(run) -> tuple[int, int, int | None, object]:
    """What RunStats must say, computed from the checkpoints themselves."""
    rows = list(run.checkpoints.values_list("status", "total_size", "step", "saved_at"))
    saved = sorted((r for r in rows if r[0] not in ("saving", "failed")), key=lambda r: r[2])
    newest = saved[-1] if saved else None
    return (
        sum(size for status, size, _, _ in rows if status != "deleted"),
        len(rows),
        newest[2] if newest else None,
        newest[3] if newest else None,
    )


def totals(run) -> tuple[int, int, int | None, object]:
    stats = RunStats.objects.filter(run=run).first()
    if stats is None:
        return (0, 0, None, None)
    return (
        stats.storage_bytes,
        stats.checkpoint_count,
        stats.last_checkpoint_step,
        stats.last_checkpoint_at,
    )


def test_run_totals_follow_every_write_of_a_checkpoint(project):
    now = timezone.now()
    run = make_run(project, "r")
    other = make_run(project, "other")
    make_checkpoint(other, 5, total_size=7, saved_at=now)
    assert totals(run) == (0, 0, None, None)

    # Inserted one by one and many in one statement.
    make_checkpoint(run, 10, total_size=100, saved_at=now - timedelta(minutes=3))
    Checkpoint.objects.bulk_create(
        [
            Checkpoint(project=project, run=run, step=s, status="verified", total_size=s,
                       saved_at=now - timedelta(minutes=2))
            for s in (20, 30)
        ]
        + [Checkpoint(project=project, run=run, step=40, status="saving", total_size=0)]
    )  # fmt: skip
    assert totals(run) == expected_totals(run)
    assert totals(run)[2] == 30  # a save in progress is not the newest checkpoint

    # A save that completes, then a newer one that fails.
    Checkpoint.objects.filter(run=run, step=40).update(
        status="reported", total_size=400, saved_at=now
    )
    assert totals(run) == expected_totals(run) and totals(run)[2] == 40
    Checkpoint.objects.filter(run=run, step=40).update(status="failed")
    assert totals(run) == expected_totals(run) and totals(run)[2] == 30

    # Validation moves statuses around without changing a total.
    Checkpoint.objects.filter(run=run, step=30).update(status="corrupt")
    assert totals(run) == expected_totals(run)

    # Retention deletes the local copy, then the row goes.
    Checkpoint.objects.filter(run=run, step=20).update(status="deleted")
    assert totals(run) == expected_totals(run)
    Checkpoint.objects.filter(run=run, step__gte=30).delete()
    assert totals(run) == expected_totals(run)
    assert totals(run)[2] == 20  # the newest left (deleted locally, but it was saved)
    Checkpoint.objects.filter(run=run).delete()
    assert totals(run) == (0, 0, None, None)

    assert totals(other) == (7, 1, 5, now)  # untouched by all this
    other.delete()  # its stats row and its checkpoints go, in Django's order
    assert not RunStats.objects.filter(run_id=other.pk).exists()


def test_a_checkpoint_saved_through_the_api_counts_at_once(api, token, project):
    from tests.support.events import event, saved

    api.post_events(token, event("run.started", run="exp/1"))
    batch = {"events": [saved(run="exp/1", step=10), saved(run="exp/1", step=20)]}
    assert api.post_events(token, batch).status_code == 202
    run = Run.objects.get(key="exp/1")
    assert totals(run) == expected_totals(run)
    assert totals(run)[1] == 2 and totals(run)[0] > 0


def test_the_project_page_sorts_by_storage_and_filters_by_health_from_the_totals(project, viewer):
    now = timezone.now()
    small = make_run(project, "small", expected_interval_s=60)
    big = make_run(project, "big", expected_interval_s=60)
    make_checkpoint(small, 1, total_size=10, saved_at=now)
    make_checkpoint(big, 1, total_size=10**9, saved_at=now - timedelta(hours=1))
    client = as_user(viewer)
    html = client.get("/p/alpha/", {"sort": "storage"}).content.decode()
    assert html.index("/runs/big/") < html.index("/runs/small/")
    overdue = client.get("/p/alpha/", {"status": "overdue"}).content.decode()
    assert "/runs/big/" in overdue and "/runs/small/" not in overdue


def test_the_checkpoint_table_pages_by_seek(project, viewer):
    run = make_run(project, "r")
    Checkpoint.objects.bulk_create(
        [Checkpoint(project=project, run=run, step=s, status="verified") for s in range(1, 121)]
    )
    client = as_user(viewer)
    page2 = client.get("/p/alpha/runs/r/", {"page": 2}, HTTP_HX_REQUEST="true")
    steps = [c.step for c in page2.context["checkpoints"]]
    assert steps == list(range(70, 20, -1))  # 120..71 on page 1
    assert page2.context["page"].paginator.num_pages == 3
    last = client.get("/p/alpha/runs/r/", {"page": 99}, HTTP_HX_REQUEST="true")
    assert [c.step for c in last.context["checkpoints"]] == list(range(20, 0, -1))


# --- The same number of queries for few or many rows -------------------------------------


def grow(project, runs: int, steps: range) -> None:
    """Runs run-0 .. run-<runs - 1> with a checkpoint at each of `steps` (runs that exist
    get the new steps too), and run-0 a metric point (4 metrics) at each."""
    now = timezone.now()
    for i in range(runs):
        run = Run.objects.filter(project=project, key=f"run-{i}").first() or make_run(
            project, f"run-{i}", expected_interval_s=60, tags=["t"]
        )
        Checkpoint.objects.bulk_create(
            [
                Checkpoint(project=project, run=run, step=s, status="verified",
                           saved_at=now - timedelta(hours=i % 2), total_size=100 + i,
                           save_seconds=1.0)
                for s in steps
            ]
        )  # fmt: skip
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(run=Run.objects.get(project=project, key="run-0"), step=s, time=now,
                        values={"loss": 1.0 / (s + 1), "acc": 0.5, "lr": 1e-3, "gn": 2.0})
            for s in steps
        ]
    )  # fmt: skip


PAGES = [
    ("/p/alpha/", {}, {}),
    ("/p/alpha/", {"sort": "storage"}, {}),
    ("/p/alpha/", {"sort": "age"}, {}),
    ("/p/alpha/", {"status": "overdue"}, {}),
    ("/p/alpha/", {"status": "up", "tag": "t", "sort": "step"}, {}),
    ("/p/alpha/runs/run-0/", {}, {}),
    ("/p/alpha/runs/run-0/", {"charts": 1}, {"HTTP_HX_REQUEST": "true"}),
    ("/p/alpha/runs/run-0/", {"charts": 1}, {}),
    ("/p/alpha/runs/run-0/", {}, {"HTTP_HX_REQUEST": "true"}),
    ("/p/alpha/runs/run-0/", {"page": 2}, {"HTTP_HX_REQUEST": "true"}),
]


def queries_of_each_page(client) -> list[int]:
    from django.test.utils import CaptureQueriesContext

    counts = []
    for url, params, headers in PAGES:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url, params, **headers)
        assert response.status_code in (200, 286), (url, params)
        counts.append(len(queries))
    return counts


def test_every_page_makes_as_many_queries_for_30_runs_as_for_3(project, viewer):
    client = as_user(viewer)
    grow(project, 3, range(60))
    few = queries_of_each_page(client)
    grow(project, 30, range(60, 600))  # 27 more runs; 600 checkpoints and points in each
    many = queries_of_each_page(client)
    assert many == few, list(zip(PAGES, few, many, strict=True))
    # And the ones the pages are drawn from were read: 30 runs listed, 4 metrics charted.
    html = client.get("/p/alpha/", {"sort": "storage"}).content.decode()
    assert html.count("/runs/run-") >= 30
    charts = client.get("/p/alpha/runs/run-0/", {"charts": 1}, HTTP_HX_REQUEST="true")
    assert charts.content.decode().count("<svg") == 2 + 4


def test_charts_read_a_bounded_number_of_rows_on_postgresql(project, viewer):
    from webapp.dashboard import charts

    run = make_run(project, "long", last_metrics={"loss": 1.0})
    n = charts.BUCKETS * (charts.SAMPLE_PER_BUCKET + 8)
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, step=s, time=timezone.now(), values={"loss": s}) for s in range(n)]
    )
    chart = charts.run_charts(run, ["loss"])[0]
    assert chart.title == "loss" and not chart.empty
    html = (
        as_user(viewer)
        .get("/p/alpha/runs/long/", {"charts": 1}, HTTP_HX_REQUEST="true")
        .content.decode()
    )
    if connection.vendor == "postgresql":
        assert chart.sampled
        assert "points read per pixel column" in chart.summary
        assert f"at most {charts.SAMPLE_PER_BUCKET} points read per pixel" in html
    else:  # SQLite reads every row: exact, as before
        assert not chart.sampled and "sampled" not in html
        assert chart.y_ticks[-1][1] == charts.short_number(n - 1)
