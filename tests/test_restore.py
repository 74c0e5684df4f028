"""Restore tests against a real S3 server: a good replica comes back, verified, loaded
and timed; a replica damaged in S3 fails clearly (also a file big enough for parallel
ranged GETs); the warm loader that runs the load fails a test clearly and is replaced when
it is killed or hangs, and lives on when a load runs out of memory; and a real worker on
the `restore` queue starts its loader and runs a test asked for through the API."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path

import pytest
import torch

from lifeboat.download import CHUNK
from tests.support.celery_workers import queued_tasks, start_worker, stop_worker
from tests.support.events import saved
from tests.support.restore import damage, replicate_checkpoint, restore
from tests.support.servers import wait_for
from webapp.domain.models import Checkpoint, Replica, StorageTarget, Validation
from webapp.domain.recovery import restore_test as rt
from webapp.domain.replication import policy
from webapp.domain.validation import inspector, sandbox
from workers.replicate import replicate
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def replicated(api, token, project, s3, tmp_path, settings):
    """A verified two-file torch checkpoint with a verified replica on the test S3."""
    generator = torch.Generator().manual_seed(0)
    files = {
        "model.pt": {"w": torch.randn(256, 256, generator=generator)},
        "optim.pt": {"step": 7, "m": torch.zeros(256)},
    }
    return replicate_checkpoint(files, api, token, project, s3, tmp_path, settings)


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
    damage(s3, "model.pt", replicated.files.get(path="model.pt").size // 2)
    validation = rt.request(replicated)
    assert rt.run(validation.pk) == "failed"
    validation.refresh_from_db()
    assert validation.message.startswith("The replica on backup does not restore:")
    assert "model.pt" in validation.message and "sha256" in validation.message


@pytest.fixture
def big(api, token, project, s3, tmp_path, settings):
    """One torch file of 2.5 parts of CHUNK bytes (20 MiB): fetched as ranged GETs on
    several threads and hashed in order."""
    weights = torch.randn(5 * CHUNK // 8, generator=torch.Generator().manual_seed(1))
    checkpoint = replicate_checkpoint(
        {"model.pt": {"w": weights}}, api, token, project, s3, tmp_path, settings
    )
    assert checkpoint.total_size > 2 * CHUNK
    return checkpoint


def test_a_big_file_comes_in_parallel_parts_and_one_damaged_byte_fails_it(
    big, s3, tmp_path, queues
):
    checkpoint = big
    validation = restore(checkpoint)
    assert validation.status == "passed", validation.message
    assert "1 tensors (20.0 MiB) loaded" in validation.message

    damage(s3, "model.pt", CHUNK + 12345)  # in the second part
    validation = restore(checkpoint)
    assert validation.status == "failed"
    assert validation.message.startswith("The replica on backup does not restore:")
    assert "model.pt does not match its sha256" in validation.message
    assert not any((tmp_path / "scratch").iterdir())  # no part of it left behind


def loader() -> inspector.WarmHelper:
    return inspector.warm_helper(rt.LOADER_MODULE)


def test_a_killed_warm_loader_is_replaced(replicated, queues):
    assert restore(replicated).status == "passed"
    first = loader().pid
    assert first is not None  # the first test started it, and it stays
    assert restore(replicated).status == "passed"
    assert loader().pid == first  # the second test used it: no new interpreter

    os.kill(first, signal.SIGKILL)  # what the OOM killer or an operator does to it
    wait_for(lambda: loader().pid is None, 10, 0.05)
    validation = restore(replicated)
    assert validation.status == "passed", validation.message
    assert loader().pid not in (None, first)


def test_a_hung_warm_loader_fails_the_test_clearly_and_is_replaced(
    replicated, queues, settings, monkeypatch
):
    rt.start_warm_loader()
    hung = loader().pid
    os.kill(hung, signal.SIGSTOP)  # it takes the request and never answers
    settings.VALIDATION_TIMEOUT_S = 1
    monkeypatch.setattr(sandbox, "HELPER_GRACE_S", 0.5)
    validation = restore(replicated)
    assert validation.status == "failed"
    assert validation.message == (
        "Downloaded and verified, but loading failed: the load child could not run: "
        "the load check helper stopped answering"
    )
    assert not os.path.exists(f"/proc/{hung}")  # killed, not left behind stopped

    settings.VALIDATION_TIMEOUT_S = 600
    validation = restore(replicated)
    assert validation.status == "passed", validation.message
    assert loader().pid not in (None, hung)


def test_a_load_out_of_memory_fails_the_test_and_the_loader_lives_on(big, queues, settings):
    rt.start_warm_loader()
    helper = loader().pid
    # The load child's address space is this plus twice the largest file (40 MiB): far
    # below what a process with torch mapped already holds, so loading 20 MiB of tensors
    # fails as a checkpoint that needs more than its limit would.
    settings.VALIDATION_MEMORY_BYTES = 0
    validation = restore(big)
    assert validation.status == "failed"
    assert validation.message.startswith("Downloaded and verified"), validation.message
    assert "alloc" in validation.message or "Memory" in validation.message, validation.message
    big.refresh_from_db()
    assert big.quarantined_at is None  # this worker's memory, not the checkpoint's fault

    settings.VALIDATION_MEMORY_BYTES = 8 << 30
    validation = restore(big)
    assert validation.status == "passed", validation.message
    assert loader().pid == helper  # the child that ran out was forked; the loader is intact


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
        # The worker started its warm loader at start (worker_process_init).
        wait_for(lambda: loaders_of(worker.pid), 10, 0.1)
        validation = wait_for(
            lambda: Validation.objects.filter(pk=validation_id, status="passed").first(),
            90, 0.3,
        )  # fmt: skip
    finally:
        stop_worker(worker)
    assert validation.timings["total_s"] > 0
    assert not any((tmp_path / "scratch").iterdir())  # scratch space cleaned up


def loaders_of(pid: int) -> list[int]:
    """The warm loaders (restore_load --serve) that process `pid` started."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if (
            parent == pid
            and b"webapp.domain.recovery.restore_load" in command
            and b"--serve" in command
        ):
            found.append(int(entry.name))
    return found


def test_an_object_gone_from_the_replica_fails_it(replicated, s3, queues):
    entry = next(e for e in Replica.objects.get().files if e["path"] == "optim.pt")
    s3.client.delete_object(Bucket=s3.bucket, Key=entry["key"])

    validation = restore(replicated)

    assert validation.status == "failed"
    assert validation.message.startswith("The replica on backup does not restore:")
    assert "optim.pt" in validation.message and "404" in validation.message


class FirstConnectionOnly:
    """A TCP relay to the S3 server that passes its first connection through and resets
    every later one: the object store gone in the middle of a restore test."""

    def __init__(self, endpoint: str):
        import socket
        import threading
        from urllib.parse import urlsplit

        self.upstream = (urlsplit(endpoint).hostname, urlsplit(endpoint).port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket
        import struct
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted > 1:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()  # a reset
                continue
            upstream = socket.create_connection(self.upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source, sink) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass  # the other side went away: end both
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(2)

    def close(self) -> None:
        self.listener.close()


def test_an_object_store_gone_mid_test_is_an_error_not_a_bad_replica(replicated, s3, queues):
    """The copy may be good: a restore test that could not fetch it says it could not run,
    and never that the replica does not restore."""
    relay = FirstConnectionOnly(s3.endpoint)
    try:
        StorageTarget.objects.update(endpoint_url=relay.endpoint)  # the manifest still comes

        validation = restore(replicated)
    finally:
        relay.close()

    assert relay.accepted >= 2  # the manifest's connection, then refused downloads
    assert validation.status == "error", validation.message
    assert validation.message.startswith("The restore test could not run: could not fetch")
    assert "does not restore" not in validation.message


def test_a_dcp_checkpoint_restores_and_every_chunk_loads(
    api, token, project, s3, tmp_path, settings, queues
):
    """A .distcp shard is a run of torch.save archives, one per chunk: the loader reads it
    chunk by chunk, as validation does, instead of torch.load of the whole file."""
    from tests.support.checkpoint_files import save_dcp
    from tests.support.validation import file_entry

    settings.SCRATCH_DIR = tmp_path / "scratch"
    directory = tmp_path / "ckpts" / "step-7"
    generator = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(64, 64, generator=generator) for i in range(3)}
    files = save_dcp(directory, {"model": state, "step": 7})
    project.allowed_roots = [str(tmp_path / "ckpts")]
    project.save()
    entries = [file_entry(directory / name, name) for name in files]
    assert (
        api.post_events(
            token, saved(run="r", step=7, location=str(directory), files=entries)
        ).status_code
        == 202
    )
    checkpoint = Checkpoint.objects.get()
    validate_checkpoint(checkpoint.pk)
    target = StorageTarget.objects.create(
        project=project, name="backup", bucket=s3.bucket,
        prefix=f"restore-{uuid.uuid4().hex[:6]}", endpoint_url=s3.endpoint,
    )  # fmt: skip
    (replica_id,) = policy.request(checkpoint, [target], by_policy=False)
    replicate(replica_id)

    validation = restore(checkpoint)

    assert validation.status == "passed", validation.message
    assert "3 tensors (48.0 KiB) loaded" in validation.message


def test_a_dcp_metadata_naming_a_shard_outside_its_folder_is_never_followed(tmp_path):
    """The loader checks where a .metadata sends it before reading a byte: "../x" is refused
    (a copy of a verified checkpoint never names one; this one is made by hand)."""
    import pickle

    from tests.support.checkpoint_files import save_dcp
    from webapp.domain.recovery import restore_load

    folder = tmp_path / "ckpt"
    files = save_dcp(folder, {"model": {"w": torch.ones(8, 8)}})
    (tmp_path / "outside.distcp").write_bytes((folder / "__0_0.distcp").read_bytes())
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # noqa: S301 (written just above)
    for info in metadata.storage_data.values():
        info.relative_path = "../outside.distcp"
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))

    result = restore_load.load({"base": str(folder), "files": files, "device": "cpu"})

    assert result["tensors"] == 0 and result["loaded"] == []
    assert "names a shard outside the checkpoint: '../outside.distcp'" in result["error"]
