"""A project's own restore check that first tries what it must not reach: the restore
worker that started it (its parent: /proc/<ppid>/environ, where the worker's secrets
are). tests/test_launch_isolation.py registers it; it then checks the digits model as
examples/digits_checks.py does."""

from __future__ import annotations

import os

from examples.digits_checks import forward as digits_forward


def forward():
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as handle:
            handle.read(1)
    except OSError:
        return digits_forward()
    raise RuntimeError("this check could read the restore worker's environment")
