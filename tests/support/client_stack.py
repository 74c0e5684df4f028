"""The client against a live stack: a web server and workers for a module
(`lifeboat_stack`), a job's environment (`job_env`), S3 for the client (`s3_server_env`)
and a replicated checkpoint (`replicated`). Loaded by tests/conftest.py (pytest_plugins)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

import lifeboat
from tests.support.celery_workers import start_worker, stop_worker
from tests.support.client_scripts import RestartableServer
from tests.support.servers import wait_for
from webapp.domain.models import Checkpoint, Replica, StorageTarget
from webapp.domain.replication import policy
from workers.replicate import replicate
from workers.validate import validate_checkpoint


@pytest.fixture(scope="module")
def lifeboat_stack(worker_env, tmp_path_factory):
    """One web server and one validate worker for the whole module (each example is a
    job of its own; starting them per test would double the module's time)."""
    web = RestartableServer(worker_env)
    web.start()
    worker = start_worker(worker_env, "validate", tmp_path_factory.mktemp("worker") / "log")
    yield web
    stop_worker(worker)
    web.stop()


@pytest.fixture
def job_env(lifeboat_stack, token, project, tmp_path) -> dict:
    """The environment of a training job: where Lifeboat is, its token, its own spool;
    its checkpoints go under tmp_path/ckpt, an allowed root of the project."""
    project.allowed_roots = [str(tmp_path / "ckpt")]
    project.save()
    return {
        **os.environ,
        "LIFEBOAT_URL": lifeboat_stack.url,
        "LIFEBOAT_TOKEN": token,
        "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
    }


def verified_steps(run_key: str, count: int, timeout: float = 60) -> dict[int, object]:
    """Wait until the run has `count` checkpoints and all are verified; {step: row}."""
    from webapp.domain.models import Checkpoint

    def settled():
        rows = list(Checkpoint.objects.filter(run__key=run_key))
        done = len(rows) == count and all(c.status == "verified" for c in rows)
        return done and rows

    try:
        rows = wait_for(settled, timeout, interval=0.2)
    except AssertionError:
        found = Checkpoint.objects.filter(run__key=run_key).values_list(
            "step", "status", "status_message"
        )
        raise AssertionError(f"{run_key}: wanted {count} verified, found {list(found)}") from None
    return {c.step: c for c in rows}


@pytest.fixture
def s3_server_env(worker_env, s3):
    """A Lifeboat web server that can presign URLs for the test S3 server."""
    web = RestartableServer(
        {
            **worker_env,
            "S3_ENDPOINT_URL": s3.endpoint,
            "S3_ACCESS_KEY_ID": s3.key,
            "S3_SECRET_ACCESS_KEY": s3.secret,
        }
    )
    web.start()
    yield web
    web.stop()


@pytest.fixture
def replicated(s3_server_env, s3, token, project, tmp_path):
    """A run whose step-5 checkpoint (a directory of two files) is verified and has a
    verified replica; returns (server, checkpoint, its directory, files)."""
    root = tmp_path / "ckpts"
    directory = root / "job" / "step-5"
    (directory / "shard").mkdir(parents=True)
    files = {"model.bin": b"m" * 3_000_000, "shard/optim.bin": bytes(range(256)) * 4000}
    for name, data in files.items():
        (directory / name).write_bytes(data)
    project.allowed_roots = [str(root)]
    project.save()
    with lifeboat.Run(
        "job",
        url=s3_server_env.url,
        token=token,
        spool_dir=tmp_path / "spool",
        handle_signals=False,
    ) as run:
        run.checkpoint(directory, step=5).wait(30)
    checkpoint = Checkpoint.objects.get(run__key="job", step=5)
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified", checkpoint.status_message
    target = StorageTarget.objects.create(
        project=project,
        name="backup",
        bucket=s3.bucket,
        prefix=f"latest-{uuid.uuid4().hex[:6]}",
        endpoint_url=s3.endpoint,
    )
    (replica_id,) = policy.request(checkpoint, [target], by_policy=False)
    replicate(replica_id)
    assert Replica.objects.get(pk=replica_id).status == "verified"
    return s3_server_env, checkpoint, directory, files
