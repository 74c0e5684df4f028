"""Bad requests get a clear JSON error, and nothing of the request is stored."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from tests.support.events import event, saved
from webapp.domain.models import Checkpoint, Event, Run

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def assert_nothing_stored():
    assert Event.objects.count() == 0
    assert Run.objects.count() == 0
    assert Checkpoint.objects.count() == 0


def test_it_rejects_bad_json(api, token):
    response = api.post_events(token, None, raw=b'{"id": "x", "type": ')
    assert response.status_code == 400
    assert response.json()["error"].startswith("body is not valid JSON")
    assert_nothing_stored()


def test_it_rejects_a_body_that_is_not_utf8(api, token):
    response = api.post_events(token, None, raw=b'{"run": "\xff\xfe"}')
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]


def test_it_rejects_an_empty_body(api, token):
    response = api.post_events(token, None, raw=b"")
    assert response.status_code == 400
    assert response.json()["error"].startswith("empty body")


def test_it_rejects_a_body_that_is_neither_event_nor_batch(api, token):
    response = api.post_events(token, [1, 2])
    assert response.status_code == 400
    assert response.json()["error"] == 'body must be one event object or {"events": [...]}'


def test_it_rejects_an_unknown_type_naming_the_index(api, token):
    batch = [saved(step=1), event("run.exploded")]
    response = api.post_events(token, {"events": batch})
    assert response.status_code == 400
    body = response.json()
    assert body["index"] == 1
    assert body["field"] == "type"
    assert body["error"].startswith("events[1].type: unknown event type 'run.exploded'")
    assert_nothing_stored()


@pytest.mark.parametrize("missing", ["id", "run", "time", "type"])
def test_it_rejects_a_missing_envelope_field(api, token, missing):
    bad = event("run.heartbeat", step=1)
    del bad[missing]
    response = api.post_events(token, {"events": [saved(), bad]})
    assert response.status_code == 400
    assert response.json() == {
        "error": f"events[1].{missing}: is required",
        "index": 1,
        "field": missing,
    }
    assert_nothing_stored()


@pytest.mark.parametrize("missing", ["step", "location", "files"])
def test_it_rejects_a_checkpoint_saved_without_its_fields(api, token, missing):
    bad = saved()
    del bad[missing]
    response = api.post_events(token, bad)
    assert response.status_code == 400
    assert response.json()["error"] == f"events[0].{missing}: is required"


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("step", "100", "events[0].step: must be an integer"),
        ("step", 100.5, "events[0].step: must be an integer"),
        ("step", -1, "events[0].step: input should be greater than or equal to 0"),
        ("time", "2026-11-30T12:00:00", "events[0].time: must carry a time zone (Z or +00:00)"),
        ("time", 1764504000, "events[0].time: must be an ISO 8601 string"),
        ("id", "not-a-uuid", "events[0].id: 'not-a-uuid' is not a UUID"),
        ("run", "", "events[0].run: string should have at least 1 character"),
        ("run", "a\nb", "events[0].run: must not contain control characters"),
        ("location", "relative/path", "events[0].location: must be an absolute path or an s3://"),
        ("files", [], "events[0].files: list should have at least 1 item"),
        ("metrics", {"loss": "low"}, "events[0].metrics.loss: must be a number"),
        ("metrics", {"loss": True}, "events[0].metrics.loss: must be a number"),
        ("save_seconds", "1.5", "events[0].save_seconds: must be a number"),
    ],
)
def test_it_rejects_wrong_types_naming_the_field(api, token, field, value, message):
    bad = saved()
    bad[field] = value
    response = api.post_events(token, bad)
    assert response.status_code == 400
    assert response.json()["error"].startswith(message), response.json()
    assert_nothing_stored()


@pytest.mark.parametrize(
    "file,message",
    [
        ({"path": "../../etc/passwd", "size": 1, "sha256": "ab" * 32}, "files[0].path: must be"),
        ({"path": "/etc/passwd", "size": 1, "sha256": "ab" * 32}, "files[0].path: must be"),
        ({"path": "a.pt", "size": -1, "sha256": "ab" * 32}, "files[0].size: input should be"),
        ({"path": "a.pt", "size": 1, "sha256": "xyz"}, "files[0].sha256: must be 64 hex"),
        ({"path": "a.pt", "size": 1}, "files[0].sha256: is required"),
    ],
)
def test_it_rejects_bad_file_entries(api, token, file, message):
    response = api.post_events(token, saved(files=[file]))
    assert response.status_code == 400
    assert response.json()["error"].startswith(f"events[0].{message}"), response.json()


BIG = 2**63  # one more than a bigint column holds


@pytest.mark.parametrize(
    "body,message",
    [
        (saved(step=BIG), "events[0].step: input should be less than or equal to"),
        (saved(epoch=2**31), "events[0].epoch: input should be less than or equal to"),
        (
            saved(files=[{"path": "a.pt", "size": BIG, "sha256": "ab" * 32}]),
            "events[0].files[0].size: input should be less than or equal to",
        ),
        (
            saved(
                files=[{"path": f"{i}.pt", "size": 2**50, "sha256": "ab" * 32} for i in range(9)]
            ),
            "events[0].files: the files' sizes add up to more than",
        ),
        (event("run.started", world_size=2**31), "events[0].world_size: input should be less"),
        (event("run.started", resumed_from=-BIG - 1), "events[0].resumed_from"),
        (event("run.failed", exit_code=2**31), "events[0].exit_code: input should be less"),
        (event("metrics", points=[{"step": BIG, "values": {}}]), "events[0].points[0].step"),
    ],
)
def test_it_rejects_numbers_beyond_what_the_database_holds(api, token, body, message):
    # A value that fits no column would fail the transaction: a 500, the whole batch lost.
    response = api.post_events(token, body)
    assert response.status_code == 400, response.json()
    assert response.json()["error"].startswith(message), response.json()
    assert_nothing_stored()


@pytest.mark.parametrize("value", [True, False, 1.5, [1], {"id": 1}])
def test_a_resumed_from_that_is_neither_an_id_nor_a_name_is_refused(api, token, value):
    # true would otherwise read as checkpoint 1 (bool is an int in Python): a job could
    # name a checkpoint it never saw, and the goodput ledger would join it to that family.
    response = api.post_events(token, event("run.started", resumed_from=value))
    assert response.status_code == 400, response.json()
    assert response.json()["error"].startswith("events[0].resumed_from"), response.json()
    assert_nothing_stored()


def test_the_largest_numbers_allowed_are_accepted_and_stored(api, token):
    # The bounds of event_schema.py (tests/test_event_bounds.py has each edge), all within
    # what the columns hold.
    body = saved(step=2**53 - 1, epoch=2**31 - 1)
    body["files"] = [{"path": "a.pt", "size": 2**50, "sha256": "ab" * 32}]
    response = api.post_events(token, {"events": [body, event("run.failed", exit_code=-(2**31))]})
    assert response.status_code == 202, response.json()
    checkpoint = Checkpoint.objects.get()
    assert (checkpoint.step, checkpoint.epoch, checkpoint.total_size) == (
        2**53 - 1,
        2**31 - 1,
        2**50,
    )
    assert Run.objects.get().exit_code == -(2**31)


def test_it_rejects_nul_characters(api, token):
    response = api.post_events(token, event("run.started", name="a\x00b"))
    assert response.status_code == 400
    assert "NUL" in response.json()["error"]
    assert_nothing_stored()


def test_it_rejects_more_than_1000_events_with_413(api, token):
    response = api.post_events(token, {"events": [saved(step=i) for i in range(1001)]})
    assert response.status_code == 413
    assert response.json()["error"] == "a batch holds at most 1000 events; got 1001"
    assert_nothing_stored()


@override_settings(EVENTS_MAX_BODY_BYTES=4096)
def test_it_rejects_a_body_over_the_limit_with_413(api, token):
    batch = {"events": [saved(step=i) for i in range(20)]}
    assert len(json.dumps(batch)) > 4096
    response = api.post_events(token, batch)
    assert response.status_code == 413
    assert "the limit is 4096" in response.json()["error"]
    assert_nothing_stored()


@override_settings(EVENTS_MAX_BODY_BYTES=4096)
def test_it_rejects_a_gzip_body_that_inflates_over_the_limit(api, token):
    # 1 MB of spaces compresses to about 1 KB: a small bomb.
    bomb = {"events": [saved()], "padding": " " * 1_000_000}
    response = api.post_gzip(token, bomb)
    assert response.status_code == 413
    assert "decompressed body is over the limit" in response.json()["error"]


def test_it_rejects_an_unknown_content_encoding(api, token):
    response = api.post_events(token, saved(), headers={"Content-Encoding": "br"})
    assert response.status_code == 415


def test_it_rejects_a_missing_token_with_401(api):
    response = api.post_events(None, saved())
    assert response.status_code == 401
    assert response.json()["error"].startswith("missing API token")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert_nothing_stored()


def test_it_rejects_an_unknown_token_with_401(api, project):
    response = api.post_events("lb_not-a-real-token", saved())
    assert response.status_code == 401
    assert response.json() == {"error": "unknown or revoked API token"}


def test_it_rejects_a_revoked_token_with_401(api, project):
    from django.utils import timezone

    token, secret = project.issue_token("old", ["ingest"])
    token.revoked_at = timezone.now()
    token.save()
    assert api.post_events(secret, saved()).status_code == 401


def test_it_rejects_a_token_without_the_ingest_scope_with_403(api, read_token):
    response = api.post_events(read_token, saved())
    assert response.status_code == 403
    assert response.json()["error"] == "this token lacks the 'ingest' scope (it has: read)"
    assert_nothing_stored()


def test_errors_from_unknown_api_paths_are_json(client):
    response = client.get("/api/v1/nowhere")
    assert response.status_code == 404
    assert response.json() == {"error": "no API endpoint at /api/v1/nowhere"}
