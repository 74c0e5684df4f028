"""A verified checkpoint with a launch profile, ready to be resumed (`verified_checkpoint`)."""

from __future__ import annotations

import hashlib

from tests.support.dashboard import make_checkpoint, make_run
from webapp.domain.models import Checkpoint, CheckpointFile


def verified_checkpoint(project, run_key: str, folder, step: int = 7) -> Checkpoint:
    """A verified checkpoint whose one file really is on disk, whole: preparing it for a
    resume finds it so and goes on to launch."""
    folder.mkdir(parents=True, exist_ok=True)
    data = b"weights" * 100
    (folder / "model.pt").write_bytes(data)
    run = make_run(project, run_key)
    checkpoint = make_checkpoint(run, step, file_count=1, total_size=len(data))
    Checkpoint.objects.filter(pk=checkpoint.pk).update(location=str(folder))
    checkpoint.refresh_from_db()
    CheckpointFile.objects.create(
        checkpoint=checkpoint, path="model.pt", size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )  # fmt: skip
    return checkpoint
