"""The `lifeboat` command line as the tests run it: its environment (`cli_env`) and one
invocation (`lifeboat`)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.servers import ROOT


def cli_env(url: str, token: str | None, tmp_path) -> dict:
    """What the command runs with: nothing of this process's environment but PATH."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(ROOT),
        "LIFEBOAT_URL": url,
        "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
    }
    if token:
        env["LIFEBOAT_TOKEN"] = token
    return env


def lifeboat(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lifeboat", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
