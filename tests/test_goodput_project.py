"""A project's goodput (docs/analytics.md, "A project's goodput"): the rows the workers
keep (health/goodput_store.py) sum to the trainings' own ledgers, by training, tag and
host; the measured MTBF per host, with its confidence interval, feeds Young and Daly;
the API, the CLI, the page and the Prometheus gauges say the same."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db.models import F
from django.test import override_settings

from tests.support.celery_workers import start_worker, stop_worker
from tests.support.cli import cli_env, lifeboat
from tests.support.dashboard import as_user
from tests.support.goodput import ONE_FAILURE, attempt, checkpoint_of, goodput, post
from webapp.domain import publish
from webapp.domain.health import goodput_report, goodput_store
from webapp.domain.models import Event, RunGoodput

pytestmark = pytest.mark.django_db


def started_with(events: list[dict], **fields) -> list[dict]:
    events[0].update(fields)
    return events


def two_trainings(api, token) -> None:
    """Training `a` (failed at 6000 s, resumed as `b`: ONE_FAILURE's ledger) on host gpu1,
    tagged llm; training `c` (finished, no failure) on host gpu2, tagged llm and vision."""
    post(
        api,
        token,
        started_with(
            attempt("a", 0, 600, 6000, "run.failed", saves=[3600]), host="gpu1", tags=["llm"]
        ),
    )
    post(
        api,
        token,
        started_with(
            attempt(
                "b",
                6600,
                6900,
                10800,
                "run.finished",
                saves=[9600],
                resumed_from=checkpoint_of("a", 3600),
            ),
            host="gpu1",
            tags=["llm"],
        ),
    )
    post(api, token, started_with(
        attempt("c", 0, 300, 3600, "run.finished", saves=[1800]), host="gpu2",
        tags=["llm", "vision"]))  # fmt: skip


def project_view(api, token, **query) -> dict:
    answer = api.get(token, "/goodput", **query)
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_the_project_sums_its_trainings_ledgers(api, token, project):
    two_trainings(api, token)
    assert goodput_store.refresh_all() == 3

    view = project_view(api, token)

    a, c = goodput(api, token, "a"), goodput(api, token, "c")
    assert view["wall_seconds"] == pytest.approx(a["wall_seconds"] + c["wall_seconds"])
    assert view["productive_seconds"] == pytest.approx(
        a["productive_seconds"] + c["productive_seconds"]
    )
    for cause, seconds in view["badput"].items():
        assert seconds == pytest.approx(a["badput"][cause] + c["badput"][cause]), cause
    assert view["gpu_hours"] == pytest.approx(a["gpu_hours"] + c["gpu_hours"])
    assert (view["runs"], view["failures"], view["groups_total"]) == (3, 1, 2)
    # By training: each group is that training's own ledger; the one that lost most first.
    first, second = view["groups"]
    assert (first["key"], second["key"]) == ("a", "c")
    for group, ledger in ((first, a), (second, c)):
        for key in ("wall_seconds", "productive_seconds", "goodput", "gpu_hours"):
            assert group[key] == pytest.approx(ledger[key]), (group["key"], key)
        assert group["badput"] == pytest.approx(ledger["badput"])
    assert first["badput"] == pytest.approx(ONE_FAILURE["badput"])
    # What one failure cost: the lost work, the restart and the restore, on 2 GPUs.
    lost = (2400 + 600 + 300) * 2 / 3600
    assert first["lost_per_failure_gpu_hours"] == pytest.approx(lost)


def test_by_host_and_by_tag(api, token, project):
    two_trainings(api, token)
    goodput_store.refresh_all()
    a, c = goodput(api, token, "a"), goodput(api, token, "c")

    hosts = {g["key"]: g for g in project_view(api, token, group_by="host")["groups"]}
    tags = {g["key"]: g for g in project_view(api, token, group_by="tag")["groups"]}

    assert hosts["gpu1"]["gpu_hours"] == pytest.approx(a["gpu_hours"])
    assert (hosts["gpu1"]["failures"], hosts["gpu2"]["failures"]) == (1, 0)
    assert hosts["gpu2"]["productive_seconds"] == pytest.approx(c["productive_seconds"])
    # A run counts in each of its tags.
    assert tags["llm"]["gpu_hours"] == pytest.approx(a["gpu_hours"] + c["gpu_hours"])
    assert tags["vision"]["gpu_hours"] == pytest.approx(c["gpu_hours"])
    assert tags["llm"]["runs"] == 3 and tags["vision"]["runs"] == 1
    # A limit keeps the groups that lost most, and says how many there are.
    for group_by, first in (("host", "gpu1"), ("tag", "llm"), ("run", "a")):
        top = project_view(api, token, group_by=group_by, limit=1)
        assert (top["groups_total"], [g["key"] for g in top["groups"]]) == (2, [first])


def test_a_pass_computes_again_only_what_changed_and_twice_is_the_same(api, token, project):
    two_trainings(api, token)
    # Received a while ago: past the margin that covers an ingest still committing.
    Event.objects.update(received_at=F("received_at") - timedelta(minutes=5))
    goodput_store.refresh_all()
    rows = {r.run.key: r for r in RunGoodput.objects.select_related("run")}
    assert goodput_store.due(project) == set()  # nothing running, no new event

    post(api, token, attempt("d", 0, 300, 1800, "run.finished", saves=[900]))
    assert {r for r in goodput_store.due(project)} == {rows["a"].run.project.runs.get(key="d").pk}
    goodput_store.refresh_all()
    goodput_store.refresh_all()  # safe to run twice

    again = {r.run.key: r for r in RunGoodput.objects.select_related("run")}
    assert set(again) == {"a", "b", "c", "d"}
    for key in ("a", "b", "c"):
        assert again[key].productive_seconds == rows[key].productive_seconds
    assert again["a"].family_id == again["b"].family_id == rows["a"].run_id


@pytest.mark.django_db(transaction=True)
def test_a_worker_on_the_alerts_queue_runs_the_beat_task(worker_env, api, token, project, tmp_path):
    # Here, not at the top: importing the workers' app makes it this process's publisher.
    from workers.celery import app

    beat = app.conf.beat_schedule["refresh-goodput"]
    assert beat["task"] == "workers.analytics.refresh_goodput"
    two_trainings(api, token)
    worker = start_worker(worker_env, "alerts", tmp_path / "worker.log")
    try:
        publish.send(beat["task"])  # routed as the beat's message is
        deadline = time.monotonic() + 60
        while RunGoodput.objects.count() < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop_worker(worker)
    assert RunGoodput.objects.count() == 3, worker.log_path.read_text()[-3000:]


def test_since_keeps_the_runs_active_after_it(api, token, project):
    two_trainings(api, token)
    goodput_store.refresh_all()
    ended_c = RunGoodput.objects.get(run__key="c").ended_at  # c ended at 3600 s, b at 10800

    later = project_view(api, token, since=(ended_c.replace(tzinfo=None)).isoformat())

    assert {g["key"] for g in later["groups"]} == {"a"}  # a and b ran later
    assert later["runs"] == 2
    # After a failed at 6000 s, only its resume b ran: counted whole, under training a.
    ended_a = RunGoodput.objects.get(run__key="a").ended_at
    resumed = project_view(api, token, since=ended_a.isoformat())
    b = RunGoodput.objects.get(run__key="b")
    assert resumed["runs"] == 1 and resumed["groups"][0]["key"] == "a"
    assert resumed["wall_seconds"] == pytest.approx(b.wall_seconds)


def test_hostile_queries_get_a_clear_error(api, token, project):
    for query in ({"group_by": "user"}, {"since": "yesterday"}, {"since": "0.5"}, {"limit": 0}):
        answer = api.get(token, "/goodput", **query)
        assert answer.status_code == 400, (query, answer.content)
        assert answer.json()["error"].startswith(next(iter(query))), answer.content
    # An offset PostgreSQL would refuse, a time past the calendar's start: read in UTC.
    for since in ("0245-08-25T19:02:03.473579-16:27", "0001-01-01T00:00:00+05:00"):
        assert api.get(token, "/goodput", since=since).status_code == 200, since


def test_the_mtbf_interval_is_the_chi_square_one():
    # Textbook values: chi-square quantiles of 2k degrees of freedom.
    assert goodput_report.chi2_quantile(0.95, 2) == pytest.approx(5.991465, abs=1e-5)
    assert goodput_report.chi2_quantile(0.05, 20) == pytest.approx(10.85081, abs=1e-4)
    three = goodput_report.mtbf(1000.0, 3)
    assert three.gpu_hours_per_failure == pytest.approx(333.333, abs=1e-3)
    assert three.low == pytest.approx(128.97, abs=0.01)
    assert three.high == pytest.approx(1223.0, abs=0.1)
    assert three.note.startswith("3 failures in 1,000 GPU-hours: 333 GPU-hours between")
    none = goodput_report.mtbf(50.0, 0)
    assert none.gpu_hours_per_failure is None and none.high is None
    assert none.note == (
        "no failure in 50 GPU-hours: at least 16.7 GPU-hours between failures (90% confidence)"
    )


@override_settings(ANALYTICS_MTBF_MIN_FAILURES=2, ANALYTICS_MTBF_MIN_HOURS=1)
def test_a_host_s_measured_failures_feed_young_and_daly(api, token, project):
    """Two failures on gpu1 over its runs' time: the host's GPU-hours between failures,
    over a run's GPUs, is the M its intervals use (a job fails when any of its GPUs do)."""
    for i in range(2):
        post(api, token, started_with(
            attempt(f"f{i}", 0, 300, 3600, "run.failed", saves=[1800]), host="gpu1"))  # fmt: skip
    post(api, token, started_with(
        attempt("r", 0, 300, 7200, "run.finished", saves=[1800, 3600]), host="gpu1"))  # fmt: skip
    goodput_store.refresh_all()

    answer = api.get(token, "/runs/r/analytics").json()

    exposure = 2 * (3600 + 3600 + 7200) / 3600  # GPU-hours on gpu1, 2 GPUs a run
    assert answer["mtbf_basis"] == "host"
    assert answer["mtbf_seconds"] == pytest.approx(exposure / 2 / 2 * 3600)
    assert answer["mtbf_source"].startswith("measured on host gpu1: 2 failures in 8 GPU-hours")
    assert answer["daly_interval_seconds"] is not None


@override_settings(ANALYTICS_MTBF_MIN_FAILURES=2, ANALYTICS_MTBF_MIN_HOURS=1)
def test_a_run_that_holds_no_gpu_on_a_measured_host_gets_no_host_mtbf(api, token, project):
    """`gpus_per_rank: 0` (a CPU job, allowed in its config) on a host with enough failures:
    the host's GPU-hours between failures say nothing about it, and its analytics answer."""
    for i in range(2):
        post(api, token, started_with(
            attempt(f"f{i}", 0, 300, 3600, "run.failed", saves=[1800]), host="gpu1"))  # fmt: skip
    post(api, token, started_with(
        attempt("cpu", 0, 300, 7200, "run.finished", saves=[1800, 3600]), host="gpu1",
        config={"gpus_per_rank": 0}))  # fmt: skip
    goodput_store.refresh_all()

    response = api.get(token, "/runs/cpu/analytics")

    assert response.status_code == 200, response.content
    assert response.json()["mtbf_basis"] != "host"


@pytest.mark.django_db(transaction=True)
def test_the_cli_prints_the_project_view(server, api, token, project, tmp_path):
    two_trainings(api, token)
    goodput_store.refresh_all()
    env = cli_env(server.url, token, tmp_path)

    done = lifeboat(env, "goodput", "--by", "host")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "project: 3 runs, 1 failed, 0 preempted"
    assert lines[1].startswith("goodput ") and "GPU-hours" in lines[1]
    assert "the hosts that lost most (2 of 2)" in lines
    assert any(line.startswith("gpu1 ") for line in lines)
    as_json = json.loads(lifeboat(env, "goodput", "--json").stdout)
    assert as_json["groups_total"] == 2


def test_the_project_page_draws_the_days_and_lists_the_losers(api, token, project, viewer):
    project.gpu_hour_price = 2
    project.save()
    two_trainings(api, token)
    goodput_store.refresh_all()

    page = as_user(viewer).get("/p/alpha/goodput/").content.decode()

    assert 'id="goodput-total"' in page and "GPU-hours" in page
    assert 'class="chart-svg bars"' in page  # the chart by day: one day, one bar that shows
    trainings = page.split('id="goodput-trainings"')[1].split("</table>")[0]
    assert trainings.index(">a<") < trainings.index(">c<")
    hosts = page.split('id="goodput-hosts"')[1].split("</table>")[0]
    assert "gpu1" in hosts and "1 failure in" in hosts


def test_an_empty_project_says_so(project, viewer):
    assert 'href="/p/alpha/goodput/"' in as_user(viewer).get("/p/alpha/").content.decode()
    page = as_user(viewer).get("/p/alpha/goodput/").content.decode()
    assert "No goodput figures yet" in page


def test_the_gauges(api, token, project, client, settings):
    settings.METRICS_TOKEN = "scrape-token"
    two_trainings(api, token)
    goodput_store.refresh_all()

    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").content.decode()

    assert 'lifeboat_goodput_ratio{project="alpha"}' in text
    assert 'lifeboat_badput_seconds{cause="lost_work",project="alpha"} 2400' in text
    assert 'lifeboat_gpu_hours{project="alpha"}' in text


def test_past_many_failures_the_quantile_is_approximated_closely(monkeypatch):
    exact = goodput_report.chi2_quantile.__wrapped__
    approximated = {p: exact(p, 402) for p in (0.05, 0.95)}
    monkeypatch.setattr(goodput_report, "WILSON_HILFERTY_DOF", 10**6)
    for p, value in approximated.items():
        assert value == pytest.approx(exact(p, 402), rel=1e-4)
