"""Restore tests against a real S3 server: a good replica comes back, verified, loaded
and timed; a replica damaged in S3 fails clearly; and a real worker on the `restore`
queue runs one asked for through the API."""

from __future__ import annotations

import uuid

import pytest
import torch

from tests.conftest import queued_tasks, saved, start_worker, stop_worker, wait_for
from webapp.domain import restore_test as rt
from webapp.domain.models import Checkpoint, Replica, StorageTarget, Validation
from webapp.domain.replication import policy
from workers.replicate import replicate
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def replicated(api, token, project, s3, tmp_path, settings):
    """A verified two-file torch checkpoint with a verified replica on the test S3."""
    settings.SCRATCH_DIR = tmp_path / "scratch"
    directory = tmp_path / "ckpts" / "step-7"
    directory.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    torch.save({"w": torch.randn(256, 256, generator=generator)}, directory / "model.pt")
    torch.save({"step": 7, "m": torch.zeros(256)}, directory / "optim.pt")
    project.allowed_roots = [str(tmp_path / "ckpts")]
    project.save()
    from tests.test_validation import file_entry

    files = [file_entry(directory / n, n) for n in ("model.pt", "optim.pt")]
    body = saved(run="r", step=7, location=str(directory), files=files)
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


def test_a_good_replica_restores_and_every_phase_is_timed(replicated, queues):
    validation = rt.request(replicated)
    assert rt.run(validation.pk) == "passed"
    validation.refresh_from_db()
    assert validation.kind == "restore" and validation.device == "cpu"
    for phase in ("download_verify_s", "load_s", "to_device_s", "total_s"):
        assert validation.timings[phase] >= 0, phase
    assert validation.timings["peak_host_bytes"] > 0
    assert validation.bytes_done == validation.bytes_total == replicated.total_size
    assert validation.message.startswith("Restored from backup in ")
    assert "2 tensors (257.0 KiB) loaded" in validation.message
    assert rt.run(validation.pk) == "not claimed"  # a second delivery changes nothing


def test_a_replica_damaged_in_s3_fails_clearly(replicated, s3, queues):
    replica = Replica.objects.get()
    entry = next(e for e in replica.files if e["path"] == "model.pt")
    original = s3.client.get_object(Bucket=s3.bucket, Key=entry["key"])["Body"].read()
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF
    s3.client.put_object(Bucket=s3.bucket, Key=entry["key"], Body=bytes(damaged))
    validation = rt.request(replicated)
    assert rt.run(validation.pk) == "failed"
    validation.refresh_from_db()
    assert validation.message.startswith("The replica on backup does not restore:")
    assert "model.pt" in validation.message and "sha256" in validation.message


def test_without_a_verified_replica_there_is_nothing_to_restore(api, token, project, queues):
    assert api.post_events(token, saved(run="r", step=1)).status_code == 202
    checkpoint = Checkpoint.objects.get()
    answer = api.post(token, f"/checkpoints/{checkpoint.pk}/restore-test")
    assert answer.status_code == 409 and "no verified replica" in answer.json()["error"]
    validation = rt.request(checkpoint)
    assert rt.run(validation.pk) == "error"
    validation.refresh_from_db()
    assert "replicate this checkpoint first" in validation.message


def test_the_api_queues_it_and_a_real_restore_worker_runs_it(
    replicated, api, token, queues, worker_env, tmp_path, s3
):
    answer = api.post(token, f"/checkpoints/{replicated.pk}/restore-test")
    assert answer.status_code == 202, answer.content
    validation_id = answer.json()["validation"]
    (task,) = queued_tasks(queues, "restore")
    assert task["task"] == "workers.restore.restore_test" and task["args"] == [validation_id]
    # Asked twice while queued: the same test, not a second one.
    again = api.post(token, f"/checkpoints/{replicated.pk}/restore-test").json()
    assert again["validation"] == validation_id

    env = {
        **worker_env,
        "S3_ENDPOINT_URL": s3.endpoint,
        "S3_ACCESS_KEY_ID": s3.key,
        "S3_SECRET_ACCESS_KEY": s3.secret,
        "LIFEBOAT_SCRATCH_DIR": str(tmp_path / "scratch"),
    }
    worker = start_worker(env, "restore", tmp_path / "restore-worker.log")
    try:
        validation = wait_for(
            lambda: Validation.objects.filter(pk=validation_id, status="passed").first(),
            90, 0.3,
        )  # fmt: skip
    finally:
        stop_worker(worker)
    assert validation.timings["total_s"] > 0
    assert not any((tmp_path / "scratch").iterdir())  # scratch space cleaned up
