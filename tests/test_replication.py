"""Replication to S3 against a real SeaweedFS: what lands on the target, checked with
boto3; deduplication; a source that changed after validation; retries and failure; the
API's view of replicas, and restoring from one."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
import uuid

import pytest
from django.utils import timezone

from tests.support import replication
from tests.support.celery_workers import queued_tasks
from tests.support.replication import (
    PREFIX,
    MiB,
    make_checkpoint,
    make_target,
    objects,
    open_uploads,
    replicate_now,
)
from tests.support.servers import free_port
from webapp.domain.models import Checkpoint, Event, Replica, StorageTarget
from webapp.domain.replication import policy
from webapp.domain.replication.restore import RestoreError, restore_replica
from workers.replicate import replicate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


@pytest.fixture
def small_parts(settings):
    # S3's smallest part, so that a 12 MiB file is a 3-part multipart upload.
    settings.REPLICATION_PART_SIZE = 5 * MiB
    settings.REPLICATION_CONCURRENCY = 3


@pytest.fixture(autouse=True)
def _own_prefix(monkeypatch):
    # The S3 bucket is shared by the session's tests: each test writes under its own
    # prefix, so that what one finds there is its own (make_target writes under
    # tests.support.replication.PREFIX).
    global PREFIX
    PREFIX = f"replicas-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(replication, "PREFIX", PREFIX)


def test_a_checkpoint_is_copied_to_two_targets_with_the_manifest_last(
    project, root, s3, small_parts
):
    model = os.urandom(12 * MiB + 123)
    config = b'{"lr": 0.1}'
    checkpoint = make_checkpoint(project, root, 100, {"model.pt": model, "config.json": config})
    make_target(project, s3, "main")
    make_target(project, s3, "dr", storage_class="STANDARD")
    replicas = replicate_now(checkpoint)
    assert [(r.target.name, r.status) for r in replicas] == [
        ("main", "verified"),
        ("dr", "verified"),
    ]
    for replica in replicas:
        assert replica.last_error == ""
        assert replica.attempts == 1
        assert replica.bytes_done == replica.bytes_total == len(model) + len(config)
        assert replica.progress()["eta_s"] is None
        stored = objects(s3, f"{PREFIX}/{replica.target.name}/")
        manifest_key = f"{PREFIX}/{replica.target.name}/manifests/alpha/run-1/step-100.json"
        assert replica.manifest_key == manifest_key
        for data in (model, config):
            sha = hashlib.sha256(data).hexdigest()
            key = f"{PREFIX}/{replica.target.name}/sha256/{sha[:2]}/{sha}"
            head = s3.client.head_object(Bucket=s3.bucket, Key=key)
            assert head["Metadata"]["sha256"] == sha
            assert head["ContentLength"] == len(data)
            body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            assert hashlib.sha256(body).hexdigest() == sha
            # The manifest is written after every object it names.
            assert stored[manifest_key]["LastModified"] >= stored[key]["LastModified"]
        # 12 MiB in 5 MiB parts: a multipart upload of three parts.
        model_key = next(f["key"] for f in replica.files if f["path"] == "model.pt")
        assert stored[model_key]["ETag"].strip('"').endswith("-3")
        manifest = json.loads(
            s3.client.get_object(Bucket=s3.bucket, Key=manifest_key)["Body"].read()
        )
        assert manifest["format"] == "lifeboat.replica/1"
        assert (manifest["run"], manifest["step"]) == ("run-1", 100)
        assert sorted((f["path"], f["size"], f["sha256"]) for f in manifest["files"]) == sorted(
            checkpoint.files.values_list("path", "size", "sha256")
        )
        assert open_uploads(s3, f"{PREFIX}/{replica.target.name}/") == []
    assert Event.objects.filter(type="replica.verified").count() == 2
    assert replicate(replicas[0].pk) == "settled"  # a second copy of the task does nothing


@pytest.mark.parametrize("checksum", ["SHA256", "CRC32"])
def test_every_part_carries_a_checksum_the_server_checks(
    project, root, s3, small_parts, settings, checksum
):
    settings.REPLICATION_PART_CHECKSUM = checksum
    data = os.urandom(11 * MiB)
    checkpoint = make_checkpoint(project, root, 1, {"model.pt": data})
    make_target(project, s3, "main")
    (replica,) = replicate_now(checkpoint)
    assert replica.status == "verified", replica.last_error
    key = replica.files[0]["key"]
    head = s3.client.head_object(Bucket=s3.bucket, Key=key, ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-3")
    # The server kept a composite checksum of the parts' checksums of that kind.
    assert head.get(f"Checksum{checksum}"), head


def test_files_already_on_the_target_are_not_sent_again(project, root, s3, small_parts):
    tokenizer = os.urandom(2 * MiB)
    make_target(project, s3, "main")
    first = make_checkpoint(
        project, root, 1, {"model.pt": os.urandom(6 * MiB), "tokenizer.json": tokenizer}
    )
    (one,) = replicate_now(first)
    assert one.bytes_sent == 8 * MiB
    second_model = os.urandom(6 * MiB)
    second = make_checkpoint(
        project, root, 2, {"model.pt": second_model, "tokenizer.json": tokenizer}
    )
    (two,) = replicate_now(second)
    assert two.status == "verified"
    assert two.bytes_done == two.bytes_total == 8 * MiB
    assert two.bytes_sent == len(second_model)  # the tokenizer was there already
    assert (
        "1 already there, not sent again"
        in Event.objects.filter(type="replica.verified").last().message
    )
    blobs = [k for k in objects(s3, f"{PREFIX}/main/sha256/")]
    assert len(blobs) == 3  # two models, one tokenizer


def test_a_byte_flipped_after_validation_fails_the_copy_and_flags_the_checkpoint(
    project, root, s3, small_parts
):
    model = bytearray(os.urandom(11 * MiB))
    checkpoint = make_checkpoint(project, root, 7, {"model.pt": bytes(model)})
    model[9 * MiB] ^= 0x01  # in the last part: the first two were already sent
    (root / "run-1" / "step-7" / "model.pt").write_bytes(bytes(model))
    make_target(project, s3, "main")
    (replica,) = replicate_now(checkpoint)
    assert replica.status == "failed"
    assert replica.verified_at is None
    assert "model.pt does not match its recorded sha256" in replica.last_error
    assert "changed after validation" in replica.last_error
    checkpoint.refresh_from_db()
    assert checkpoint.status == "corrupt"
    assert checkpoint.status_message.startswith("Found while copying to main: model.pt")
    # Nothing under the content address, no manifest, no parts left behind.
    assert objects(s3, f"{PREFIX}/main/") == {}
    assert open_uploads(s3, f"{PREFIX}/main/") == []
    assert Event.objects.filter(type="checkpoint.corrupt", step=7).exists()


def test_a_small_file_changed_after_validation_is_never_sent(project, root, s3):
    checkpoint = make_checkpoint(project, root, 7, {"config.json": b'{"lr": 0.1}'})
    (root / "run-1" / "step-7" / "config.json").write_bytes(b'{"lr": 0.2}')
    make_target(project, s3, "main")
    (replica,) = replicate_now(checkpoint)
    assert replica.status == "failed"
    assert "config.json does not match its recorded sha256" in replica.last_error
    assert objects(s3, f"{PREFIX}/main/") == {}


def test_an_unreachable_target_is_retried_with_backoff_then_failed_never_verified(
    project, root, settings, queues, s3
):
    settings.REPLICATION_MAX_ATTEMPTS = 3
    settings.REPLICATION_RETRY_BASE_S = 5
    settings.REPLICATION_S3_RETRIES = 1
    checkpoint = make_checkpoint(project, root, 1, {"model.pt": b"x" * 1000})
    StorageTarget.objects.create(
        project=project, name="down", bucket="b", endpoint_url=f"http://127.0.0.1:{free_port()}"
    )
    (replica,) = replicate_now(checkpoint)
    assert (replica.status, replica.attempts) == ("pending", 1)
    assert "Could not connect to the endpoint URL" in replica.last_error
    # The retry is queued with its backoff, and an early copy waits for it.
    # (after the first message, queued when the replica was created).
    assert [t["args"] for t in queued_tasks(queues, "replicate")] == [[replica.pk]] * 2
    assert replicate(replica.pk) == "busy"
    first_delay = (replica.lease_until - timezone.now()).total_seconds()
    assert 3 < first_delay <= 5
    Replica.objects.filter(pk=replica.pk).update(lease_until=None)  # time passes
    replicate(replica.pk)
    replica.refresh_from_db()
    assert (replica.status, replica.attempts) == ("pending", 2)
    assert 8 < (replica.lease_until - timezone.now()).total_seconds() <= 10  # doubled
    Replica.objects.filter(pk=replica.pk).update(lease_until=None)
    replicate(replica.pk)
    replica.refresh_from_db()
    assert replica.status == "failed"
    assert replica.attempts == 3
    assert replica.last_error.startswith("Could not copy to down after 3 attempts; last error:")
    assert replica.verified_at is None
    assert Event.objects.filter(type="replica.failed").count() == 1


def test_only_verified_checkpoints_are_copied(project, root, s3):
    checkpoint = make_checkpoint(project, root, 1, {"model.pt": b"x"}, status="suspicious")
    target = make_target(project, s3, "main")
    replica = Replica.objects.create(checkpoint=checkpoint, target=target)
    assert replicate(replica.pk) == "settled"
    replica.refresh_from_db()
    assert replica.status == "failed"
    assert "only verified checkpoints are copied" in replica.last_error


def test_policies_choose_what_each_target_receives(project, root, s3, queues):
    every = make_target(project, s3, "all")
    second = make_target(project, s3, "every-2", policy="every_n", policy_every_n=2)
    best = make_target(project, s3, "best", policy="best", policy_metric="loss")
    latest = make_target(project, s3, "latest", policy="latest")
    manual = make_target(project, s3, "manual", policy="manual")
    losses = {1: 0.9, 2: 0.5, 3: 0.7, 4: 0.4}
    for step in (1, 2, 4, 3):  # step 3 arrives late
        checkpoint = make_checkpoint(
            project, root, step, {"m": b"x"}, metrics={"loss": losses[step]}
        )
        policy.on_verified(checkpoint.pk)
    got = {
        t.name: sorted(Replica.objects.filter(target=t).values_list("checkpoint__step", flat=True))
        for t in (every, second, best, latest, manual)
    }
    assert got == {
        "all": [1, 2, 3, 4],
        "every-2": [2, 4],
        "best": [1, 2, 4],  # 3 (0.7) came after 0.4 and 0.5
        "latest": [1, 2, 4],  # 3 came after 4
        "manual": [],
    }
    assert len(queued_tasks(queues, "replicate")) == 4 + 2 + 3 + 3


def test_a_verified_checkpoint_is_queued_for_replication(api, token, project, root, s3, queues):
    from tests.support.validation import report, small_model, write_state
    from workers.validate import validate_checkpoint

    target = make_target(project, s3, "main")
    write_state(root / "step-1" / "model.pt", small_model())
    checkpoint = report(api, token, root / "step-1", 1)
    queues.flushdb()
    validate_checkpoint(checkpoint.pk)
    replica = Replica.objects.get(checkpoint=checkpoint, target=target)
    assert replica.status == "pending"
    assert [t["args"] for t in queued_tasks(queues, "replicate")] == [[replica.pk]]
    # A second validation of the same files asks for nothing new.
    validate_checkpoint(checkpoint.pk, revalidate=True)
    assert Replica.objects.count() == 1


def test_the_api_lists_replicas_with_presigned_urls_a_plain_client_can_use(
    api, read_token, token, project, root, s3, tmp_path, settings
):
    from lifeboat.download import download_files

    settings.S3_CREDENTIALS_REFS = ["LB_SECRET_NAME=alpha"]

    data = os.urandom(300_000)
    checkpoint = make_checkpoint(project, root, 5, {"model.pt": data})
    make_target(project, s3, "main", credentials_ref="LB_SECRET_NAME")
    replicate_now(checkpoint)
    for path in ("/runs/run-1/latest", f"/checkpoints/{checkpoint.pk}"):
        body = api.get(read_token, path).json()
        (replica,) = body["replicas"]
        assert replica["target"] == "main"
        assert replica["status"] == "verified"
        assert replica["bytes_total"] == len(data)
        assert replica["attempts"] == 1
        assert "LB_SECRET_NAME" not in json.dumps(body)  # credentials are never shown
        (entry,) = replica["files"]
        assert (entry["path"], entry["size"]) == ("model.pt", len(data))
        with urllib.request.urlopen(entry["url"], timeout=10) as response:
            assert hashlib.sha256(response.read()).hexdigest() == entry["sha256"]
    seen = []
    download_files(replica["files"], tmp_path / "out", lambda done, total: seen.append(done))
    assert (tmp_path / "out" / "model.pt").read_bytes() == data
    assert seen[-1] == len(data)


def test_replicate_action_queues_a_copy_and_retries_a_failed_one(
    api, token, read_token, project, root, s3, queues
):
    checkpoint = make_checkpoint(project, root, 5, {"model.pt": b"abc"})
    target = make_target(project, s3, "main", policy="manual")
    replica = Replica.objects.create(
        checkpoint=checkpoint, target=target, status="failed", attempts=6, last_error="boom"
    )
    response = api.post(token, f"/checkpoints/{checkpoint.pk}/replicate")
    assert response.status_code == 202, response.content
    assert response.json()["replicas"] == [replica.pk]
    replica.refresh_from_db()
    assert (replica.status, replica.attempts, replica.last_error) == ("pending", 0, "")
    assert [t["args"] for t in queued_tasks(queues, "replicate")] == [[replica.pk]]
    assert api.post(read_token, f"/checkpoints/{checkpoint.pk}/replicate").status_code == 403
    response = api.post(token, f"/checkpoints/{checkpoint.pk}/replicate", {"target": "nope"})
    assert response.status_code == 404
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="corrupt")
    response = api.post(token, f"/checkpoints/{checkpoint.pk}/replicate")
    assert response.status_code == 409
    assert "only verified checkpoints are copied" in response.json()["error"]


def test_restore_downloads_and_verifies_every_file(project, root, s3, small_parts, tmp_path):
    files = {"model.pt": os.urandom(7 * MiB), "sub/config.json": b"{}"}
    checkpoint = make_checkpoint(project, root, 3, files)
    make_target(project, s3, "main")
    (replica,) = replicate_now(checkpoint)
    seen = []
    restore_replica(replica, tmp_path / "restored", lambda d, t: seen.append((d, t)))
    for name, data in files.items():
        assert (tmp_path / "restored" / name).read_bytes() == data
    assert seen[-1] == (len(files["model.pt"]) + 2, len(files["model.pt"]) + 2)
    # An object damaged on the target is refused, and nothing half-written is left.
    key = next(f["key"] for f in replica.files if f["path"] == "model.pt")
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=b"rotten")
    with pytest.raises(RestoreError, match="model.pt does not match its sha256"):
        restore_replica(replica, tmp_path / "again")
    assert not (tmp_path / "again" / "model.pt").exists()
    assert not (tmp_path / "again" / "model.pt.partial").exists()


def test_replicas_nobody_is_working_on_are_queued_again(project, root, s3, queues):
    from datetime import timedelta

    from webapp.domain.replication import owed

    def requeue_unfinished() -> int:
        return len(owed.resend(timezone.now(), 1000))

    target = make_target(project, s3, "main")
    old = timezone.now() - timedelta(minutes=10)
    lost = Replica.objects.create(
        checkpoint=make_checkpoint(project, root, 1, {"m": b"1"}), target=target, created_at=old
    )
    dead = Replica.objects.create(
        checkpoint=make_checkpoint(project, root, 2, {"m": b"2"}),
        target=target,
        status="uploading",
        lease_until=old,
    )
    Replica.objects.create(  # just created: its message is surely still queued
        checkpoint=make_checkpoint(project, root, 3, {"m": b"3"}), target=target
    )
    Replica.objects.create(  # a worker holds it
        checkpoint=make_checkpoint(project, root, 4, {"m": b"4"}),
        target=target,
        status="uploading",
        lease_until=timezone.now() + timedelta(seconds=60),
    )
    Replica.objects.create(
        checkpoint=make_checkpoint(project, root, 5, {"m": b"5"}),
        target=target,
        status="verified",
        created_at=old,
    )
    assert requeue_unfinished() == 2
    queued = sorted(t["args"][0] for t in queued_tasks(queues, "replicate"))
    assert queued == sorted([lost.pk, dead.pk])


def test_multipart_uploads_no_replica_knows_of_are_aborted(project, root, s3, settings):
    from workers.replicate import abort_abandoned_uploads

    target = make_target(project, s3, "main")
    key = f"{PREFIX}/main/sha256/ab/" + "ab" * 32
    orphan = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    # One a replica being made knows of: its own next attempt deals with it.
    known = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=key + "x")["UploadId"]
    Replica.objects.create(
        checkpoint=make_checkpoint(project, root, 1, {"m": b"1"}),
        target=target,
        status="uploading",
        uploads={key + "x": known},
    )
    settings.REPLICATION_ABANDONED_UPLOAD_S = 3600
    assert abort_abandoned_uploads() == 0  # too recent
    settings.REPLICATION_ABANDONED_UPLOAD_S = 0
    assert abort_abandoned_uploads() == 1
    left = [u["UploadId"] for u in open_uploads(s3, f"{PREFIX}/main/")]
    assert orphan not in left
    assert left == [known]
    s3.client.abort_multipart_upload(Bucket=s3.bucket, Key=key + "x", UploadId=known)
