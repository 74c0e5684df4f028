"""Replication under faults, with real Celery worker processes: a worker killed with
SIGKILL in the middle of a multipart upload, and an S3 server stopped in the middle of
one (a SeaweedFS of this test's own, on ports of its own)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from tests.support.replication import make_checkpoint
from tests.support.servers import ROOT, free_port, wait_for
from webapp.domain.models import Replica, StorageTarget
from webapp.domain.replication import policy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

MiB = 1024 * 1024


@pytest.fixture
def replicate_env(worker_env, s3):
    """A worker that sends 5 MiB parts at 8 MiB/s (so that a test can act in the middle
    of an upload), holds its lease 2 s and retries after 1 s, 2 s, 2 s..."""
    return {
        **worker_env,
        "S3_ENDPOINT_URL": s3.endpoint,
        "S3_ACCESS_KEY_ID": s3.key,
        "S3_SECRET_ACCESS_KEY": s3.secret,
        "REPLICATION_PART_SIZE": str(5 * MiB),
        "REPLICATION_CONCURRENCY": "2",
        "REPLICATION_MAX_BYTES_PER_S": str(8 * MiB),
        "REPLICATION_LEASE_S": "2",
        "REPLICATION_RETRY_BASE_S": "1",
        "REPLICATION_RETRY_MAX_S": "2",
        "REPLICATION_MAX_ATTEMPTS": "40",
        "REPLICATION_S3_RETRIES": "1",
        # A short visibility timeout so that a redelivery comes within the test.
        "CELERY_VISIBILITY_TIMEOUT": "6",
    }


class Workers:
    def __init__(self, env: dict, log_dir: Path):
        self.env, self.log_dir, self.started = env, log_dir, []

    def start(self, name: str) -> subprocess.Popen:
        log = (self.log_dir / f"{name}.log").open("w")
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "replicate",
             "-P", "solo", "-l", "info", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-n", f"{name}@%h"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()


@pytest.fixture
def workers(replicate_env, tmp_path, queues):
    started = Workers(replicate_env, tmp_path)
    yield started
    started.stop_all()


def queue_replicas(checkpoint) -> list[int]:
    from django.db import transaction

    with transaction.atomic():
        return policy.request(checkpoint)


def open_uploads(client, bucket: str, prefix: str) -> list:
    return client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])


def test_a_worker_killed_mid_upload_is_redelivered_and_finishes_cleanly(project, root, s3, workers):
    data = os.urandom(32 * MiB)  # 4 s at 8 MiB/s
    checkpoint = make_checkpoint(project, root, 1, {"model.pt": data})
    prefix = f"killed-{uuid.uuid4().hex[:8]}"
    StorageTarget.objects.create(
        project=project, name="main", bucket=s3.bucket, prefix=prefix, endpoint_url=s3.endpoint
    )
    first = workers.start("first")
    (replica_id,) = queue_replicas(checkpoint)
    wait_for(
        lambda: (
            Replica.objects.filter(pk=replica_id, uploads__isnull=False, bytes_done__gt=0)
            .exclude(uploads={})
            .exists()
        ),
        timeout=60,
        interval=0.02,
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    replica = Replica.objects.get(pk=replica_id)
    assert replica.status == "uploading"
    assert 0 < replica.bytes_done < len(data)
    assert len(open_uploads(s3.client, s3.bucket, prefix)) == 1  # parts left behind
    workers.start("second")
    wait_for(lambda: Replica.objects.get(pk=replica_id).is_final, timeout=90, interval=0.2)
    replica.refresh_from_db()
    assert replica.status == "verified", replica.last_error
    assert replica.attempts == 2
    assert replica.uploads == {}
    assert open_uploads(s3.client, s3.bucket, prefix) == []
    (entry,) = replica.files
    body = s3.client.get_object(Bucket=s3.bucket, Key=entry["key"])["Body"].read()
    assert hashlib.sha256(body).hexdigest() == entry["sha256"] == hashlib.sha256(data).hexdigest()
    s3.client.head_object(Bucket=s3.bucket, Key=replica.manifest_key)


class OwnS3:
    """A SeaweedFS that this test may stop and start: its own directory, every port of
    its own (none of them the session's 8333)."""

    FLAGS = ("s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port",
             "volume.port.grpc", "filer.port", "filer.port.grpc", "admin.port",
             "admin.port.grpc", "webdav.port")  # fmt: skip

    def __init__(self, directory: Path):
        self.directory = directory
        self.ports = {flag: free_port() for flag in self.FLAGS}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="k",
            aws_secret_access_key="s",
            config=Config(connect_timeout=1, read_timeout=10, retries={"max_attempts": 1}),
        )
        self.process = None

    def answers(self) -> bool:
        try:
            self.client.list_buckets()
            return True
        except Exception:
            return False

    def start(self) -> None:
        weed = Path(sys.executable).parent / "weed"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.log = (self.directory.parent / "own-weed.log").open("a")
        self.process = subprocess.Popen(
            [str(weed), "-logtostderr", "mini", f"-dir={self.directory}", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", "-master.telemetry=false", "-webdav=false",
             "-bucket=own"]
            + [f"-{flag}={port}" for flag, port in self.ports.items()],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            wait_for(self.answers, timeout=60, interval=0.3)
            wait_for(self.has_bucket, timeout=30, interval=0.3)
        except BaseException:
            self.stop()  # never leave a server behind
            raise

    def has_bucket(self) -> bool:
        try:
            self.client.head_bucket(Bucket="own")
            return True
        except Exception:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                # weed mini sometimes takes 20 s and more to stop on SIGTERM; an outage
                # need not be graceful, and what it had stored is on disk already.
                self.process.wait(3)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.process = None


@pytest.fixture
def own_s3(tmp_path):
    directory = tmp_path / "own-s3"
    directory.mkdir()
    server = OwnS3(directory)
    server.start()
    yield server
    server.stop()


def test_an_s3_outage_mid_upload_is_retried_until_the_copy_is_verified(
    project, root, own_s3, workers
):
    data = os.urandom(24 * MiB)
    checkpoint = make_checkpoint(project, root, 1, {"model.pt": data})
    StorageTarget.objects.create(
        project=project, name="own", bucket="own", prefix="r", endpoint_url=own_s3.endpoint
    )
    workers.start("worker")
    (replica_id,) = queue_replicas(checkpoint)
    wait_for(
        lambda: Replica.objects.filter(pk=replica_id, bytes_done__gt=0).exists(),
        timeout=60,
        interval=0.05,
    )
    own_s3.stop()
    # The attempts and the last error are there for anyone to see, and it is not
    # "failed" while attempts remain.
    wait_for(
        lambda: Replica.objects.filter(pk=replica_id, status="pending", attempts__gte=2).exists(),
        timeout=60,
        interval=0.1,
    )
    replica = Replica.objects.get(pk=replica_id)
    assert "Could not connect to the endpoint URL" in replica.last_error
    own_s3.start()
    wait_for(lambda: Replica.objects.get(pk=replica_id).is_final, timeout=90, interval=0.2)
    replica.refresh_from_db()
    assert replica.status == "verified", replica.last_error
    assert replica.attempts >= 3
    assert open_uploads(own_s3.client, "own", "r/") == []
    (entry,) = replica.files
    body = own_s3.client.get_object(Bucket="own", Key=entry["key"])["Body"].read()
    assert hashlib.sha256(body).hexdigest() == hashlib.sha256(data).hexdigest()


def test_uploads_a_host_leg_left_open_are_aborted_by_the_next_attempt(project, root, s3):
    # A node-local checkpoint's replica is sent in legs, one per host (host_legs.py). A
    # leg killed mid-upload leaves a multipart upload open: each leg writes its own into
    # the replica beside the other legs', and the next attempt aborts them on S3 (which
    # every worker reaches) before it splits into new legs.
    from django.utils import timezone

    from webapp.domain.models import CheckpointFile, CheckpointPart
    from webapp.domain.replication import host_legs
    from webapp.domain.replication import replicate as r

    project.node_local = True
    project.save()
    prefix = f"legs-{uuid.uuid4().hex[:8]}"
    StorageTarget.objects.create(
        project=project, name="t", bucket=s3.bucket, prefix=prefix, endpoint_url=s3.endpoint
    )
    files = {"__0_0.distcp": b"0" * 1000, "__1_0.distcp": b"1" * 1000}
    checkpoint = make_checkpoint(project, root, 3, files, world_size=2)
    for rank in (0, 1):
        CheckpointFile.objects.filter(checkpoint=checkpoint, path=f"__{rank}_0.distcp").update(
            rank=rank
        )
        CheckpointPart.objects.create(
            checkpoint=checkpoint, rank=rank, host=f"node-{rank}", files_digest="x" * 64,
            saved_at=timezone.now(),
        )  # fmt: skip
    (replica_id,) = queue_replicas(checkpoint)
    first = r.claim(replica_id)
    assert host_legs.fan_out(first) == ["node-0", "node-1"]

    # Both legs start a multipart upload, and write it down as they go.
    opened = {}
    for host in ("node-0", "node-1"):
        key = f"{prefix}/{host}-blob"
        opened[key] = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    legs = [host_legs.LegProgress(replica_id) for _ in opened]
    for leg, (key, upload_id) in zip(legs, opened.items(), strict=True):
        leg.tally.started(key, upload_id)
        leg.flush()
    assert Replica.objects.get(pk=replica_id).uploads == opened  # both legs', merged
    # node-0's leg completes its upload (gone from its tally); node-1's is killed.
    node_0_key = next(iter(opened))
    s3.client.abort_multipart_upload(Bucket=s3.bucket, Key=node_0_key, UploadId=opened[node_0_key])
    legs[0].tally.ended(node_0_key)
    legs[0].flush()
    left = {k: v for k, v in opened.items() if k != node_0_key}
    assert Replica.objects.get(pk=replica_id).uploads == left
    assert len(open_uploads(s3.client, s3.bucket, prefix)) == 1

    # The lease lapses; the next attempt aborts what the dead leg left, then splits.
    Replica.objects.filter(pk=replica_id).update(lease_until=timezone.now())
    second = r.claim(replica_id)
    assert second.stale_uploads == left
    assert host_legs.fan_out(second) == ["node-0", "node-1"]
    assert open_uploads(s3.client, s3.bucket, prefix) == []
    assert Replica.objects.get(pk=replica_id).uploads == {}
