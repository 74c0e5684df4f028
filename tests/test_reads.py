"""The read endpoints, the actions, and the OpenAPI document."""

from __future__ import annotations

import pytest
from django.utils import timezone

from tests.support.events import event, saved
from webapp.domain.models import Checkpoint, Event, Replica, StorageTarget

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(api, token, project):
    api.post_events(token, event("run.started", run="exp/a", name="A", host="h1"))
    api.post_events(token, {"events": [saved(run="exp/a", step=s, t=s) for s in (10, 20, 30)]})
    api.post_events(token, event("run.started", run="b", t=100))
    Checkpoint.objects.filter(step__in=(10, 20)).update(
        status="verified", verified_at=timezone.now()
    )
    Checkpoint.objects.filter(step=30).update(status="corrupt", status_message="NaN in w")
    return project


def test_list_runs_newest_activity_first(api, read_token, history):
    body = api.get(read_token, "/runs").json()
    assert [r["key"] for r in body["runs"]] == ["b", "exp/a"]
    assert body["next_offset"] is None
    page = api.get(read_token, "/runs", limit=1).json()
    assert [r["key"] for r in page["runs"]] == ["b"]
    assert page["next_offset"] == 1
    assert [r["key"] for r in api.get(read_token, "/runs", offset=1).json()["runs"]] == ["exp/a"]


def test_get_a_run_whose_key_has_a_slash(api, read_token, history):
    body = api.get(read_token, "/runs/exp/a").json()
    assert (body["key"], body["name"], body["host"], body["status"]) == (
        "exp/a",
        "A",
        "h1",
        "running",
    )


def test_list_checkpoints_filters_by_status_and_pages_by_step(api, read_token, history):
    all_ = api.get(read_token, "/runs/exp/a/checkpoints").json()["checkpoints"]
    assert [c["step"] for c in all_] == [30, 20, 10]
    verified = api.get(read_token, "/runs/exp/a/checkpoints", status="verified").json()
    assert [c["step"] for c in verified["checkpoints"]] == [20, 10]
    page = api.get(read_token, "/runs/exp/a/checkpoints", limit=2).json()
    assert [c["step"] for c in page["checkpoints"]] == [30, 20]
    rest = api.get(read_token, "/runs/exp/a/checkpoints", before_step=page["next_before_step"])
    assert [c["step"] for c in rest.json()["checkpoints"]] == [10]


def test_list_checkpoints_rejects_an_unknown_status(api, read_token, history):
    response = api.get(read_token, "/runs/exp/a/checkpoints", status="great")
    assert response.status_code == 400
    assert response.json()["error"].startswith("status: must be one of 'saving', 'failed'")


def test_latest_is_the_newest_verified_checkpoint_with_its_verified_replicas(
    api, read_token, history
):
    checkpoint = Checkpoint.objects.get(step=20)
    good = StorageTarget.objects.create(project=history, name="main", bucket="ckpts", prefix="a/")
    bad = StorageTarget.objects.create(project=history, name="dr", bucket="dr")
    Replica.objects.create(checkpoint=checkpoint, target=good, status="verified", bytes_total=9)
    Replica.objects.create(checkpoint=checkpoint, target=bad, status="failed")
    body = api.get(read_token, "/runs/exp/a/latest").json()
    assert body["step"] == 20  # 30 is newer but corrupt
    assert [f["path"] for f in body["files"]] == ["model.pt", "optim.pt"]
    assert [(r["target"], r["bucket"], r["prefix"]) for r in body["replicas"]] == [
        ("main", "ckpts", "a")  # prefixes are saved without their slashes
    ]


def test_latest_says_clearly_when_there_is_no_verified_checkpoint(api, read_token, history):
    response = api.get(read_token, "/runs/b/latest")
    assert response.status_code == 404
    assert response.json() == {"error": "run 'b' has no verified checkpoint yet"}


def test_unknown_run_is_404_json(api, read_token, history):
    response = api.get(read_token, "/runs/nope")
    assert response.status_code == 404
    assert response.json() == {"error": "no run 'nope' in this project"}


def test_get_a_checkpoint_with_files_and_validations(api, read_token, history):
    checkpoint = Checkpoint.objects.get(step=30)
    body = api.get(read_token, f"/checkpoints/{checkpoint.pk}").json()
    assert (body["run"], body["step"], body["status"]) == ("exp/a", 30, "corrupt")
    assert body["status_message"] == "NaN in w"
    assert len(body["files"]) == 2
    assert body["validations"] == []


def test_reads_need_the_read_scope(api, ingest_token, history):
    response = api.get(ingest_token, "/runs")
    assert response.status_code == 403
    assert "lacks the 'read' scope" in response.json()["error"]


def test_list_runs_takes_a_fixed_number_of_queries(
    api, read_token, history, django_assert_num_queries
):
    api.get(read_token, "/runs")  # stamps the token's first use and caches it
    with django_assert_num_queries(1):  # the page (the token comes from the cache)
        api.get(read_token, "/runs")


def test_pin_and_unpin_are_logged(api, token, history):
    checkpoint = Checkpoint.objects.get(step=10)
    response = api.post(token, f"/checkpoints/{checkpoint.pk}/pin")
    assert response.status_code == 200
    assert Checkpoint.objects.get(pk=checkpoint.pk).pinned
    api.post(token, f"/checkpoints/{checkpoint.pk}/pin", {"pinned": False})
    assert not Checkpoint.objects.get(pk=checkpoint.pk).pinned
    logged = Event.objects.filter(type__startswith="checkpoint.", event_id__isnull=True)
    assert [(e.type, e.actor) for e in logged.order_by("id")] == [
        ("checkpoint.pinned", "token:all"),
        ("checkpoint.unpinned", "token:all"),
    ]


def test_actions_need_the_operate_scope(api, project, history):
    reader = project.issue_token("r", ["read", "ingest"])[1]
    checkpoint = Checkpoint.objects.get(step=10)
    assert api.post(reader, f"/checkpoints/{checkpoint.pk}/pin").status_code == 403
    assert api.post(reader, f"/checkpoints/{checkpoint.pk}/validate").status_code == 403
    assert not Checkpoint.objects.get(pk=checkpoint.pk).pinned


def test_openapi_document_describes_the_contract(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    assert {"/api/v1/events", "/api/v1/runs/{key}/latest", "/api/v1/runs"} <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    assert {"CheckpointSaved", "RunStarted", "MetricsEvent", "AnyEvent"} <= set(schemas)
    assert schemas["CheckpointSaved"]["required"] == [
        "id",
        "run",
        "time",
        "type",
        "step",
        "location",
        "files",
    ]
