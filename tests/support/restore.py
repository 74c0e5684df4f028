"""Restore tests as the tests drive them: a checkpoint validated and replicated, a damaged
file, and one restore test run in this process."""

from __future__ import annotations

import uuid
from pathlib import Path

import torch

from tests.support.events import saved
from webapp.domain.models import Checkpoint, Replica, StorageTarget, Validation
from webapp.domain.recovery import restore_test as rt
from webapp.domain.replication import policy
from workers.replicate import replicate
from workers.validate import validate_checkpoint


def replicate_checkpoint(files: dict, api, token, project, s3, tmp_path: Path, settings):
    """`files` ({name: object to torch.save}) as a verified checkpoint of step 7 with a
    verified replica on the test S3."""
    settings.SCRATCH_DIR = tmp_path / "scratch"
    directory = tmp_path / "ckpts" / "step-7"
    directory.mkdir(parents=True)
    for name, obj in files.items():
        torch.save(obj, directory / name)
    project.allowed_roots = [str(tmp_path / "ckpts")]
    project.save()
    from tests.support.validation import file_entry

    entries = [file_entry(directory / name, name) for name in files]
    body = saved(run="r", step=7, location=str(directory), files=entries)
    assert api.post_events(token, body).status_code == 202
    checkpoint = Checkpoint.objects.get()
    validate_checkpoint(checkpoint.pk)
    target = StorageTarget.objects.create(
        project=project,
        name="backup",
        bucket=s3.bucket,
        prefix=f"restore-{uuid.uuid4().hex[:6]}",
        endpoint_url=s3.endpoint,
    )
    (replica_id,) = policy.request(checkpoint, [target], by_policy=False)
    replicate(replica_id)
    assert Replica.objects.get(pk=replica_id).status == "verified"
    return checkpoint


def damage(s3, path: str, offset: int) -> None:
    """Flips one byte of the replica's object for `path` in S3."""
    entry = next(e for e in Replica.objects.get().files if e["path"] == path)
    data = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=entry["key"])["Body"].read())
    data[offset] ^= 0xFF
    s3.client.put_object(Bucket=s3.bucket, Key=entry["key"], Body=bytes(data))


def restore(checkpoint) -> Validation:
    validation = rt.request(checkpoint)
    rt.run(validation.pk)
    validation.refresh_from_db()
    return validation
