"""POST /api/v1/events has two doors: webapp/api/ingest_asgi.py, which production
serves (every other in-process test of events goes through it), and the ninja view
behind Django's request cycle (the OpenAPI document; webapp.wsgi for a plain WSGI
server; Django's test client). They must give the same answers; only the view goes
through Django's middleware."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.conftest import call_asgi, call_wsgi, event, saved

pytestmark = pytest.mark.django_db

CASES = {
    "bad json": ({}, b'{"id": "x", "type": '),
    "empty body": ({}, b""),
    "neither event nor batch": ({}, b"[1, 2]"),
    "unknown type": ({}, json.dumps({"events": [saved(step=1), event("run.exploded")]})),
    "missing field": ({}, json.dumps({k: v for k, v in saved().items() if k != "run"})),
    "wrong type": ({}, json.dumps(saved(step="5"))),
    "empty batch": ({}, b'{"events": []}'),
    "batch too large": ({}, json.dumps({"events": [saved(step=i) for i in range(1001)]})),
    "bad gzip": ({"Content-Encoding": "gzip"}, b"not gzip"),
    "unknown encoding": ({"Content-Encoding": "br"}, json.dumps(saved())),
    "gzip": ({"Content-Encoding": "gzip"}, gzip.compress(json.dumps(saved(step=7)).encode())),
    "NUL in a string": ({}, json.dumps(saved(run="a\u0000b"))),
    # Read on the event loop, stored in the pool (GROUP_BELOW events or more, under 64 KiB).
    "batch": ({}, json.dumps({"events": [saved(step=i) for i in range(120)]})),
}


def _via_django(client, body: bytes, headers: dict):
    extra = {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}
    return client.post("/api/v1/events", data=body, content_type="application/json", **extra)


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_doors_give_the_same_answer(client, token, case):
    headers, body = CASES[case]
    body = body.encode() if isinstance(body, str) else body
    headers = {"Authorization": f"Bearer {token}", **headers}
    asgi = call_asgi("/api/v1/events", body, headers)
    wsgi = call_wsgi("/api/v1/events", body, headers)
    view = _via_django(client, body, headers)
    assert asgi.status_code == wsgi.status_code == view.status_code
    if case in ("gzip", "batch"):  # the same events three times: created, then duplicates
        created = asgi.json()["created"]
        assert created >= 1 and wsgi.json()["duplicates"] == view.json()["duplicates"] == created
    else:
        assert asgi.json() == wsgi.json() == view.json()
    for name in ("content-type", "x-content-type-options"):
        assert asgi.headers[name] == wsgi.headers[name] == view[name]
    # Django's clickjacking middleware marks what went through Django, not the loop's.
    assert "x-frame-options" not in asgi.headers
    assert view.has_header("X-Frame-Options")


@pytest.mark.parametrize(
    ("authorization", "status"),
    [(None, 401), ("Basic abc", 401), ("Bearer lb_unknown", 401), ("Bearer", 401), ("read", 403)],
)
def test_both_doors_refuse_the_same_tokens(client, token, read_token, authorization, status):
    if authorization == "read":
        authorization = f"Bearer {read_token}"
    headers = {"Authorization": authorization} if authorization else {}
    body = json.dumps(saved()).encode()
    asgi = call_asgi("/api/v1/events", body, headers)
    wsgi = call_wsgi("/api/v1/events", body, headers)
    view = _via_django(client, body, headers)
    assert (asgi.status_code, asgi.json()) == (view.status_code, view.json())
    assert (wsgi.status_code, wsgi.json()) == (view.status_code, view.json())
    assert view.status_code == status
    if status == 401:
        assert asgi["WWW-Authenticate"] == wsgi["WWW-Authenticate"] == view["WWW-Authenticate"]


@pytest.mark.parametrize("door", [call_asgi, call_wsgi])
def test_a_body_over_the_limit_is_refused_before_it_is_read(token, settings, door):
    settings.EVENTS_MAX_BODY_BYTES = 2048
    answer = door("/api/v1/events", b"x" * 4096, {"Authorization": f"Bearer {token}"})
    assert answer.status_code == 413
    assert answer.json() == {"error": "request body is 4096 bytes; the limit is 2048"}


def test_a_batch_in_many_pieces_is_read_whole(api, token):
    # 600 events are about 250 KB: call_asgi hands the body over in 64 KiB pieces.
    batch = {"events": [saved(step=i) for i in range(600)]}
    body = json.dumps(batch).encode()
    assert len(body) > 3 * 65536
    answer = call_asgi("/api/v1/events", body, {"Authorization": f"Bearer {token}"})
    assert answer.status_code == 202 and answer.json()["created"] == 600


@pytest.mark.parametrize("door", [call_asgi, call_wsgi])
def test_other_paths_and_methods_go_to_django(token, door):
    listed = door("/api/v1/runs", b"", {"Authorization": f"Bearer {token}"}, method="GET")
    assert listed.status_code == 200 and "x-frame-options" in listed.headers
    assert listed.json()["runs"] == []
    # GET on the events route is Django's (ninja answers 405 for a method it lacks).
    wrong = door("/api/v1/events", b"", {"Authorization": f"Bearer {token}"}, method="GET")
    assert wrong.status_code == 405


@pytest.mark.django_db(transaction=True)
def test_the_served_application_under_gunicorn(project, worker_env):
    """webapp.asgi as production serves it (gunicorn, uvicorn workers): the ingest route
    on the event loop, and Django's pages, forms and API in the thread pool."""
    import http.client
    import re
    import socket

    from tests.conftest import WebServer
    from webapp.domain.models import Event

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
