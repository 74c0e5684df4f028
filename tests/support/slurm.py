"""The single-node Slurm cluster (scripts/slurm_single_node.sh) as a session fixture,
`slurm_cluster`: a test that needs it skips (fails under CI) when Slurm neither answers
nor can be started.
Loaded by tests/conftest.py (pytest_plugins)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.servers import ROOT, file_lock

SCRIPT = ROOT / "scripts" / "slurm_single_node.sh"


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _slurm_answers() -> bool:
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    states = proc.stdout.split()
    return proc.returncode == 0 and any(s in ("idle", "mixed", "allocated") for s in states)


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    if os.geteuid() != 0:
        if _slurm_answers():
            return
        problem = f"not root, and no Slurm answers: run `sudo bash {SCRIPT}` first"
        if IN_CI:
            pytest.fail(f"Slurm tests cannot run under CI: {problem}", pytrace=False)
        pytest.skip(f"SLURM TESTS NOT RUN: {problem}")
    # One start at a time: the parallel test processes (pytest-xdist) each ask for it.
    try:
        with file_lock(Path(tempfile.gettempdir()) / "lifeboat-slurm-start.lock"):
            proc = subprocess.run(
                ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600
            )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{SCRIPT} did not finish within 600 s", pytrace=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        pytest.fail(f"Slurm did not start ({SCRIPT}):\n{tail}", pytrace=False)
