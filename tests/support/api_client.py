"""The v1 API as the tests call it (`Api`, behind the `api` fixture) and `call_asgi`, one
request through the ASGI application production serves, inside the test's transaction."""

from __future__ import annotations

import gzip
import json


class Answer:
    """What a test reads of an answer: status_code, json(), headers by name."""

    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes):
        self.status_code = int(status.split()[0])
        self.headers = {name.lower(): value for name, value in headers}
        self.content = body

    def json(self):
        return json.loads(self.content)

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()]


def call_asgi(path: str, body: bytes, headers: dict[str, str], method: str = "POST"):
    """One request through webapp.asgi.application, the application production serves:
    its event loop runs in a thread of its own, as in a server, and the work it hands
    to its thread pool (the database, Django's other routes) runs in this thread, inside
    the test's transaction. The body arrives in pieces, as a server passes it on."""
    import asyncio
    import threading

    from django.core.wsgi import get_wsgi_application

    from webapp.api.ingest_asgi import IngestASGI

    global _asgi_app
    if _asgi_app is None:
        # webapp.asgi's application, with a pool that runs in this thread.
        pages = get_wsgi_application()
        _asgi_app = IngestASGI(pages, threads=1, executor=_CallerExecutor())
    pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)] or [b""]
    messages = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-length", str(len(body)).encode())]
        + [(name.lower().encode(), value.encode()) for name, value in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    failed: list[BaseException] = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    def serve():
        try:
            asyncio.run(_asgi_app(scope, receive, send))
        except BaseException as exc:  # noqa: BLE001  (raised again in the test's thread)
            failed.append(exc)
        finally:
            _asgi_app.pool.stop()

    from django.core import signals
    from django.db import close_old_connections

    # As Django's test client does: the connection holds the test's transaction, which
    # closing it after a request to Django's other routes would end.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    loop_thread = threading.Thread(target=serve)
    loop_thread.start()
    try:
        _asgi_app.pool.work_here()
    finally:
        loop_thread.join()
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
    if failed:
        raise failed[0]
    start = sent[0]
    return Answer(
        str(start["status"]),
        [(k.decode(), v.decode()) for k, v in start["headers"]],
        b"".join(m.get("body", b"") for m in sent[1:]),
    )


_asgi_app = None


class _CallerExecutor:
    """concurrent.futures' Executor interface; the calls run in the thread that calls
    work_here(), until stop()."""

    def __init__(self):
        import queue

        self._work = queue.SimpleQueue()

    def submit(self, function, *args, **kwargs):
        from concurrent.futures import Future

        future = Future()
        self._work.put((future, function, args, kwargs))
        return future

    def stop(self) -> None:
        self._work.put(None)

    def work_here(self) -> None:
        while (item := self._work.get()) is not None:
            future, function, args, kwargs = item
            try:
                future.set_result(function(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001  (handed to the awaiting coroutine)
                future.set_exception(exc)


class Api:
    """The v1 API with a bearer token. Events go through the ASGI application production
    serves (POST /api/v1/events is answered there, before Django's request cycle:
    webapp/api/ingest_asgi.py); the rest through the Django test client."""

    def __init__(self, client):
        self.client = client

    def post_events(self, token: str | None, body, *, raw: bytes | None = None, headers=None):
        data = raw if raw is not None else json.dumps(body).encode()
        extra = {"Authorization": f"Bearer {token}"} if token else {}
        extra.update(headers or {})
        return call_asgi("/api/v1/events", data, extra)

    def post_gzip(self, token: str, body):
        return self.post_events(
            token,
            None,
            raw=gzip.compress(json.dumps(body).encode()),
            headers={"Content-Encoding": "gzip"},
        )

    def get(self, token: str | None, path: str, **params):
        extra = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
        return self.client.get(f"/api/v1{path}", params, **extra)

    def post(self, token: str, path: str, body=None):
        return self.client.post(
            f"/api/v1{path}",
            data=json.dumps(body) if body is not None else "",
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
