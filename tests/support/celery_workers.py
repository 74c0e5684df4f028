"""Celery as the tests see it: the tasks waiting on a queue in Redis (`queued_tasks`) and
real worker processes (`start_worker`, `stop_worker`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.support.servers import ROOT


def queued_tasks(redis_client, queue: str = "validate") -> list[dict]:
    """The messages waiting on a Celery queue in Redis: task name, args and kwargs."""
    import base64

    tasks = []
    for raw in redis_client.lrange(queue, 0, -1):
        message = json.loads(raw)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        tasks.append({"task": message["headers"]["task"], "args": args, "kwargs": kwargs})
    return tasks


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
