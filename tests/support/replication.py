"""Replication as the tests drive it: a storage target on the tests' S3 server (under a
prefix of their own, `PREFIX`), checkpoints whose files are on disk, and one
replication run to its end (`replicate_now`)."""

from __future__ import annotations

import hashlib

from django.utils import timezone

from webapp.domain.models import Checkpoint, CheckpointFile, Replica, Run, StorageTarget
from webapp.domain.replication import policy
from workers.replicate import replicate

MiB = 1024 * 1024


PREFIX = "replicas"


def make_target(project, s3, name: str, **fields) -> StorageTarget:
    fields.setdefault("bucket", s3.bucket)
    fields.setdefault("prefix", f"{PREFIX}/{name}")
    fields.setdefault("endpoint_url", s3.endpoint)
    return StorageTarget.objects.create(project=project, name=name, **fields)


def make_checkpoint(
    project, root, step: int, files: dict[str, bytes], run: str = "run-1", **fields
) -> Checkpoint:
    """A checkpoint as validation leaves it: files on disk, recorded, verified."""
    run_row, _ = Run.objects.get_or_create(project=project, key=run)
    directory = root / run / f"step-{step}"
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    fields.setdefault("status", "verified")
    checkpoint = Checkpoint.objects.create(
        project=project,
        run=run_row,
        step=step,
        location=str(directory),
        total_size=sum(len(d) for d in files.values()),
        file_count=len(files),
        verified_at=timezone.now(),
        **fields,
    )
    CheckpointFile.objects.bulk_create(
        CheckpointFile(
            checkpoint=checkpoint,
            path=name,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        for name, data in files.items()
    )
    return checkpoint


def replicate_now(checkpoint) -> list[Replica]:
    """Create the checkpoint's replicas as its policies say, and run each task here."""
    from django.db import transaction

    with transaction.atomic():
        ids = policy.request(checkpoint)
    for replica_id in ids:
        replicate(replica_id)
    return list(Replica.objects.filter(pk__in=ids).select_related("target").order_by("pk"))


def objects(s3, prefix: str) -> dict[str, dict]:
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])
    return {item["Key"]: item for item in listed}


def open_uploads(s3, prefix: str) -> list:
    return s3.client.list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix).get("Uploads", [])
