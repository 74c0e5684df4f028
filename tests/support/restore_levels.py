"""The restore levels' digits checkpoint: the `digits` fixture (a run of
examples/digits.py, validated and replicated) and one restore test at a level.
Loaded by tests/conftest.py (pytest_plugins)."""

from __future__ import annotations

import uuid

import pytest

from tests.support.client_scripts import train_digits
from webapp.domain.models import Checkpoint, StorageTarget
from webapp.domain.recovery import restore_test as rt
from webapp.domain.replication import policy
from workers.replicate import replicate
from workers.validate import validate_checkpoint

CHECKS = {
    "forward": "examples.digits_checks:forward",
    "replay": "examples.digits_checks:replay",
    "replay_steps": 5,
}


def verified_with_replica(checkpoint, project, s3) -> Checkpoint:
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified", checkpoint.status_message
    target, _ = StorageTarget.objects.get_or_create(
        project=project,
        name="backup",
        defaults={
            "bucket": s3.bucket,
            "prefix": f"levels-{uuid.uuid4().hex[:6]}",
            "endpoint_url": s3.endpoint,
        },
    )
    (replica_id,) = policy.request(checkpoint, [target], by_policy=False)
    assert replicate(replica_id) == "verified"
    return checkpoint


@pytest.fixture
def digits(server, s3, token, project, tmp_path, settings):
    settings.SCRATCH_DIR = tmp_path / "scratch"
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.restore_checks = CHECKS
    project.save()
    train_digits(server, token, tmp_path, "digits", seed=0)
    return Checkpoint.objects.get(run__key="digits", step=23)


def restore(checkpoint) -> tuple[str, object]:
    validation = rt.request(checkpoint)
    outcome = rt.run(validation.pk)
    validation.refresh_from_db()
    return outcome, validation
