"""Every number a job sends is bounded where it meets arithmetic (webapp/domain/ingest/
event_schema.py): intervals, times (past and future), steps, sizes, counts. The edge of
each bound is accepted, one past it is a 400 naming the field, and after a project has
received every edge each read endpoint, page and badge still answers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.events import event, saved
from tests.support.people import member
from webapp.domain.health import badges
from webapp.domain.ingest import event_schema as bounds
from webapp.domain.models import Run

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

ZERO = "0" * 64


def iso(moment: datetime) -> str:
    return moment.isoformat()


def edges() -> list[tuple[str, dict, dict]]:
    """(field, an event at the bound, the same one past it)."""
    now = datetime.now(UTC)
    ahead = now + timedelta(seconds=bounds.MAX_CLOCK_AHEAD_S - 60)
    too_far = now + timedelta(seconds=bounds.MAX_CLOCK_AHEAD_S + 3600)
    files = [{"path": "m.pt", "size": 1, "sha256": ZERO}]

    def started(run, **fields):
        return {**event("run.started", run=run), **fields}

    def ckpt(run, **fields):
        return {**saved(run=run, files=files), **fields}

    return [
        ("expected_interval_s", started("interval", expected_interval_s=bounds.MAX_INTERVAL_S),
         started("interval", expected_interval_s=1e12)),
        ("time", started("future", time=iso(ahead)),
         started("future", time="9999-12-31T00:00:00Z")),
        ("time", started("future2", time=iso(ahead)), started("future2", time=iso(too_far))),
        ("time", started("past", time="2000-01-01T00:00:00Z"),
         started("past", time="1999-12-31T23:59:59Z")),
        ("world_size", started("world", world_size=bounds.MAX_WORLD_SIZE),
         started("world", world_size=bounds.MAX_WORLD_SIZE + 1)),
        ("tags", started("tags", tags=[f"t{i}" for i in range(bounds.MAX_TAGS)]),
         started("tags", tags=[f"t{i}" for i in range(bounds.MAX_TAGS + 1)])),
        ("step", ckpt("step", step=bounds.MAX_STEP), ckpt("step", step=bounds.MAX_STEP + 1)),
        ("files[0].size",
         ckpt("size", files=[{"path": "m.pt", "size": bounds.MAX_FILE_SIZE, "sha256": ZERO}]),
         ckpt("size", files=[{"path": "m.pt", "size": bounds.MAX_FILE_SIZE + 1, "sha256": ZERO}])),
        ("save_seconds", ckpt("save", save_seconds=bounds.MAX_INTERVAL_S),
         ckpt("save", save_seconds=1e12)),
        ("metrics", ckpt("metrics", metrics={f"m{i}": 1.0 for i in range(bounds.MAX_METRICS)}),
         ckpt("metrics", metrics={f"m{i}": 1.0 for i in range(bounds.MAX_METRICS + 1)})),
        ("step", {**event("run.heartbeat", run="beat"), "step": bounds.MAX_STEP},
         {**event("run.heartbeat", run="beat"), "step": 2**63}),
    ]  # fmt: skip


def test_each_bound_is_accepted_at_its_edge_and_refused_past_it_by_name(api, token):
    for field, at_edge, past in edges():
        refused = api.post_events(token, past)
        assert refused.status_code == 400, (field, refused.content)
        assert refused.json()["field"] == field, refused.json()
        accepted = api.post_events(token, at_edge)
        assert accepted.status_code == 202, (field, accepted.content)


def test_an_integral_number_is_an_integer_whatever_its_json_spelling(api, token):
    """JSON Schema's integer admits 2314.0 (what the OpenAPI document promises)."""
    assert api.post_events(token, saved(step=2314.0)).status_code == 202
    refused = api.post_events(token, saved(step=2314.5))
    assert refused.status_code == 400 and refused.json()["field"] == "step"
    assert api.post_events(token, saved(step=True)).status_code == 400


def test_after_every_edge_every_read_still_answers(api, token, client, project):
    for _field, at_edge, _past in edges():
        assert api.post_events(token, at_edge).status_code == 202
    # Rows written before the bounds (or by hand) must not break a read either.
    Run.objects.filter(key="interval").update(expected_interval_s=1e15)
    assert api.get(token, "/runs").status_code == 200
    for run in Run.objects.all():
        for path in ("", "/checkpoints", "/analytics"):
            answer = api.get(token, f"/runs/{run.key}{path}")
            assert answer.status_code == 200, (run.key, path, answer.content)
        assert api.get(token, f"/runs/{run.key}/latest").status_code in (200, 404)
        assert badges.for_run(run).state
    assert api.get(token, "/runs", health="overdue").status_code == 200
    client.force_login(member(project, "vera", "viewer"))
    assert client.get(f"/p/{project.slug}/").status_code == 200
    assert client.get(f"/p/{project.slug}/?problems=1").status_code == 200
    for run in Run.objects.all():
        assert client.get(f"/p/{project.slug}/runs/{run.key}/").status_code == 200
    assert client.get(f"/badge/{project.badge_key}.svg").status_code == 200
