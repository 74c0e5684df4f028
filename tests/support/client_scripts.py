"""What the client tests share: a Lifeboat web server they can stop and start again at
the same address, a way to run a training script in its own process, and a way to stop
or kill a process while it is hashing a given file (seen in /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from tests.support.servers import ROOT, WebServer, free_port


class RestartableServer:
    def __init__(self, env: dict):
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.web: WebServer | None = None

    def start(self) -> None:
        if self.web is None:
            self.web = WebServer(self.env, port=self.port)

    def stop(self) -> None:
        if self.web is not None:
            self.web.stop()
            self.web = None


def run_script(code: str, env: dict, *, wait: bool = True, timeout: float = 120):
    """Run `code` in a fresh Python process (a training job of its own)."""
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if not wait:
        return process
    out, err = process.communicate(timeout=timeout)
    process.stdout_text, process.stderr_text = out, err
    return process


def train_digits(server, token: str, tmp_path, run: str, *, seed: int = 0, epochs: int = 2):
    """examples/train_digits.py as a job of its own, reporting to `server`; checkpoints
    under tmp_path/ckpt/<run>/. Returns the environment it ran with."""
    env = {
        "LIFEBOAT_URL": server.url,
        "LIFEBOAT_TOKEN": token,
        "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "examples/train_digits.py", "--run", run, "--epochs", str(epochs),
         "--seed", str(seed), "--checkpoint-dir", str(tmp_path / "ckpt")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return env


def _hashing_fd(pid: int, path) -> str | None:
    """The fd number under which process `pid` has `path` open, if it has."""
    folder = f"/proc/{pid}/fd"
    for fd in os.listdir(folder):
        try:
            if os.readlink(f"{folder}/{fd}") == str(path):
                return fd
        except FileNotFoundError:
            continue
    return None


def stop_while_hashing(process: subprocess.Popen, path, timeout: float = 60) -> int:
    """Stop `process` (SIGSTOP) while it has `path` open and has not read it to its end,
    i.e. in the middle of hashing it; returns how far it had read. The caller SIGCONTs
    or SIGKILLs it."""
    from tests.support.servers import wait_for

    size = os.path.getsize(path)
    fd = wait_for(lambda: _hashing_fd(process.pid, path), timeout, interval=0.001)
    os.kill(process.pid, signal.SIGSTOP)
    try:
        with open(f"/proc/{process.pid}/fdinfo/{fd}") as info:
            position = int(info.readline().split()[1])  # "pos:\t<offset>"
    except FileNotFoundError:
        position = size  # it closed the file between our two looks: done hashing
    assert position < size, f"{path} was hashed to its end before the process was stopped"
    return position


def kill_while_hashing(process: subprocess.Popen, path, timeout: float = 60) -> int:
    """SIGKILL `process` in the middle of hashing `path`; returns how far it had read."""
    try:
        position = stop_while_hashing(process, path, timeout)
    finally:
        process.kill()
        process.wait(30)
    return position
