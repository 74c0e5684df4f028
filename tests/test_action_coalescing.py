"""Actions through one door: the API and the dashboard ask for a check or a restore test
through the same domain functions, which lock the checkpoint, write one audit Event and
coalesce a repeat into the request already queued (webapp/domain/actions/).
The tasks are read back from the real Redis queue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tests.support.celery_workers import queued_tasks
from tests.support.concurrency import run_together
from tests.support.dashboard import as_user, make_checkpoint, make_run, with_replica
from webapp.domain.models import Event, Validation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def audit(type_: str) -> list[Event]:
    return list(Event.objects.filter(type=type_))


def test_validate_twice_queues_one_check_and_the_second_answer_names_it(
    api, token, project, queues
):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    first = api.post(token, f"/checkpoints/{checkpoint.pk}/validate")
    second = api.post(token, f"/checkpoints/{checkpoint.pk}/validate")
    assert (first.status_code, second.status_code) == (202, 202)
    [validation] = Validation.objects.all()
    assert (validation.kind, validation.status, validation.requested_by) == (
        "integrity",
        "queued",
        "token:all",
    )
    assert first.json() == {
        "checkpoint": checkpoint.pk,
        "validation": validation.pk,
        "status": "queued",
        "coalesced": False,
        "message": f"check {validation.pk} queued",
    }
    assert second.json()["validation"] == validation.pk and second.json()["coalesced"] is True
    assert "already queued" in second.json()["message"]
    [event] = audit("checkpoint.validation_requested")
    assert (event.actor, event.step, event.data) == ("token:all", 10, {"validation": validation.pk})
    [task] = queued_tasks(queues)
    assert task["args"] == [checkpoint.pk] and task["kwargs"]["revalidate"] is True


def test_the_dashboard_and_the_api_coalesce_into_the_same_check(
    api, token, project, operator, queues
):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    html = (
        as_user(operator)
        .post(f"/p/alpha/checkpoints/{checkpoint.pk}/validate/", HTTP_HX_REQUEST="true")
        .content.decode()
    )
    assert "queued for a check" in html
    again = api.post(token, f"/checkpoints/{checkpoint.pk}/validate").json()
    [validation] = Validation.objects.all()
    assert again["validation"] == validation.pk and again["coalesced"] is True
    html = (
        as_user(operator)
        .post(f"/p/alpha/checkpoints/{checkpoint.pk}/validate/", HTTP_HX_REQUEST="true")
        .content.decode()
    )
    assert "A check of step 10 is already queued" in html
    assert len(audit("checkpoint.validation_requested")) == 1
    assert len(queued_tasks(queues)) == 1


def test_a_finished_check_does_not_absorb_a_new_request(api, token, project, queues):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    first = api.post(token, f"/checkpoints/{checkpoint.pk}/validate").json()
    Validation.objects.filter(pk=first["validation"]).update(status="passed")
    second = api.post(token, f"/checkpoints/{checkpoint.pk}/validate").json()
    assert second["coalesced"] is False and second["validation"] != first["validation"]
    assert len(audit("checkpoint.validation_requested")) == 2


def test_a_request_queued_too_long_ago_is_presumed_lost_and_published_again(
    api, token, project, queues, settings
):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    first = api.post(token, f"/checkpoints/{checkpoint.pk}/validate").json()
    queues.delete("validate")  # the broker lost the message
    long_ago = timezone.now() - timedelta(seconds=settings.VALIDATION_TIMEOUT_S + 601)
    Validation.objects.filter(pk=first["validation"]).update(created_at=long_ago)
    second = api.post(token, f"/checkpoints/{checkpoint.pk}/validate").json()
    # The same row (the worker's claim takes it up), published again, audited again.
    assert second["validation"] == first["validation"] and second["coalesced"] is False
    assert Validation.objects.count() == 1
    assert len(queued_tasks(queues)) == 1
    assert len(audit("checkpoint.validation_requested")) == 2


def test_a_refused_validate_is_a_409_with_nothing_stored(api, token, project):
    checkpoint = make_checkpoint(make_run(project, "r"), 10, status="failed")
    response = api.post(token, f"/checkpoints/{checkpoint.pk}/validate")
    assert response.status_code == 409
    assert "step 10 was never saved" in response.json()["error"]
    assert not Validation.objects.exists() and not Event.objects.exists()


def test_restore_test_twice_queues_one_and_audits_once(api, token, project, queues):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    replica = with_replica(checkpoint, status="uploading")
    response = api.post(token, f"/checkpoints/{checkpoint.pk}/restore-test")
    assert response.status_code == 409 and "no verified replica" in response.json()["error"]
    assert not Validation.objects.exists() and not Event.objects.exists()
    replica.status = "verified"
    replica.save()
    first = api.post(token, f"/checkpoints/{checkpoint.pk}/restore-test")
    second = api.post(token, f"/checkpoints/{checkpoint.pk}/restore-test")
    assert (first.status_code, second.status_code) == (202, 202)
    [validation] = Validation.objects.all()
    assert (validation.kind, validation.status) == ("restore", "queued")
    assert first.json()["validation"] == second.json()["validation"] == validation.pk
    assert (first.json()["coalesced"], second.json()["coalesced"]) == (False, True)
    [event] = audit("checkpoint.restore_test_requested")
    assert (event.actor, event.step, event.data) == ("token:all", 10, {"validation": validation.pk})
    assert [t["args"] for t in queued_tasks(queues, "restore")] == [[validation.pk]]


def test_a_restore_test_asked_on_the_page_is_the_one_the_api_names(
    api, token, project, operator, queues
):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    with_replica(checkpoint)
    as_user(operator).post(f"/p/alpha/checkpoints/{checkpoint.pk}/restore-test/")
    [validation] = Validation.objects.all()
    again = api.post(token, f"/checkpoints/{checkpoint.pk}/restore-test").json()
    assert again["validation"] == validation.pk and again["coalesced"] is True
    assert [e.actor for e in audit("checkpoint.restore_test_requested")] == ["user:otto"]
    assert len(queued_tasks(queues, "restore")) == 1


def test_replicate_twice_queues_each_copy_once_from_either_door(
    api, token, project, operator, queues
):
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    with_replica(checkpoint, status="failed")  # target "backup", to be tried again
    first = api.post(token, f"/checkpoints/{checkpoint.pk}/replicate").json()
    assert len(first["replicas"]) == 1
    second = api.post(token, f"/checkpoints/{checkpoint.pk}/replicate").json()
    assert second["replicas"] == [] and second["message"] == "already replicated"
    html = (
        as_user(operator)
        .post(f"/p/alpha/checkpoints/{checkpoint.pk}/replicate/", HTTP_HX_REQUEST="true")
        .content.decode()
    )
    assert "Nothing to queue" in html
    [event] = audit("checkpoint.replication_requested")
    assert event.data == {"replicas": first["replicas"]} and "token:all asked" in event.message
    assert len(queued_tasks(queues, "replicate")) == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no row locks")
@pytest.mark.parametrize("action", ["validate", "restore-test"])
def test_requests_at_the_same_moment_make_one_request(token, project, queues, action):
    from django.db import close_old_connections
    from django.test import Client

    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    with_replica(checkpoint)
    answers = []

    def ask():
        try:
            response = Client().post(
                f"/api/v1/checkpoints/{checkpoint.pk}/{action}",
                HTTP_AUTHORIZATION=f"Bearer {token}",
            )
            answers.append((response.status_code, response.json()))
        finally:
            close_old_connections()
            connection.close()

    run_together(ask, [()] * 8)
    [validation] = Validation.objects.all()
    assert sorted(a[0] for a in answers) == [202] * 8
    assert {a[1]["validation"] for a in answers} == {validation.pk}
    assert sorted(a[1]["coalesced"] for a in answers) == [False] + [True] * 7
    assert Event.objects.filter(type__endswith="_requested").count() == 1
