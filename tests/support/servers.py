"""Lifeboat's web server and the S3 server as the tests run them: real processes
(gunicorn with uvicorn workers; SeaweedFS, or an S3 server that already answers), and
the small helpers they need (a free port, waiting for a condition, the checkout's ROOT)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float = 30, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


# Where a parallel test process (pytest-xdist) that started the shared SeaweedFS leaves
# its pid, in the controller's temporary directory, for the controller to stop it at exit.
SHARED_S3_PID = "s3.pid"


@contextlib.contextmanager
def file_lock(path: Path):
    """Held by one process at a time: what the parallel test processes start once."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def stop_process_group(pid: int, timeout: float = 20) -> None:
    """SIGTERM to the group of PID (a server started in a session of its own), then
    SIGKILL if it has not gone within TIMEOUT seconds."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


# Ports for the tests' servers come from below the kernel's ephemeral range (32768-60999 on
# Linux), where no connect() or bind(("", 0)) of another process lands between the probe
# and the server's own bind. Each test process draws from a range of its own, chosen by
# its Redis database (webapp/settings_test.py gives every parallel process, and every
# session run beside another, a database of its own), and hands out a port once while
# others remain.
_PORTS_PER_PROCESS = 750
_handed_out: set[int] = set()


def _own_range() -> range:
    database = int(urlsplit(os.environ.get("TEST_REDIS_URL", "")).path.strip("/") or 0)
    low = 20000 + (database % 16) * _PORTS_PER_PROCESS
    return range(low, low + _PORTS_PER_PROCESS)


def free_block(size: int) -> int:
    """The first of SIZE consecutive free ports on 127.0.0.1."""
    own = _own_range()
    starts = list(range(own.start, own.stop - size, size))
    offset = random.randrange(len(starts))  # noqa: S311 (not a secret: spreads the draws)
    for fresh_only in (True, False):
        for first in starts[offset:] + starts[:offset]:
            block = range(first, first + size)
            if fresh_only and not _handed_out.isdisjoint(block):
                continue
            if all(_free(port) for port in block):
                _handed_out.update(block)
                return first
    raise RuntimeError(f"no {size} consecutive free ports in {own.start}-{own.stop - 1}")


def free_port() -> int:
    return free_block(1)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def gunicorn_control_socket_off() -> list[str]:
    import gunicorn  # read only where a test starts a web server

    # As scripts/run_stack.py: since 25.1 each gunicorn opens ~/.gunicorn/gunicorn.ctl.
    return ["--no-control-socket"] if gunicorn.version_info >= (25, 1) else []


class WebServer:
    """Lifeboat served by gunicorn in its own process, as in production: uvicorn workers
    serving webapp.asgi (single events share transactions: webapp/domain/ingest/group_commit.py)."""

    def __init__(self, env: dict, port: int | None = None, **overrides: str):
        # A given port lets a test stop the server and start it again at the same address.
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**env, "ALLOWED_HOSTS": "127.0.0.1,localhost", **overrides}
        # A file, not a pipe: nobody reads a pipe while the server runs, and once its
        # buffer is full (a warning per 4xx answer) every worker blocks on its next line.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115  (closed with the object)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "webapp.asgi",
                "-k",
                "uvicorn_worker.UvicornWorker",
                "-b",
                f"127.0.0.1:{self.port}",
                "-w",
                "2",
                "--reuse-port",
                *gunicorn_control_socket_off(),
            ],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )

        def up():
            try:
                urllib.request.urlopen(f"{self.url}/api/v1/openapi.json", timeout=2)
                return True
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(self.output()) from None
                return False

        # Generous: under a parallel run's load a slow machine takes tens of seconds to
        # import Django in each worker. A server that never came up is stopped, not left
        # holding its test database, and its log says why.
        try:
            wait_for(up, timeout=120, interval=0.2)
        except AssertionError:
            self.stop()
            raise AssertionError(
                f"the web server did not answer within 120 s:\n{self.output()}"
            ) from None

    def post_events(self, token: str, body) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{self.url}/api/v1/events",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def output(self) -> str:
        """What the server wrote to stderr so far (its log)."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


class S3Server:
    """A real S3 endpoint for the session: TEST_S3_ENDPOINT_URL if given, one already
    answering on 127.0.0.1:8333 (e.g. `make run`'s), or SeaweedFS started here. Tests
    use a bucket of their own, removed at the end."""

    def __init__(self, tmp_dir: Path):
        import boto3  # boto3 loads only in the tests that use S3
        from botocore.config import Config

        self.process = None
        self.endpoint = os.environ.get("TEST_S3_ENDPOINT_URL", "http://127.0.0.1:8333")
        self.key, self.secret = "lifeboat-test", "lifeboat-test-secret"
        self.bucket = f"lifeboat-test-{uuid.uuid4().hex[:8]}"
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            config=Config(connect_timeout=2, read_timeout=30, retries={"max_attempts": 2}),
        )
        if not self._answers():
            self._start(tmp_dir)
        self.client.create_bucket(Bucket=self.bucket)

    def _answers(self) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.list_buckets()
            return True
        except (BotoCoreError, ClientError):
            return False

    def _start(self, tmp_dir: Path) -> None:
        weed = Path(sys.executable).parent / "weed"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.log = (tmp_dir / "weed.log").open("w")
        self.process = subprocess.Popen(
            [
                str(weed),
                "-logtostderr",
                "mini",
                f"-dir={tmp_dir}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
                "-webdav=false",
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._answers, timeout=60, interval=0.5)

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def stop(self) -> None:
        try:
            listed = self.client.list_objects_v2(Bucket=self.bucket).get("Contents", [])
            for item in listed:
                self.client.delete_object(Bucket=self.bucket, Key=item["Key"])
            self.client.delete_bucket(Bucket=self.bucket)
        except Exception:  # noqa: S110 (best effort; the server may be gone)
            pass
        if self.process is not None:
            stop_process_group(self.process.pid)
            self.process.wait()
            self.log.close()
