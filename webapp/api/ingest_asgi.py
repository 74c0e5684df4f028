"""Lifeboat as an ASGI application, the one door of POST /api/v1/events: gunicorn with
uvicorn workers serves it in production (webapp/asgi.py), and the tests call it
(tests/support/api_client.py's `call_asgi`, under the `api` fixture). The route is answered on
the event loop; every other request is Django's, in a pool of threads. No Django view
answers the route, so no other server or test client can take another way in; the
OpenAPI document describes it from webapp/api/events.py, whose steps it takes.

Why on the event loop: with gunicorn's threaded workers a single event spent about a
fifth of its CPU being handed between the threads of a process (the GIL, wake-ups),
beyond the request's own work (docs/benchmarks.md). Here the event loop of a process
reads each request, authenticates it from the token cache, checks its events and hands
them to the process's group committer (webapp/domain/ingest/group_commit.py), without a thread
per request: the loop goes on reading the next requests while a group's transaction
runs in the pool, so groups grow with the load and the per-transaction cost is shared by
more events.

What needs the database outside the committer runs in the thread pool, never on the
loop: a token not in the cache, a batch of GROUP_BELOW events or more (it has its own
transaction; a body over ON_LOOP_BELOW bytes or compressed is decoded there too, since
inflating and parsing megabytes would hold the loop), and every other route, which is
Django's WSGI application unchanged (a2wsgi), with the same middleware and the same
connection handling as under gunicorn's threads. Sessions, CSRF and the other
middlewares, which do not apply to a bearer-token JSON endpoint, are not run for the
route; its answers are JSON like every other under /api/ (tests/test_ingest_door.py).
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
import weakref
from concurrent.futures import Executor, ThreadPoolExecutor

import orjson
from a2wsgi import WSGIMiddleware
from django.conf import settings
from django.db import connections

from webapp.api.auth import bearer_secret, token_with_scope
from webapp.api.errors import MISSING_TOKEN, ApiError
from webapp.api.events import (
    PATH,
    accept_events,
    answer,
    decode_events,
    parse_events,
    store_events,
)
from webapp.domain.ingest.group_commit import GROUP_BELOW, GroupCommitter
from webapp.domain.models import ApiToken
from webapp.domain.validation.outbox import flush_outbox
from webapp.ops.latency import record

log = logging.getLogger(__name__)

INTERNAL_ERROR = ApiError(500, "internal error; the server log has the details")
ROUTE = "api/v1/events"  # the label Django's resolver gives it in the latency histogram


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
    if status == 405:
        headers.append(("Allow", "POST"))
    return headers


def close_old_connections() -> None:
    # django.db.close_old_connections, except for a connection inside a transaction:
    # no request begins or ends in one, but a test's request runs inside the test's.
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


# Bodies up to this size, not compressed, are decoded on the event loop (a single event
# is about 600 bytes; orjson reads 64 KiB in well under a millisecond).
ON_LOOP_BELOW = 64 * 1024


def _in_thread(function, *args):
    # As a request thread would: connections closed when broken or too old, before and
    # after.
    close_old_connections()
    try:
        return function(*args)
    finally:
        close_old_connections()


class IngestASGI:
    def __init__(self, django_wsgi, threads: int, executor: Executor | None = None):
        # One pool for Django's requests and the ingest route's database work (groups of
        # single events included) bounds the connections a process holds to `threads`,
        # as gunicorn's --threads did. `executor` replaces it (the tests run the route in their own
        # thread, inside their transaction).
        self.pool = executor or ThreadPoolExecutor(threads, thread_name_prefix="lifeboat-web")
        self.django = WSGIMiddleware(django_wsgi, workers=1)
        self.django.executor.shutdown(wait=False)  # a2wsgi's own pool, replaced by ours
        self.django.executor = self.pool
        # A committer's state belongs to one event loop: a server has one per process;
        # the tests run one per request, from several threads at once.
        self._committers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == PATH:
            await self._ingest(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.django(scope, receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                # The server has answered its last request: the validation messages this
                # process still holds go out now. (An atexit handler does the same under
                # WSGI; a uvicorn worker can end by the signal's default action, skipping
                # it.)
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self.pool, flush_outbox)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _ingest(self, scope, receive, send) -> None:
        started = time.perf_counter()
        try:
            if scope["method"] != "POST":
                raise ApiError(405, f"{scope['method']} is not allowed at {PATH}; allowed: POST")
            status, body = await self._answer(dict(scope["headers"]), receive)
        except ApiError as exc:
            status, body = exc.status, error_body(exc)
        except Exception:
            log.exception("API error on POST %s", PATH)
            status, body = 500, error_body(INTERNAL_ERROR)
        headers = [(k.encode(), v.encode()) for k, v in response_headers(status, body)]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        if scope["method"] == "POST":  # a method named by the client is not a label
            record(ROUTE, "POST", time.perf_counter() - started)

    async def _answer(self, headers: dict[bytes, bytes], receive) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        secret = bearer_secret(headers.get(b"authorization", b"").decode("latin-1"))
        if secret is None:
            raise ApiError(401, MISSING_TOKEN)
        token = ApiToken.cached(secret)
        if token is None or not token.allows("ingest"):
            token = await loop.run_in_executor(
                self.pool, _in_thread, token_with_scope, secret, "ingest"
            )
        declared = headers.get(b"content-length", b"").decode("latin-1") or None
        encoding = headers.get(b"content-encoding", b"").decode("latin-1")
        body = await _read(receive, declared)
        if len(body) > ON_LOOP_BELOW or encoding.strip():
            body = await loop.run_in_executor(
                self.pool,
                _in_thread,
                accept_events,
                token,
                declared,
                encoding,
                io.BytesIO(body).read,
            )
            return 202, body
        raw_events, finite = decode_events(declared, encoding, io.BytesIO(body).read)
        if len(raw_events) >= GROUP_BELOW:
            # A batch: checking a thousand events would hold the loop for tens of ms.
            body = await loop.run_in_executor(
                self.pool, _in_thread, store_events, token, raw_events, finite
            )
            return 202, body
        events = parse_events(raw_events)
        committer = self._committer()
        result = await committer.submit(token.project, token.actor, events, raw_events, finite)
        return 202, answer(events, result)

    def _committer(self) -> GroupCommitter:
        loop = asyncio.get_running_loop()
        committer = self._committers.get(loop)
        if committer is None:
            committer = GroupCommitter(
                self.pool, settings.EVENTS_MAX_BATCH, settings.INGEST_COMMITTERS, _in_thread
            )
            self._committers[loop] = committer
        return committer


async def _read(receive, declared: str | None) -> bytes:
    """The body, or its first limit+1 bytes when it is longer (read_body refuses it with
    413 then); nothing is read when the declared length is already over the limit."""
    limit = settings.EVENTS_MAX_BODY_BYTES
    if declared and declared.isdigit() and int(declared) > limit:
        return b""
    chunks, size = [], 0
    while size <= limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
