"""Validation work is bounded and fair: a sparse file (declared huge, nearly nothing on
disk) is recognised without reading its holes and reported with the reason; a project
with many checks running leaves workers to the other projects that wait, and takes them
all when nobody else does."""

from __future__ import annotations

import hashlib
import os
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.events import saved
from tests.support.replication import make_checkpoint
from webapp.domain.lease import Busy
from webapp.domain.models import Checkpoint, Project, Validation
from webapp.domain.validation.checking import claim
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

GiB = 1024**3


def test_a_sparse_file_is_suspicious_and_its_holes_are_never_read(api, token, root):
    folder = root / "step-1"
    folder.mkdir()
    sparse = folder / "model.bin"
    with sparse.open("wb") as handle:
        handle.write(b"header")
        handle.truncate(64 * GiB)  # 64 GiB declared, a few bytes on disk
    body = saved(
        step=1, location=str(folder),
        files=[{"path": "model.bin", "size": 64 * GiB, "sha256": "0" * 64}],
    )  # fmt: skip
    assert api.post_events(token, body).status_code == 202
    checkpoint = Checkpoint.objects.get()
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "suspicious"
    assert "model.bin is sparse" in checkpoint.status_message
    assert "never written" in checkpoint.status_message
    validation = checkpoint.validations.get()
    assert validation.bytes_done < 1024 * 1024  # the holes were not read


def test_a_file_with_a_small_hole_is_still_hashed_and_verified(api, token, root):
    folder = root / "step-1"
    folder.mkdir()
    data = os.urandom(64 * 1024) + bytes(64 * 1024) + os.urandom(64 * 1024)
    path = folder / "weights.dat"
    with path.open("wb") as handle:  # the zeros in the middle as a real hole
        handle.write(data[: 64 * 1024])
        handle.seek(128 * 1024)
        handle.write(data[128 * 1024 :])
    assert path.read_bytes() == data
    body = saved(
        step=1, location=str(folder),
        files=[{"path": "weights.dat", "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest()}],
    )  # fmt: skip
    assert api.post_events(token, body).status_code == 202
    checkpoint = Checkpoint.objects.get()
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified", checkpoint.status_message


def running(checkpoint) -> Validation:
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verifying")
    return Validation.objects.create(
        checkpoint=checkpoint, kind="integrity", status="running", worker="node-1",
        started_at=timezone.now(), lease_until=timezone.now() + timedelta(minutes=2),
    )  # fmt: skip


def test_a_busy_project_leaves_workers_to_others_that_wait_and_takes_them_when_none_do(
    project, root, tmp_path, settings
):
    settings.VALIDATION_PROJECT_MAX_ACTIVE = 1
    busy_one = make_checkpoint(project, root, 1, {"m": b"1"}, status="reported")
    running(busy_one)
    waiting = make_checkpoint(project, root, 2, {"m": b"2"}, status="reported")
    other = Project.objects.create(name="Beta", slug="beta", allowed_roots=[str(tmp_path)])
    theirs = make_checkpoint(other, tmp_path, 1, {"m": b"3"}, status="reported")

    deferred = claim(waiting.pk, "system", False)
    assert isinstance(deferred, Busy) and deferred.retry_in_s <= 30
    assert Checkpoint.objects.get(pk=waiting.pk).status == "reported"
    assert not isinstance(claim(theirs.pk, "system", False), Busy)

    Checkpoint.objects.filter(pk=theirs.pk).update(status="verified")  # nobody else waits
    assert not isinstance(claim(waiting.pk, "system", False), Busy)
