"""POST /api/v1/events: what each event type does to runs and checkpoints."""

from __future__ import annotations

import pytest

from tests.support.events import SHA, at, event, saved
from webapp.domain.models import Checkpoint, CheckpointFile, Event, MetricPoint, Run

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def test_run_started_creates_the_run_with_its_description(api, token, project):
    response = api.post_events(
        token,
        event(
            "run.started",
            name="GPT small",
            host="gpu-07",
            framework="pytorch-2.13",
            world_size=8,
            config={"lr": 3e-4, "layers": 12},
            expected_interval_s=600,
            tags=["baseline", "a100"],
        ),
    )
    assert response.status_code == 202, response.content
    assert response.json()["created"] == 1
    run = Run.objects.get(project=project, key="run-1")
    assert (run.name, run.host, run.framework, run.world_size) == (
        "GPT small",
        "gpu-07",
        "pytorch-2.13",
        8,
    )
    assert run.config == {"lr": 3e-4, "layers": 12}
    assert run.tags == ["baseline", "a100"]
    assert run.expected_interval_s == 600
    assert run.status == "running"
    assert run.started_at.isoformat() == "2026-11-30T12:00:00+00:00"


def test_run_started_links_the_checkpoint_it_resumed_from(api, token, project):
    api.post_events(token, saved(run="old", step=10))
    checkpoint = Checkpoint.objects.get(run__key="old")
    api.post_events(token, event("run.started", run="new", resumed_from=checkpoint.pk))
    run = Run.objects.get(key="new")
    assert run.resumed_from == checkpoint
    assert run.resumed_from_ref == str(checkpoint.pk)


def test_heartbeat_records_step_and_metrics(api, token):
    api.post_events(token, event("run.heartbeat", t=5, step=42, metrics={"loss": 1.5}))
    run = Run.objects.get(key="run-1")
    assert run.last_step == 42
    assert run.last_metrics == {"loss": 1.5}
    assert run.last_heartbeat_at.isoformat() == "2026-11-30T12:00:05+00:00"


def test_checkpoint_saved_records_the_checkpoint_and_its_files(api, token, project):
    response = api.post_events(token, saved(step=100))
    assert response.status_code == 202, response.content
    checkpoint = Checkpoint.objects.get(run__key="run-1", step=100)
    assert checkpoint.project == project
    assert checkpoint.status == "reported"
    assert checkpoint.location == "/data/run-1/step-100"
    assert checkpoint.total_size == 1500
    assert checkpoint.file_count == 2
    assert checkpoint.epoch == 1
    assert checkpoint.save_seconds == 1.5
    assert checkpoint.metrics == {"loss": 0.25}
    assert checkpoint.format == "torch"
    files = sorted(CheckpointFile.objects.filter(checkpoint=checkpoint).values_list("path", "size"))
    assert files == [("model.pt", 1000), ("optim.pt", 500)]
    assert checkpoint.files.get(path="model.pt").sha256 == SHA


def test_checkpoint_started_then_saved_moves_from_saving_to_reported(api, token):
    api.post_events(token, event("checkpoint.started", step=200))
    assert Checkpoint.objects.get(step=200).status == "saving"
    api.post_events(token, saved(step=200, t=3))
    assert Checkpoint.objects.get(step=200).status == "reported"


def test_checkpoint_failed_marks_the_save_failed_with_its_error(api, token):
    api.post_events(token, event("checkpoint.started", step=300))
    api.post_events(token, event("checkpoint.failed", t=2, step=300, error="disk full"))
    checkpoint = Checkpoint.objects.get(step=300)
    assert checkpoint.status == "failed"
    assert checkpoint.error == "disk full"


@pytest.mark.parametrize("kind,status", [("run.finished", "finished"), ("run.failed", "failed")])
def test_run_end_events_set_status_exit_code_and_error(api, token, kind, status):
    api.post_events(token, event("run.started"))
    api.post_events(token, event(kind, t=60, exit_code=3, error="CUDA error: out of memory"))
    run = Run.objects.get(key="run-1")
    assert run.status == status
    assert run.exit_code == 3
    assert run.error == "CUDA error: out of memory"
    assert run.ended_at.isoformat() == "2026-11-30T12:01:00+00:00"


def test_metrics_events_store_per_step_values_and_merge_keys(api, token):
    points = [{"step": 1, "values": {"loss": 2.0}}, {"step": 2, "values": {"loss": 1.5}}]
    api.post_events(token, event("metrics", points=points))
    api.post_events(token, event("metrics", t=1, points=[{"step": 2, "values": {"acc": 0.5}}]))
    stored = dict(MetricPoint.objects.values_list("step", "values"))
    assert stored == {1: {"loss": 2.0}, 2: {"loss": 1.5, "acc": 0.5}}


def test_every_event_is_kept_in_the_log_with_its_actor(api, token, project):
    sent = [
        event("run.started", t=0),
        event("run.heartbeat", t=1, step=1),
        event("checkpoint.started", t=2, step=10),
        saved(t=3, step=10),
        event("metrics", t=4, points=[{"step": 1, "values": {"loss": 1.0}}]),
        event("run.finished", t=5, exit_code=0),
    ]
    assert api.post_events(token, {"events": sent}).status_code == 202
    logged = Event.objects.filter(project=project).order_by("time")
    assert [e.type for e in logged] == [e["type"] for e in sent]
    assert {e.actor for e in logged} == {"token:all"}
    assert logged[3].data["files"][0]["sha256"] == SHA
    assert logged[3].step == 10


def test_a_batch_is_applied_in_one_request(api, token):
    batch = [saved(run=f"run-{i % 4}", step=i, t=i) for i in range(200)]
    response = api.post_events(token, {"events": batch})
    assert response.status_code == 202
    body = response.json()
    assert (body["accepted"], body["created"], body["duplicates"]) == (200, 200, 0)
    assert [r["id"] for r in body["results"]] == [e["id"] for e in batch]
    assert Checkpoint.objects.count() == 200
    assert Run.objects.count() == 4
    assert CheckpointFile.objects.count() == 400


def test_a_gzip_body_is_accepted(api, token):
    response = api.post_gzip(token, {"events": [saved(step=s) for s in range(3)]})
    assert response.status_code == 202, response.content
    assert Checkpoint.objects.count() == 3


def test_nan_metrics_are_kept_visible_as_strings(api, token):
    # Python's json.dumps writes NaN for a diverged loss; JSON and jsonb have no NaN.
    raw = (
        b'{"id": "6f1b5c1e-0d7b-4d53-9b43-3b0c9b7a1e01", "type": "run.heartbeat", '
        b'"run": "run-1", "time": "2026-11-30T12:00:00Z", "step": 7, '
        b'"metrics": {"loss": NaN, "grad_norm": Infinity}}'
    )
    response = api.post_events(token, None, raw=raw)
    assert response.status_code == 202, response.content
    assert Run.objects.get(key="run-1").last_metrics == {"loss": "NaN", "grad_norm": "Infinity"}


def test_ingest_work_is_bounded_whatever_the_batch_size(api, token, django_assert_max_num_queries):
    from django.db import connection

    api.post_events(token, event("run.started"))  # the token's last-used stamp is written
    with django_assert_max_num_queries(12):
        api.post_events(token, saved(step=1))
    # One statement per table on PostgreSQL; SQLite splits inserts at 999 parameters.
    limit = 12 if connection.vendor == "postgresql" else 40
    with django_assert_max_num_queries(limit):
        api.post_events(token, {"events": [saved(step=s, t=s) for s in range(2, 502)]})
    assert Checkpoint.objects.count() == 501


def test_unknown_fields_are_kept_for_newer_clients(api, token):
    api.post_events(token, event("run.heartbeat", step=1, gpu_util=0.93))
    assert Event.objects.get().data["gpu_util"] == 0.93


def test_times_with_offsets_are_normalised(api, token):
    api.post_events(token, {**event("run.started"), "time": "2026-11-30T14:00:00+02:00"})
    assert Run.objects.get().started_at.isoformat() == at(0).replace("Z", "+00:00")
