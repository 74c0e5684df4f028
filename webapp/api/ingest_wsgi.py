"""POST /api/v1/events served in front of Django's request cycle.

Why: a single event's own work (parse, check, a share of a group's transaction) is a
fraction of what Django spent around it. A request that Django refused at
authentication, before any work, cost about 1.3 ms of CPU here: request object,
eleven middlewares, URL resolving, ninja's operation. For a training job that sends
each checkpoint as it is saved, that was half the cost of its event
(docs/benchmarks.md). This WSGI wrapper answers that one route itself, with the same
code the ninja view calls (webapp/api/events.accept_events), and hands every other
request to Django unchanged.

What it keeps from Django: database connections closed when broken or too old, before
and after each request as Django does, the latency histogram under the
route's name, JSON errors of the same shape and words, and the response headers that
matter for an API answer. What it leaves out does not apply to a bearer-token JSON
endpoint: sessions, CSRF, messages, htmx, static files. The ninja view stays: it
describes the endpoint in the OpenAPI document and serves the in-process test client.
"""

from __future__ import annotations

import logging
import time

import orjson
from django.core.handlers.wsgi import WSGIHandler
from django.db import connections

from webapp.api.auth import MISSING_TOKEN, bearer_secret, token_with_scope
from webapp.api.errors import ApiError
from webapp.api.events import accept_events
from webapp.ops.latency import record

log = logging.getLogger(__name__)

PATH = "/api/v1/events"
INTERNAL_ERROR = ApiError(500, "internal error; the server log has the details")
ROUTE = "api/v1/events"  # the label Django's resolver gives it in the latency histogram
REASONS = {
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    500: "Internal Server Error",
}


def error_body(exc: ApiError) -> bytes:
    return orjson.dumps({"error": exc.message, **exc.details})


def response_headers(status: int, body: bytes) -> list[tuple[str, str]]:
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("X-Content-Type-Options", "nosniff"),
    ]
    if status == 401:
        headers.append(("WWW-Authenticate", 'Bearer realm="lifeboat"'))
    return headers


def close_old_connections() -> None:
    # django.db.close_old_connections, except for a connection inside a transaction:
    # no request begins or ends in one, but a test's request runs inside the test's.
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


class IngestShortcut:
    def __init__(self, django_app: WSGIHandler):
        self.django_app = django_app

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") != PATH or environ.get("REQUEST_METHOD") != "POST":
            return self.django_app(environ, start_response)
        started = time.perf_counter()
        # What Django's request_started and request_finished do for a database
        # connection, without their other receivers (query log, caches, URLconf), which
        # this route does not use and which cost as much as the rest of the request.
        close_old_connections()
        try:
            status, body = self._answer(environ)
        finally:
            close_old_connections()
        start_response(
            f"{status} {REASONS.get(status, '')}".rstrip(), response_headers(status, body)
        )
        record(ROUTE, "POST", time.perf_counter() - started)
        return [body]

    @staticmethod
    def _answer(environ) -> tuple[int, bytes]:
        try:
            secret = bearer_secret(environ.get("HTTP_AUTHORIZATION"))
            if secret is None:
                raise ApiError(401, MISSING_TOKEN)
            token = token_with_scope(secret, "ingest")
            body = accept_events(
                token,
                environ.get("CONTENT_LENGTH"),
                environ.get("HTTP_CONTENT_ENCODING", ""),
                environ["wsgi.input"].read,
            )
            return 202, body
        except ApiError as exc:
            return exc.status, error_body(exc)
        except Exception:
            log.exception("API error on POST %s", PATH)
            return 500, error_body(INTERNAL_ERROR)
