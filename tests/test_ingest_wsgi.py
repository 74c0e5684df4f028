"""POST /api/v1/events has two doors: webapp/api/ingest_wsgi.py, which gunicorn serves
(every other test of events goes through it), and the ninja view behind Django's
request cycle (the OpenAPI document, Django's test client). They must give the same
answers; only the first skips Django's middleware."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.conftest import call_wsgi, event, saved

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
}


def _via_django(client, body: bytes, headers: dict):
    extra = {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}
    return client.post("/api/v1/events", data=body, content_type="application/json", **extra)


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_doors_give_the_same_answer(client, token, case):
    headers, body = CASES[case]
    body = body.encode() if isinstance(body, str) else body
    headers = {"Authorization": f"Bearer {token}", **headers}
    shortcut = call_wsgi("/api/v1/events", body, headers)
    view = _via_django(client, body, headers)
    assert shortcut.status_code == view.status_code
    if case == "gzip":  # the same event twice: created, then a duplicate
        assert shortcut.json()["created"] == 1 and view.json()["duplicates"] == 1
    else:
        assert shortcut.json() == view.json()
    # Django's clickjacking middleware marks what went through Django, not the shortcut.
    assert "x-frame-options" not in shortcut.headers
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
    shortcut = call_wsgi("/api/v1/events", body, headers)
    view = _via_django(client, body, headers)
    assert (shortcut.status_code, shortcut.json()) == (view.status_code, view.json())
    assert shortcut.status_code == status
    if status == 401:
        assert shortcut["WWW-Authenticate"] == view["WWW-Authenticate"]


def test_a_body_over_the_limit_is_refused_before_it_is_read(token, settings):
    settings.EVENTS_MAX_BODY_BYTES = 2048
    answer = call_wsgi("/api/v1/events", b"x" * 4096, {"Authorization": f"Bearer {token}"})
    assert answer.status_code == 413
    assert answer.json() == {"error": "request body is 4096 bytes; the limit is 2048"}


def test_other_paths_and_methods_go_to_django(token):
    listed = call_wsgi("/api/v1/runs", b"", {"Authorization": f"Bearer {token}"}, method="GET")
    assert listed.status_code == 200 and "x-frame-options" in listed.headers
    # GET on the events route is Django's (ninja answers 405 for a method it lacks).
    wrong = call_wsgi("/api/v1/events", b"", {"Authorization": f"Bearer {token}"}, method="GET")
    assert wrong.status_code == 405
