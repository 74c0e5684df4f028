"""Lifeboat's web server and the S3 server as the tests run them: real processes
(gunicorn with uvicorn workers; SeaweedFS, or an S3 server that already answers), and
the small helpers they need (a free port, waiting for a condition, the checkout's ROOT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float = 30, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def gunicorn_control_socket_off() -> list[str]:
    import gunicorn

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
        import tempfile

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
        import urllib.request

        def up():
            try:
                urllib.request.urlopen(f"{self.url}/api/v1/openapi.json", timeout=2)
                return True
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(self.output()) from None
                return False

        wait_for(up, timeout=30, interval=0.2)

    def post_events(self, token: str, body) -> tuple[int, dict]:
        import urllib.error
        import urllib.request

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
        import boto3
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
            import signal

            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
            self.log.close()
