"""A run's health in the API: up / late / overdue / not_watched with the next deadline,
from real events through the ingest API, the same rule as the dashboard's."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

pytestmark = pytest.mark.django_db


def ago(seconds: float) -> str:
    return (timezone.now() - timedelta(seconds=seconds)).isoformat()


def send(api, token, type_: str, run: str, seconds_ago: float, **fields) -> None:
    body = {"id": str(uuid.uuid4()), "type": type_, "run": run, "time": ago(seconds_ago)}
    response = api.post_events(token, {**body, **fields})
    assert response.status_code == 202, response.json()


def saved(api, token, run: str, seconds_ago: float, step: int = 10) -> None:
    send(
        api,
        token,
        "checkpoint.saved",
        run,
        seconds_ago,
        step=step,
        location=f"/data/{run}/{step}",
        files=[{"path": "m.pt", "size": 10, "sha256": "ab" * 32}],
    )


@pytest.fixture
def runs_in_every_state(api, token, project):
    # Each run says it checkpoints every 100 s: late after 100 s, overdue after 150 s.
    for key, age in (("fresh", 30), ("late", 120), ("overdue", 400)):
        send(api, token, "run.started", key, 1000, expected_interval_s=100)
        saved(api, token, key, age)
    send(api, token, "run.started", "no-interval", 1000)
    send(api, token, "run.started", "done", 1000, expected_interval_s=100)
    send(api, token, "run.finished", "done", 900)
    return project


def deadline(body) -> datetime | None:
    value = body["next_deadline"]
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def test_each_run_says_its_health_and_next_deadline(api, read_token, runs_in_every_state):
    now = timezone.now()
    got = {key: api.get(read_token, f"/runs/{key}").json() for key in (
        "fresh", "late", "overdue", "no-interval", "done"
    )}  # fmt: skip
    assert {k: b["health"] for k, b in got.items()} == {
        "fresh": "up",
        "late": "late",
        "overdue": "overdue",
        "no-interval": "not_watched",
        "done": "not_watched",
    }
    # Up: late 100 s after the checkpoint (30 s ago); late: overdue 150 s after (120 s ago).
    assert abs((deadline(got["fresh"]) - now).total_seconds() - 70) < 10
    assert abs((deadline(got["late"]) - now).total_seconds() - 30) < 10
    assert [deadline(got[k]) for k in ("overdue", "no-interval", "done")] == [None] * 3


def test_the_list_carries_health_and_filters_by_it(api, read_token, runs_in_every_state):
    listed = {r["key"]: r["health"] for r in api.get(read_token, "/runs").json()["runs"]}
    assert listed["fresh"] == "up" and listed["overdue"] == "overdue"
    only = api.get(read_token, "/runs", health="overdue").json()["runs"]
    assert [r["key"] for r in only] == ["overdue"]
    unwatched = api.get(read_token, "/runs", health="not_watched").json()["runs"]
    assert sorted(r["key"] for r in unwatched) == ["done", "no-interval"]
    wrong = api.get(read_token, "/runs", health="sleepy")
    assert wrong.status_code == 400 and "health: must be one of" in wrong.json()["error"]


def test_a_new_checkpoint_brings_an_overdue_run_back_up(api, token, read_token, project):
    send(api, token, "run.started", "r", 1000, expected_interval_s=100)
    saved(api, token, "r", 500)
    assert api.get(read_token, "/runs/r").json()["health"] == "overdue"
    saved(api, token, "r", 5, step=20)
    assert api.get(read_token, "/runs/r").json()["health"] == "up"


def test_the_run_list_s_queries_do_not_grow_with_its_runs(
    api, token, read_token, project, django_assert_max_num_queries
):
    for i in range(3):
        send(api, token, "run.started", f"r{i}", 100, expected_interval_s=60)
    with django_assert_max_num_queries(6) as few:
        api.get(read_token, "/runs")
    for i in range(3, 15):
        send(api, token, "run.started", f"r{i}", 100, expected_interval_s=60)
        saved(api, token, f"r{i}", 10)
    with django_assert_max_num_queries(len(few.captured_queries)):
        body = api.get(read_token, "/runs").json()
    assert len(body["runs"]) == 15
    # Health costs no query per run: r0-r2 started 100 s ago, no checkpoint in 60 + 30 s.
    assert {r["key"]: r["health"] for r in body["runs"]}["r0"] == "overdue"
    assert {r["key"]: r["health"] for r in body["runs"]}["r9"] == "up"


def test_the_openapi_document_declares_health(client):
    schema = client.get("/api/v1/openapi.json").json()
    run = schema["components"]["schemas"]["RunOut"]["properties"]
    assert run["health"]["enum"] == ["up", "late", "overdue", "not_watched"]
    assert "next_deadline" in run
    params = schema["paths"]["/api/v1/runs"]["get"]["parameters"]
    assert "health" in [p["name"] for p in params]
