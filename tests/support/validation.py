"""Validation as the tests drive it: a small torch model written to disk, the file entry
a job reports for it, and a checkpoint reported and validated in this process."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from tests.support.events import saved
from webapp.domain.models import Checkpoint
from workers.validate import validate_checkpoint


def file_entry(path: Path, rel: str) -> dict:
    data = path.read_bytes()
    return {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)


def small_model(seed: int = 0, **overrides) -> dict:
    generator = torch.Generator().manual_seed(seed)
    state = {
        "layer1.weight": torch.randn(64, 32, generator=generator),
        "layer1.bias": torch.randn(64, generator=generator),
        "fc.weight": torch.randn(10, 64, generator=generator),
    }
    state.update(overrides)
    return state


def report(
    api, token, directory: Path, step: int, run: str = "run-1", t: float | None = None
) -> Checkpoint:
    files = [file_entry(p, p.name) for p in sorted(directory.iterdir()) if p.is_file()]
    body = saved(
        run=run, step=step, t=step if t is None else t, location=str(directory), files=files
    )
    response = api.post_events(token, body)
    assert response.status_code == 202, response.content
    return Checkpoint.objects.get(run__key=run, step=step)


def check(checkpoint: Checkpoint) -> Checkpoint:
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    return checkpoint
