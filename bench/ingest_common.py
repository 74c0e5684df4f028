"""bench/ingest.py's settings, its messages and errors, the servers it starts (each in its
own process group) and its HTTP calls, all to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "bench" / "ingest.lua"
VAR = ROOT / "var"
LOG_DIR = VAR / "bench-ingest"
MLFLOW_VENV = VAR / "bench-mlflow-venv"
PG_HOST, PG_PORT = "127.0.0.1", 5432
LIFEBOAT_DB, MLFLOW_DB = "lifeboat_bench", "mlflow_bench"
REDIS_URL = "redis://127.0.0.1:6379/12"
EXPERIMENT = "lifeboat-ingest-bench"
# MLflow's log-batch limits per request (mlflow/utils/validation.py).
MLFLOW_MAX_METRICS, MLFLOW_MAX_TAGS, MLFLOW_MAX_ENTITIES = 1000, 100, 1000
MLFLOW_METRICS_PER_EVENT, MLFLOW_TAGS_PER_EVENT = 2, 4
# Reference from the issue: MLflow on PostgreSQL, wrk 8 connections, this machine.
MLFLOW_REFERENCE = 85.0
SINGLE_TARGET_RATIO, BATCH_TARGET = 5.0, 10_000.0  # issue #19


def say(message: str = "") -> None:
    print(message, flush=True)


class BenchError(RuntimeError):
    pass


# --- processes --------------------------------------------------------------------------


class Processes:
    """Every server this script starts, each in its own process group, so that stopping
    one stops its workers too."""

    def __init__(self) -> None:
        self.running: dict[str, subprocess.Popen] = {}
        self.logs: set[str] = set()

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        mode = "ab" if name in self.logs else "wb"  # each run of the bench starts a new log
        self.logs.add(name)
        log = open(LOG_DIR / f"{name}.log", mode)  # noqa: SIM115 (kept open by the child)
        log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.running[name] = proc
        return proc

    def stop(self, name: str, grace: float = 15.0) -> None:
        proc = self.running.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, if any
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            say(f"  warning: {name} (pid {proc.pid}) did not exit")

    def stop_all(self) -> None:
        for name in list(self.running):
            self.stop(name)


PROCS = Processes()


def run_quiet(cmd: list[str], env: dict | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise BenchError(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{tail}")
    return done.stdout


def http(method: str, url: str, body: dict | None = None, headers: dict | None = None):
    assert url.startswith("http://127.0.0.1:"), url  # traffic stays on this machine
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(  # noqa: S310 (http://127.0.0.1 only, asserted)
        url, data=data, method=method, headers=headers or {}
    )
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return response.status, json.loads(response.read() or b"null")


def wait_http(url: str, proc: subprocess.Popen, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{name} exited ({proc.returncode}); see {LOG_DIR / name}.log")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
                if response.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise BenchError(f"{name} did not answer {url} within {timeout:.0f} s")


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0
