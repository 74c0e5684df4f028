"""A repeated event id is accepted and changes nothing, also when copies race."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import Client

from tests.support.api_client import Api
from tests.support.events import event, saved
from webapp.domain.models import Checkpoint, Event, MetricPoint, Run

pytestmark = pytest.mark.sqlite


@pytest.mark.django_db
def test_a_repeated_event_is_accepted_and_changes_nothing(api, token):
    first = saved(step=10)
    assert api.post_events(token, first).json()["created"] == 1
    Checkpoint.objects.update(status="verified")
    response = api.post_events(token, first)
    assert response.status_code == 202
    assert response.json()["results"] == [{"id": first["id"], "status": "duplicate"}]
    assert Event.objects.count() == 1
    assert Checkpoint.objects.get().status == "verified"


@pytest.mark.django_db
def test_a_repeat_inside_one_batch_counts_once(api, token):
    heartbeat = event("run.heartbeat", step=5)
    response = api.post_events(token, {"events": [heartbeat, heartbeat]})
    body = response.json()
    assert (body["created"], body["duplicates"]) == (1, 1)
    assert [r["status"] for r in body["results"]] == ["created", "duplicate"]
    assert Event.objects.count() == 1


@pytest.mark.django_db
def test_a_replayed_spool_mixing_old_and_new_events_applies_only_the_new(api, token):
    old = [saved(step=s, t=s) for s in range(5)]
    api.post_events(token, {"events": old})
    new = [saved(step=s, t=s) for s in range(5, 8)]
    body = api.post_events(token, {"events": old + new}).json()
    assert (body["created"], body["duplicates"]) == (3, 5)
    assert Checkpoint.objects.count() == 8


@pytest.mark.django_db
def test_metrics_repeated_do_not_double_anything(api, token):
    metrics = event("metrics", points=[{"step": 1, "values": {"loss": 1.0}}])
    api.post_events(token, metrics)
    api.post_events(token, metrics)
    assert MetricPoint.objects.count() == 1


@pytest.mark.django_db
def test_the_same_event_id_in_two_projects_is_two_events(api, token, other_project):
    other_token = other_project.issue_token("t", ["ingest"])[1]
    shared = saved(step=1)
    assert api.post_events(token, shared).json()["created"] == 1
    assert api.post_events(other_token, shared).json()["created"] == 1
    assert Checkpoint.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_copies_of_the_same_events_are_applied_exactly_once(project):
    """Eight clients post the same 25 events at the same moment, each over its own
    database connection; every event is created once and only once."""
    token = project.issue_token("race", ["ingest"])[1]
    events = [saved(run=f"run-{i % 3}", step=i, t=i) for i in range(25)]
    events += [event("metrics", run="run-0", t=99, points=[{"step": 1, "values": {"l": 1.0}}])]
    clients = 8
    barrier = threading.Barrier(clients)
    results: list[dict] = []
    errors: list[BaseException] = []

    def post_all():
        try:
            api = Api(Client())
            barrier.wait()
            for one in events:
                response = api.post_events(token, one)
                assert response.status_code == 202, response.content
                results.append(response.json()["results"][0])
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=post_all) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors, errors
    created = [r["id"] for r in results if r["status"] == "created"]
    assert sorted(created) == sorted(e["id"] for e in events)
    assert len(results) == clients * len(events)
    assert Event.objects.count() == len(events)
    assert Checkpoint.objects.count() == 25
    assert Run.objects.count() == 3
    assert MetricPoint.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_over_the_same_runs_do_not_deadlock(project):
    """Batches that touch the same runs in opposite orders wait for each other."""
    token = project.issue_token("race", ["ingest"])[1]
    forward = [saved(run=f"run-{i}", step=1, t=i) for i in range(6)]
    backward = [saved(run=f"run-{i}", step=2, t=i) for i in reversed(range(6))]
    barrier = threading.Barrier(2)
    statuses: list[int] = []

    def post(batch):
        try:
            barrier.wait()
            for _ in range(5):
                statuses.append(Api(Client()).post_events(token, {"events": batch}).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(b,)) for b in (forward, backward)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [202] * 10
    assert Checkpoint.objects.count() == 12
