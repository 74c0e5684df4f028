from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

# Re-exported: the tests import these from here.
from tests.servers import (  # noqa: F401
    ROOT,
    S3Server,
    WebServer,
    free_port,
    gunicorn_control_socket_off,
    wait_for,
)

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
SHA = "ab" * 32


def at(seconds: float) -> str:
    """An ISO 8601 time `seconds` after T0."""
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def event(type_: str, run: str = "run-1", t: float = 0, **fields) -> dict:
    return {"id": str(uuid.uuid4()), "type": type_, "run": run, "time": at(t), **fields}


def saved(run: str = "run-1", step: int = 100, t: float = 0, **fields) -> dict:
    body = {
        "step": step,
        "epoch": 1,
        "location": f"/data/{run}/step-{step}",
        "files": [
            {"path": "model.pt", "size": 1000, "sha256": SHA},
            {"path": "optim.pt", "size": 500, "sha256": "cd" * 32},
        ],
        "save_seconds": 1.5,
        "metrics": {"loss": 0.25},
        "format": "torch",
    }
    body.update(fields)
    return event("checkpoint.saved", run=run, t=t, **body)


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


@pytest.fixture
def api(client) -> Api:
    return Api(client)


@pytest.fixture
def project(db):
    from webapp.domain.models import Project

    return Project.objects.create(name="Alpha", slug="alpha", allowed_roots=["/data"])


@pytest.fixture
def root(tmp_path, project):
    """A folder that is the project's one allowed root (where its checkpoints may be)."""
    root = tmp_path / "ckpts"
    root.mkdir()
    project.allowed_roots = [str(root)]
    project.save()
    return root


@pytest.fixture
def other_project(db):
    from webapp.domain.models import Project

    return Project.objects.create(name="Beta", slug="beta", allowed_roots=["/other"])


@pytest.fixture
def token(project) -> str:
    """A token with every scope."""
    return project.issue_token("all", ["ingest", "read", "operate"])[1]


@pytest.fixture
def ingest_token(project) -> str:
    return project.issue_token("ingest-only", ["ingest"])[1]


@pytest.fixture
def read_token(project) -> str:
    return project.issue_token("read-only", ["read"])[1]


@pytest.fixture(scope="session")
def redis_client():
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def queues(redis_client):
    """The test Redis database, emptied before and after the test."""
    redis_client.flushdb()
    yield redis_client
    redis_client.flushdb()


def queued_tasks(redis_client, queue: str = "validate") -> list[dict]:
    """The messages waiting on a Celery queue in Redis: task name, args and kwargs."""
    import base64

    tasks = []
    for raw in redis_client.lrange(queue, 0, -1):
        message = json.loads(raw)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        tasks.append({"task": message["headers"]["task"], "args": args, "kwargs": kwargs})
    return tasks


def _database_url_for_subprocess() -> str:
    from django.db import connection

    settings_dict = connection.settings_dict
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict.get("USER") or ""
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{settings_dict['NAME']}"


@pytest.fixture(scope="session")
def worker_env(django_db_setup, redis_client) -> dict:
    """The environment of a Lifeboat process that uses the test database and Redis."""
    from django.conf import settings

    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="webapp.settings",
        DEBUG="1",
        DATABASE_URL=_database_url_for_subprocess(),
        DB_CONN_MAX_AGE="0",
        REDIS_URL=settings.REDIS_URL,
        LIFEBOAT_VAR_DIR=str(ROOT / "var" / "test-worker"),
        # The tests' S3 servers and webhook receivers listen on 127.0.0.1, which the
        # outbound policy refuses unless the deployment allows it.
        LIFEBOAT_OUTBOUND_ALLOW="127.0.0.1",
    )
    return env


def start_worker(
    env: dict,
    queues: str,
    log_path: Path,
    name: str | None = None,
    wait: bool = True,
    prefix: list[str] | None = None,
) -> subprocess.Popen:
    """A real Celery worker process (solo pool) on `queues`, its output in `log_path`;
    with `wait`, returns once it says it is ready. `prefix`: a command that runs it (a
    mount namespace standing in for another host)."""
    command = [*(prefix or []), sys.executable, "-m", "celery", "-A", "workers", "worker",
               "-Q", queues, "-P", "solo", "-l", "info", "--without-gossip", "--without-mingle",
               "--without-heartbeat"]  # fmt: skip
    if name:
        command += ["-n", f"{name}@%h"]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    process.log_path = log_path
    deadline = time.monotonic() + 60
    while wait and "ready." not in log_path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the Celery worker did not start:\n{log_path.read_text()}")
        time.sleep(0.2)
    return process


def stop_worker(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture
def celery_worker(worker_env, tmp_path):
    """A real Celery worker process on the validate queue, for one test (a worker that
    outlived its test would take the tasks other tests look for in Redis)."""
    process = start_worker(worker_env, "validate", tmp_path / "worker.log")
    yield process
    stop_worker(process)


def run_together(target, argument_lists) -> None:
    """target(*arguments) for each list of arguments, each in its own thread, at once;
    returns when all have."""
    import threading

    threads = [threading.Thread(target=target, args=tuple(a)) for a in argument_lists]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, settings):
    """The S3 server, with the settings of this process pointing at it (and the
    outbound policy allowing 127.0.0.1, where it and the tests' other servers listen)."""
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]
    settings.S3_ENDPOINT_URL = s3_server.endpoint
    settings.S3_ACCESS_KEY_ID = s3_server.key
    settings.S3_SECRET_ACCESS_KEY = s3_server.secret
    return s3_server


@pytest.fixture
def server(worker_env):
    """Lifeboat's web server for one test, which the test may stop and start again."""
    from tests.client_support import RestartableServer

    web = RestartableServer(worker_env)
    web.start()
    yield web
    web.stop()


# --- The browser tests' Chromium (tests/test_browser*.py) ----------------------------------
# Here, not in one test module, so that every browser test module shares the session's one
# Playwright: a second sync_playwright() in the same thread fails while the first runs.

CHROMIUM = os.environ.get("LIFEBOAT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _need_browser():
    problem = None
    if not Path(CHROMIUM).exists():
        problem = f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "Playwright is not installed (pip install -e '.[dev]')"
    if problem:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"browser tests cannot run under CI: {problem}", pytrace=False)
        pytest.skip(problem)


@pytest.fixture(scope="session")
def browser():
    _need_browser()
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests
    # make between browser steps are still plain synchronous calls.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


# --- People in a project, by role (dashboard and API tests) --------------------------------


def member(project, name: str, role: str):
    from django.contrib.auth import get_user_model

    from webapp.domain.models import Membership

    user = get_user_model().objects.create_user(name, password="pw")
    Membership.objects.create(project=project, user=user, role=role)
    return user


@pytest.fixture
def viewer(project):
    return member(project, "vera", "viewer")


@pytest.fixture
def operator(project):
    return member(project, "otto", "operator")


@pytest.fixture
def admin(project):
    return member(project, "ada", "admin")


# Fixtures that start a server, a worker, an object store, a browser or Slurm: a test
# that asks for one (directly or through another) is in the full suite only, not in
# `make test-quick` (pytest -m "not stack"; CONTRIBUTING.md, the test tiers).
STACK_FIXTURES = {
    "server", "s3_server", "s3", "worker_env", "celery_worker", "browser", "slurm_cluster",
    "lifeboat_stack", "job_env", "s3_server_env", "cluster", "workers", "replicate_env",
    "stack", "web", "client_wheel", "client_venv", "receiver", "receivers", "own_s3",
}  # fmt: skip


def pytest_collection_modifyitems(config, items):
    for item in items:
        slow = {"worker", "browser"} & {m.name for m in item.iter_markers()}
        if slow or STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stack)
