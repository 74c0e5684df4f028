"""Reading a /metrics scrape as Prometheus does."""

from __future__ import annotations

import re


def sample(text: str, name: str, **labels) -> float:
    """The value of the sample with exactly these labels, in whatever order written."""
    for found in re.finditer("^" + re.escape(name) + r"(?:\{(.*)\})? (\S+)$", text, re.M):
        if dict(re.findall(r'(\w+)="([^"]*)"', found.group(1) or "")) == labels:
            return float(found.group(2))
    raise AssertionError(f"{name} {labels} not in:\n{text}")
