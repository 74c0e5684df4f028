"""POST /api/v1/events has one door: webapp/api/ingest_asgi.py, the ASGI application
production serves, which every in-process test of events goes through (call_asgi). What
it answers, what it leaves to Django, and that the OpenAPI document describes it."""

from __future__ import annotations

import gzip
import http.client
import importlib
import json
import re
import socket
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.support.api_client import call_asgi
from tests.support.events import event, saved
from tests.support.servers import WebServer
from webapp.domain.models import Event

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

BAD = {
    # case: (headers, body, status, the answer's JSON)
    "bad json": ({}, b'{"id": "x", "type": ', 400, "body is not valid JSON"),
    "empty body": ({}, b"", 400, 'empty body: send one event or {"events": [...]}'),
    "neither event nor batch": (
        {}, b"[1, 2]", 400, 'body must be one event object or {"events": [...]}'
    ),
    "empty batch": ({}, b'{"events": []}', 400, "events is empty"),
    "batch too large": (
        {},
        json.dumps({"events": [saved(step=i) for i in range(1001)]}),
        413,
        "a batch holds at most 1000 events; got 1001",
    ),
    "bad gzip": ({"Content-Encoding": "gzip"}, b"not gzip", 400, "body is not valid gzip"),
    "unknown encoding": (
        {"Content-Encoding": "br"},
        json.dumps(saved()),
        415,
        "Content-Encoding 'br' is not supported; use gzip",
    ),
    "NUL in a string": (
        {}, json.dumps(saved(run="a\u0000b")), 400, "strings must not contain NUL (\\u0000)"
    ),
}  # fmt: skip

NAMED = {
    # case: (body, index, field): a bad event of a batch is named
    "unknown type": (json.dumps({"events": [saved(step=1), event("run.exploded")]}), 1, "type"),
    "missing field": (json.dumps({k: v for k, v in saved().items() if k != "run"}), 0, "run"),
    "wrong type": (json.dumps(saved(step="5")), 0, "step"),
}


def _auth(token: str, **headers) -> dict:
    return {"Authorization": f"Bearer {token}", **headers}


def _json_headers(answer) -> None:
    assert answer["content-type"] == "application/json"
    assert answer["x-content-type-options"] == "nosniff"
    # Django's clickjacking middleware marks what went through Django; the route does not.
    assert "x-frame-options" not in answer.headers


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_request_is_refused_with_its_reason_and_nothing_is_stored(token, case):
    headers, body, status, message = BAD[case]
    body = body.encode() if isinstance(body, str) else body
    answer = call_asgi("/api/v1/events", body, _auth(token, **headers))
    assert answer.status_code == status
    assert answer.json()["error"].startswith(message), answer.json()
    _json_headers(answer)
    assert not Event.objects.exists()


@pytest.mark.parametrize("case", sorted(NAMED))
def test_a_bad_event_is_named_by_its_index_and_field(token, case):
    body, index, field = NAMED[case]
    answer = call_asgi("/api/v1/events", body.encode(), _auth(token))
    assert answer.status_code == 400
    assert (answer.json()["index"], answer.json()["field"]) == (index, field)
    assert not Event.objects.exists()


@pytest.mark.parametrize(
    ("case", "headers", "body", "count"),
    [
        ("one event", {}, json.dumps(saved(step=7)).encode(), 1),
        ("gzip", {"Content-Encoding": "gzip"}, gzip.compress(json.dumps(saved()).encode()), 1),
        # Read on the event loop, stored in the pool (GROUP_BELOW events or more).
        ("batch", {}, json.dumps({"events": [saved(step=i) for i in range(120)]}).encode(), 120),
    ],
)
def test_events_are_stored_once_and_a_repeat_is_a_duplicate(token, case, headers, body, count):
    first = call_asgi("/api/v1/events", body, _auth(token, **headers))
    again = call_asgi("/api/v1/events", body, _auth(token, **headers))
    assert first.status_code == again.status_code == 202
    assert (first.json()["created"], first.json()["duplicates"]) == (count, 0)
    assert (again.json()["created"], again.json()["duplicates"]) == (0, count)
    assert {r["status"] for r in again.json()["results"]} == {"duplicate"}
    _json_headers(first)


@pytest.mark.parametrize(
    ("authorization", "status", "message"),
    [
        (None, 401, "missing API token"),
        ("Basic abc", 401, "missing API token"),
        ("Bearer", 401, "unknown or revoked API token"),
        ("Bearer lb_unknown", 401, "unknown or revoked API token"),
        ("read", 403, "this token lacks the 'ingest' scope (it has: read)"),
    ],
)
def test_a_request_without_an_ingest_token_is_refused(read_token, authorization, status, message):
    if authorization == "read":
        authorization = f"Bearer {read_token}"
    headers = {"Authorization": authorization} if authorization else {}
    answer = call_asgi("/api/v1/events", json.dumps(saved()).encode(), headers)
    assert answer.status_code == status
    assert answer.json()["error"].startswith(message)
    if status == 401:
        assert answer["WWW-Authenticate"] == 'Bearer realm="lifeboat"'


def test_a_body_over_the_limit_is_refused_before_it_is_read(token, settings):
    settings.EVENTS_MAX_BODY_BYTES = 2048
    answer = call_asgi("/api/v1/events", b"x" * 4096, _auth(token))
    assert answer.status_code == 413
    assert answer.json() == {"error": "request body is 4096 bytes; the limit is 2048"}


def test_a_batch_in_many_pieces_is_read_whole(api, token):
    # 600 events are about 250 KB: call_asgi hands the body over in 64 KiB pieces.
    batch = {"events": [saved(step=i) for i in range(600)]}
    body = json.dumps(batch).encode()
    assert len(body) > 3 * 65536
    answer = call_asgi("/api/v1/events", body, _auth(token))
    assert answer.status_code == 202 and answer.json()["created"] == 600


def test_other_methods_on_the_route_are_refused_and_other_paths_go_to_django(token):
    for method in ("GET", "PUT", "DELETE"):
        wrong = call_asgi("/api/v1/events", b"", _auth(token), method=method)
        assert wrong.status_code == 405 and wrong["Allow"] == "POST"
        assert wrong.json() == {
            "error": f"{method} is not allowed at /api/v1/events; allowed: POST"
        }
    listed = call_asgi("/api/v1/runs", b"", _auth(token), method="GET")
    assert listed.status_code == 200 and "x-frame-options" in listed.headers, listed.content
    assert listed.json()["runs"] == []
    # Not the route: a trailing slash is Django's, and no endpoint there.
    slashed = call_asgi("/api/v1/events/", b"{}", _auth(token))
    assert slashed.status_code == 404 and slashed.json()["error"].startswith("no API endpoint")


def test_the_openapi_document_describes_what_the_door_answers(client, token):
    doc = client.get("/api/v1/openapi.json").json()
    operation = doc["paths"]["/api/v1/events"]["post"]
    assert operation["security"] == [{"TokenAuth": []}]
    assert set(operation["responses"]) == {"202", "400", "401", "403", "413", "415"}
    schemas = doc["components"]["schemas"]
    accepted = call_asgi("/api/v1/events", json.dumps(saved()).encode(), _auth(token)).json()
    assert set(accepted) == set(schemas["IngestOut"]["required"])
    assert set(accepted["results"][0]) == set(schemas["EventResult"]["required"])
    refused = call_asgi("/api/v1/events", json.dumps(saved(step="x")).encode(), _auth(token))
    assert set(refused.json()) <= set(schemas["EventErrorOut"]["properties"])
    # The body: one event of any type, or a batch of them.
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["oneOf"][0] == {"$ref": "#/components/schemas/AnyEvent"}
    assert "CheckpointSaved" in json.dumps(schemas["AnyEvent"])


def test_webapp_wsgi_refuses_to_serve_and_names_the_command_to_use():
    # A WSGI server pointed at webapp.wsgi would serve the pages and drop every event.
    sys.modules.pop("webapp.wsgi", None)
    with pytest.raises(ImproperlyConfigured, match="gunicorn webapp.asgi -k"):
        importlib.import_module("webapp.wsgi")


@pytest.mark.django_db(transaction=True)
def test_the_served_application_under_gunicorn(project, worker_env):
    """webapp.asgi as production serves it (gunicorn, uvicorn workers): the ingest route
    on the event loop, and Django's pages, forms and API in the thread pool."""
    token = project.issue_token("t", ["ingest", "read"])[1]
    web = WebServer(worker_env, EVENTS_MAX_BODY_BYTES="65536")
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)

        def ask(method, path, body=None, headers=None):
            conn.request(method, path, body=body, headers=headers or {})
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()

        # Events, one keep-alive connection: a single event, then a batch (the pool's).
        status, _, body = ask("POST", "/api/v1/events", json.dumps(saved(step=1)), auth)
        assert status == 202 and json.loads(body)["created"] == 1
        batch = {"events": [saved(step=s, location=f"/c/{s}") for s in range(2, 12)]}
        status, _, body = ask("POST", "/api/v1/events", json.dumps(batch), auth)
        assert status == 202 and json.loads(body)["created"] == 10
        # A body declared over the limit: refused before it is sent.
        conn.putrequest("POST", "/api/v1/events")
        for name, value in {**auth, "Content-Length": "100000"}.items():
            conn.putheader(name, value)
        conn.endheaders()
        answer = conn.getresponse()
        assert answer.status == 413 and b"the limit is 65536" in answer.read()
        conn.close()

        # A client that goes away halfway through its body: nothing stored, server fine.
        half = json.dumps(saved(step=99)).encode()
        with socket.create_connection(("127.0.0.1", web.port)) as raw:
            raw.sendall(
                b"POST /api/v1/events HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {token}\r\nContent-Length: {len(half)}\r\n\r\n".encode()
                + half[: len(half) // 2]
            )
        conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
        # Django's side: the read API, a page with its CSRF form, and a static file.
        status, _, body = ask("GET", "/api/v1/runs", headers=auth)
        assert status == 200 and [r["key"] for r in json.loads(body)["runs"]] == ["run-1"]
        status, headers, page = ask("GET", "/accounts/login/")
        assert status == 200 and b"csrfmiddlewaretoken" in page
        assert "csrftoken=" in headers.get("set-cookie", "") and "x-frame-options" in headers
        stylesheet = re.search(rb'href="(/static/[^"]+\.css)"', page)
        assert stylesheet, "the login page links a stylesheet"
        status, _, css = ask("GET", stylesheet.group(1).decode())
        assert status == 200 and css
        conn.close()
    finally:
        web.stop()
    assert sorted(Event.objects.values_list("step", flat=True)) == list(range(1, 12))
