from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import OperationalError, connection

from tests.support.api_client import Api
from tests.support.celery_workers import start_worker, stop_worker
from tests.support.client_scripts import RestartableServer
from tests.support.people import member
from tests.support.servers import (
    ROOT,
    SHARED_S3_PID,
    S3Server,
    file_lock,
    stop_process_group,
)
from webapp.domain.models import Project

# Fixtures that test modules share beyond these, each module with its helpers (tests/support/).
pytest_plugins = [
    "tests.support.browser",
    "tests.support.client_stack",
    "tests.support.database",
    "tests.support.module_order",
    "tests.support.restore_levels",
    "tests.support.slurm",
    "tests.support.webhooks",
]


@pytest.fixture
def api(client) -> Api:
    return Api(client)


@pytest.fixture
def project(db):
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


def _database_url_for_subprocess() -> str:
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
def worker_env(django_db_setup, django_db_blocker, redis_client):
    """The environment of a Lifeboat process that uses the test database and Redis."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="webapp.settings",
        DEBUG="1",
        DATABASE_URL=_database_url_for_subprocess(),
        DB_CONN_MAX_AGE="0",
        REDIS_URL=settings.REDIS_URL,
        # One per parallel test process (pytest-xdist): its paths are named by database ids.
        LIFEBOAT_VAR_DIR=str(
            ROOT / "var" / f"test-worker-{os.environ.get('PYTEST_XDIST_WORKER', 'gw0')}"
        ),
        # The tests' S3 servers and webhook receivers listen on 127.0.0.1, which the
        # outbound policy refuses unless the deployment allows it.
        LIFEBOAT_OUTBOUND_ALLOW="127.0.0.1",
    )
    yield env
    # After the session's servers and workers (they ask for this fixture, so they stop
    # first): a backend whose client has just gone may still count as a session of the
    # test database, and DROP DATABASE at the end refuses to drop it while one does.
    # This process's own connection may itself have been ended by then (a .ci/run once
    # found it so after the load tests end connections on purpose): a fresh one then.
    if connection.vendor == "postgresql":
        with django_db_blocker.unblock():
            for attempt in (1, 2):
                try:
                    with connection.cursor() as cursor:
                        cursor.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        )
                    break
                except OperationalError:
                    connection.close()
                    if attempt == 2:
                        raise


@pytest.fixture
def celery_worker(worker_env, tmp_path):
    """A real Celery worker process on the validate queue, for one test (a worker that
    outlived its test would take the tasks other tests look for in Redis)."""
    process = start_worker(worker_env, "validate", tmp_path / "worker.log")
    yield process
    stop_worker(process)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory, worker_id):
    if worker_id == "master":
        server = S3Server(tmp_path_factory.mktemp("s3"))
        yield server
        server.stop()
        return
    # Parallel processes (pytest-xdist) share one object store, each with its own bucket:
    # the first that needs one starts it, and the controller stops it (pytest_unconfigure).
    shared = tmp_path_factory.getbasetemp().parent
    with file_lock(shared / "s3.lock"):
        (shared / "s3").mkdir(exist_ok=True)
        server = S3Server(shared / "s3")
        if server.process is not None:
            (shared / SHARED_S3_PID).write_text(str(server.process.pid))
            server.process = None  # not this process's to stop
    yield server
    server.stop()


def pytest_unconfigure(config):
    if hasattr(config, "workerinput") or not hasattr(config, "_tmp_path_factory"):
        return
    pid_file = config._tmp_path_factory.getbasetemp() / SHARED_S3_PID
    if pid_file.exists():
        stop_process_group(int(pid_file.read_text()))


@pytest.fixture
def s3(s3_server, settings):
    """The S3 server, with the settings of this process pointing at it (and the
    outbound policy allowing 127.0.0.1, where it and the tests' other servers listen)."""
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]
    settings.S3_ENDPOINT_URL = s3_server.endpoint
    settings.S3_ACCESS_KEY_ID = s3_server.key
    settings.S3_SECRET_ACCESS_KEY = s3_server.secret
    return s3_server


@pytest.fixture(scope="session")
def _shared_server(worker_env):
    web = RestartableServer(worker_env)
    yield web
    web.stop()


@pytest.fixture
def server(_shared_server):
    """Lifeboat's web server, which the test may stop and start again. One for all the
    tests of this process, each finding it running: a start costs each of its two worker
    processes a second of CPU to import Django, some 40 times a run otherwise. It keeps
    nothing of a test but what the database keeps, emptied between tests; its token
    cache is by secret, and no two tests share one."""
    _shared_server.start()
    return _shared_server


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
            import playwright.sync_api  # noqa: F401  (a probe: is it installed?)
        except ImportError:
            problem = "Playwright is not installed (pip install -e '.[dev]')"
    if problem:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"browser tests cannot run under CI: {problem}", pytrace=False)
        pytest.skip(problem)


@pytest.fixture(scope="session")
def browser():
    _need_browser()
    from playwright.sync_api import sync_playwright  # only where a browser test runs

    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests
    # make between browser steps are still plain synchronous calls.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


# --- People in a project, by role (dashboard and API tests) --------------------------------


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
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "slurm_cluster" in getattr(item, "fixturenames", ()) or params.get("kind") == "slurm":
            item.add_marker(pytest.mark.stack)  # a Slurm test is never a quick one
        slow = {"worker", "browser"} & {m.name for m in item.iter_markers()}
        if slow or STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stack)
