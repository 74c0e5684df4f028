"""`make run` stacks and documented commands, for tests/test_documented_commands.py.

A Stack is scripts/run_stack.py (what `make run` runs) with its own var dir and ports,
started as a user would and stopped with SIGTERM. documented() takes the commands out of
the markdown files themselves, and run_documented() runs one as a user would in the
checkout: with nothing of Lifeboat's exported but LIFEBOAT_VAR_DIR, which points at the
stack's var dir (for a user, it is var/ of the checkout).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.servers import free_block

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the checkout's .venv/bin for the documented commands
# What a test process has exported that a user's shell would not have.
_NOT_A_USERS = re.compile(
    r"^(DEBUG|SECRET_KEY|SITE_URL|DATABASE_URL|REDIS_URL|TEST_REDIS_URL|CELERY_.*|S3_.*"
    r"|DJANGO_SETTINGS_MODULE|LIFEBOAT_.*|METRICS_.*|DB_.*|PYTEST_.*)$"
)


def users_environment(var: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _NOT_A_USERS.match(k)}
    return env | {"LIFEBOAT_VAR_DIR": str(var), "PYTHONUNBUFFERED": "1"} | extra


def fenced_blocks(doc: str, language: str | None = None) -> list[str]:
    """The fenced code blocks of ROOT/doc (indented ones too), optionally of one language."""
    blocks, current, lang = [], None, None
    for line in (ROOT / doc).read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            if current is None:
                current, lang, indent = [], stripped[3:].strip(), len(line) - len(line.lstrip())
            else:
                if language is None or lang == language:
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line[indent:] if line[:indent].strip() == "" else line)
    return blocks


def documented(doc: str, prefix: str) -> list[str]:
    """Each command in the fenced blocks or `inline code` of ROOT/doc that starts with
    PREFIX, continuation lines joined and a trailing `# comment` dropped."""
    text = (ROOT / doc).read_text()
    found = [m.group(1) for m in re.finditer(r"`([^`\n]+)`", text) if m.group(1).startswith(prefix)]
    for block in fenced_blocks(doc):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", command.strip())
            if command.startswith(prefix):
                found.append(" ".join(command.split()))
    assert found, f"{doc} documents no command starting with {prefix!r}"
    return found


def argv_of(command: str, **replace: str) -> list[str]:
    """The argv of a documented command; `.venv/bin/X` is this test run's virtualenv."""
    argv = shlex.split(command)
    argv = [replace.get(a, a) for a in argv]
    if argv[0].startswith(".venv/bin/"):
        argv[0] = str(BIN / argv[0].removeprefix(".venv/bin/"))
    return argv


def run_documented(command: str, var: Path, timeout: float = 120, **replace: str):
    return subprocess.run(
        argv_of(command, **replace),
        cwd=ROOT,
        env=users_environment(var),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


class Stack:
    """`make run` (scripts/run_stack.py) on ports of its own, data under VAR."""

    def __init__(self, var: Path):
        self.var = var
        first = free_block(13)
        self.url = f"http://127.0.0.1:{first}"
        self.ports = {
            "LIFEBOAT_BIND": f"127.0.0.1:{first}",
            "LIFEBOAT_REDIS_PORT": str(first + 1),
            "LIFEBOAT_S3_PORT": str(first + 2),
            "LIFEBOAT_S3_INTERNAL_PORT": str(first + 3),
        }
        self.lines: list[str] = []
        self.ready = threading.Event()
        env = users_environment(var, WEB_CONCURRENCY="1", LIFEBOAT_STOP_TIMEOUT="5", **self.ports)
        self.proc = subprocess.Popen(
            [sys.executable, "scripts/run_stack.py"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            process_group=0,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("=" * 78) and any("is running at" in x for x in self.lines):
                self.ready.set()

    def wait_ready(self, timeout: float = 120) -> Stack:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = "\n".join(self.lines[-40:])
                raise AssertionError(f"make run did not come up in {self.var}:\n{tail}")
        return self

    def banner_value(self, label: str) -> str:
        line = next(x for x in self.lines if x.strip().startswith(label))
        return line.split(":", 1)[1].split()[0]

    def banner_curl(self) -> str:
        """The `curl` command of the banner, as a user would paste it."""
        start = next(i for i, x in enumerate(self.lines) if x.strip().startswith("curl -sS"))
        end = next(i for i in range(start, len(self.lines)) if not self.lines[i].endswith("\\"))
        return "\n".join(self.lines[start : end + 1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
