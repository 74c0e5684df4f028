"""What a job sends, as the tests write it: events at fixed times after T0 (`event`,
`saved` for a checkpoint.saved with two files)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


SHA = "ab" * 32


def at(seconds: float) -> str:
    """An ISO 8601 time `seconds` after T0."""
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def event(type_: str, run: str = "run-1", t: float = 0, **fields) -> dict:
    return {"id": str(uuid.uuid4()), "type": type_, "run": run, "time": at(t), **fields}


def saved(run: str = "run-1", step: int = 100, t: float = 0, **fields) -> dict:
    body = {
        "step": step,
        "epoch": 1,
        "location": f"/data/{run}/step-{step}",
        "files": [
            {"path": "model.pt", "size": 1000, "sha256": SHA},
            {"path": "optim.pt", "size": 500, "sha256": "cd" * 32},
        ],
        "save_seconds": 1.5,
        "metrics": {"loss": 0.25},
        "format": "torch",
    }
    body.update(fields)
    return event("checkpoint.saved", run=run, t=t, **body)
