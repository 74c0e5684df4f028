"""A checkpoint report left pending by a job SIGKILLed while it hashed the files: any
lifeboat process with the same spool completes it (`lifeboat flush` here, the real
command in a process of its own), once, truthfully, against a live server."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch

import lifeboat
from lifeboat.config import Config
from lifeboat.spool import Spool
from tests.support.client_scripts import kill_while_hashing, run_script, stop_while_hashing
from tests.support.servers import ROOT, wait_for
from webapp.domain.models import Checkpoint, Event

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024


@pytest.fixture
def env(server, token, tmp_path) -> dict:
    return {
        "LIFEBOAT_URL": server.url,
        "LIFEBOAT_TOKEN": token,
        "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
        "LIFEBOAT_RUN": "job-k",
    }


def spool_of(env: dict) -> Spool:
    config = Config.resolve(spool_dir=env["LIFEBOAT_SPOOL_DIR"], url=env["LIFEBOAT_URL"],
                            token=env["LIFEBOAT_TOKEN"])  # fmt: skip
    return Spool(config.spool_dir, 10**9)


def write_big(path, mib: int = 256) -> None:
    """A file big enough that hashing it takes a noticeable time (every byte written)."""
    chunk = os.urandom(MIB)
    with path.open("wb") as handle:
        for _ in range(mib):
            handle.write(chunk)


def sha256(path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(8 * MIB):
            digest.update(block)
    return digest.hexdigest()


def job_killed_while_hashing(env: dict, path, location=None) -> dict:
    """A job using the real client reports the checkpoint at `location` (default: the
    file `path`) and is SIGKILLed while its background thread hashes the file `path`.
    Returns the pending record it left."""
    location = location or path
    step = 300
    job = run_script(
        f"""
        import time, lifeboat
        run = lifeboat.Run(handle_signals=False).start()
        run.log({step}, loss=0.5)
        run.checkpoint_started({step})
        run.checkpoint({str(location)!r}, step={step}, epoch=3, metrics={{"loss": 0.5}})
        time.sleep(120)
        """,
        env,
        wait=False,
    )
    kill_while_hashing(job, path)
    records = list(spool_of(env).pending.glob("*.json"))
    assert len(records) == 1, "the report was on disk, not yet completed"
    return json.loads(records[0].read_text())


def flush(env: dict, wait: bool = True):
    process = subprocess.Popen(
        [sys.executable, "-m", "lifeboat", "flush", "--timeout", "30"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if wait:
        process.out, process.err = process.communicate(timeout=120)
    return process


def test_flush_completes_a_report_whose_job_was_killed_mid_hash_and_it_verifies(
    env, root, celery_worker
):
    checkpoint = root / "step-300.pt"
    torch.save({"weight": torch.ones(64 * MIB)}, checkpoint)  # 256 MiB of float32
    record = job_killed_while_hashing(env, checkpoint)
    assert not Checkpoint.objects.filter(run__key="job-k").exclude(status="saving").exists()

    done = flush(env)
    assert done.returncode == 0, done.out + done.err
    assert (
        f"completed the report of {checkpoint} (run 'job-k', step 300): checkpoint.saved, "
        f"1 file(s), {checkpoint.stat().st_size:,} bytes"
    ) in done.out
    assert "ETA" in done.err  # a progress line while the big file was hashed
    stored = wait_for(
        lambda: Checkpoint.objects.filter(run__key="job-k", step=300, status="verified").first(),
        90,
    )
    assert [(f.path, f.sha256) for f in stored.files.all()] == [("step-300.pt", sha256(checkpoint))]
    assert (stored.epoch, stored.metrics) == (3, {"loss": 0.5})
    saved = Event.objects.get(run__key="job-k", type="checkpoint.saved")
    assert str(saved.event_id) == record["id"]  # the id the job chose when it reported
    assert not any(spool_of(env).pending.iterdir())


def test_files_gone_before_the_flush_are_reported_failed_with_the_reason(env, root):
    checkpoint = root / "step-300.pt"
    write_big(checkpoint)
    record = job_killed_while_hashing(env, checkpoint)
    checkpoint.unlink()

    done = flush(env)
    assert done.returncode == 0, done.out + done.err
    assert (
        f"reported {checkpoint} (run 'job-k', step 300) as checkpoint.failed: the reported "
        "checkpoint is gone before it could be hashed"
    ) in done.out
    stored = Checkpoint.objects.get(run__key="job-k", step=300)
    assert stored.status == "failed"
    assert "gone before it could be hashed" in stored.error and str(checkpoint) in stored.error
    failed = Event.objects.get(run__key="job-k", type="checkpoint.failed")
    assert str(failed.event_id) == record["id"]
    assert not Event.objects.filter(type="checkpoint.saved").exists()


def test_a_file_that_changes_size_while_the_flush_hashes_it_is_reported_failed(env, root):
    checkpoint = root / "step-300.pt"
    write_big(checkpoint)
    job_killed_while_hashing(env, checkpoint)

    first = flush(env, wait=False)
    try:
        stop_while_hashing(first, checkpoint, timeout=20)
        with checkpoint.open("ab") as handle:
            handle.write(b"more")
    finally:
        first.send_signal(signal.SIGCONT)
    first.out, first.err = first.communicate(timeout=120)
    assert first.returncode == 0, first.out + first.err
    assert "as checkpoint.failed: the reported checkpoint changed while it was being hashed" in (
        first.out
    )
    stored = Checkpoint.objects.get(run__key="job-k", step=300)
    assert stored.status == "failed" and "changed size while it was being hashed" in stored.error


def test_two_flushes_at_once_complete_the_report_once(env, root):
    checkpoint = root / "step-300.pt"
    write_big(checkpoint)
    job_killed_while_hashing(env, checkpoint)

    first = flush(env, wait=False)
    try:
        stop_while_hashing(first, checkpoint, timeout=20)  # it holds the claim, half-way through
        second = flush(env)
    finally:
        first.send_signal(signal.SIGCONT)
    first.out, first.err = first.communicate(timeout=120)
    assert second.returncode == 0, second.out + second.err
    assert f"(run 'job-k', step 300) is being completed by pid {first.pid} on" in second.out
    assert "completed the report" not in second.out and "checkpoint.failed" not in second.out
    assert first.returncode == 0, first.out + first.err
    assert "completed the report of" in first.out
    types = list(Event.objects.filter(run__key="job-k").values_list("type", flat=True))
    assert types.count("checkpoint.saved") == 1 and "checkpoint.failed" not in types
    stored = Checkpoint.objects.get(run__key="job-k", step=300)
    assert [f.sha256 for f in stored.files.all()] == [sha256(checkpoint)]
    assert not any(spool_of(env).pending.iterdir())


def test_a_damaged_pending_record_is_set_aside_and_the_flush_goes_on(env, root):
    spool = spool_of(env)
    damaged = spool.pending / f"{uuid.uuid4()}.json"
    damaged.write_bytes(b'{"id": "cut off by a disk fault')
    beat = {"id": str(uuid.uuid4()), "type": "run.heartbeat", "run": "job-k",
            "time": "2026-12-01T12:00:00Z", "step": 7}  # fmt: skip
    spool.put(beat)

    done = flush(env)
    assert done.returncode == 0, done.out + done.err
    aside = spool.rejected / f"pending-{damaged.name}"
    assert "a pending checkpoint record that cannot be completed: not valid JSON" in done.err
    assert str(aside) in done.err
    assert aside.read_bytes().startswith(b'{"id": "cut off') and not damaged.exists()
    assert "not valid JSON" in (spool.rejected / f"{aside.name}.error").read_text()
    assert "delivered 1 of 1 events" in done.out
    assert Event.objects.filter(event_id=beat["id"]).exists()


def test_a_running_sidecar_completes_a_report_once_its_job_is_dead_and_not_before(
    env, root, server, token, tmp_path
):
    checkpoint = root / "step-300.pt"
    write_big(checkpoint)
    # `lifeboat watch` in this process: a run without a life cycle of its own, up first.
    sidecar = lifeboat.Run("sidecar", url=server.url, token=token, lifecycle=False,
                           spool_dir=tmp_path / "spool", pending_rescan_s=0.2).start()  # fmt: skip
    try:
        job = run_script(
            f"""
            import time, lifeboat
            run = lifeboat.Run(handle_signals=False).start()
            run.checkpoint({str(checkpoint)!r}, step=300)
            time.sleep(120)
            """,
            env,
            wait=False,
        )
        try:
            stop_while_hashing(job, checkpoint)
            time.sleep(1.5)  # several rescans of the sidecar while its writer lives
            (record,) = spool_of(env).pending.glob("*.json")
            assert "event" not in json.loads(record.read_text())
            assert not Event.objects.filter(type="checkpoint.saved").exists()
        finally:
            job.kill()
            job.wait(30)
        stored = wait_for(lambda: Checkpoint.objects.filter(run__key="job-k", step=300).first(), 30)
    finally:
        sidecar.finish()
    assert [f.sha256 for f in stored.files.all()] == [sha256(checkpoint)]
    assert Event.objects.filter(type="checkpoint.saved").count() == 1
    assert not any(spool_of(env).pending.iterdir())


def test_a_shard_removed_after_the_killed_job_hashed_it_is_not_dropped_unseen(env, root):
    directory = root / "step-300"
    directory.mkdir()
    (directory / "a-config.json").write_text('{"layers": 2}')
    write_big(directory / "b-weights.bin")
    # Killed while it hashes the second file: a-config.json was hashed already.
    record = job_killed_while_hashing(env, directory / "b-weights.bin", location=directory)
    assert record["listed"] == {"a-config.json": 13, "b-weights.bin": 256 * MIB}
    (directory / "a-config.json").unlink()

    done = flush(env)
    assert done.returncode == 0, done.out + done.err
    assert (
        f"reported {directory} (run 'job-k', step 300) as checkpoint.failed: files of the "
        "reported checkpoint are gone before they could be hashed: a-config.json (there when "
        "hashing began)"
    ) in done.out
    stored = Checkpoint.objects.get(run__key="job-k", step=300)
    assert stored.status == "failed" and "a-config.json" in stored.error
    assert not Event.objects.filter(type="checkpoint.saved").exists()


def test_a_report_of_another_host_is_left_for_that_host(env, root):
    checkpoint = root / "step-9.pt"
    checkpoint.write_bytes(b"weights")
    spool = spool_of(env)
    record = {"id": str(uuid.uuid4()), "run": "job-k", "time": "2026-12-01T12:00:00Z",
              "location": str(checkpoint), "step": 9, "pid": 1, "host": "node-17"}  # fmt: skip
    (spool.pending / f"{record['id']}.json").write_text(json.dumps(record))

    done = flush(env)
    assert done.returncode == 0, done.out + done.err
    assert "1 pending checkpoint report(s) of host(s) node-17 are left for a lifeboat" in done.out
    assert (spool.pending / f"{record['id']}.json").exists()
    assert not list(spool.pending.glob("*.lock")) and not Event.objects.exists()


def test_reports_queued_beyond_the_descriptor_limit_are_all_delivered(env, root):
    # A sidecar started beside hundreds of old checkpoints queues them all at once; the
    # pending records it owns must not cost a file descriptor each.
    checkpoint = root / "step.pt"
    write_big(checkpoint, mib=2)
    job = run_script(
        f"""
        import resource, lifeboat
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
        with lifeboat.Run(handle_signals=False) as run:
            reports = [run.checkpoint({str(checkpoint)!r}, step=step) for step in range(300)]
            print("queued at once:", sum(not report.done() for report in reports))
        """,
        env,
        # 2 s alone, but 90 to 100 s while two busy-loop processes hold both cores: it
        # times out on a hang only.
        timeout=300,
    )
    assert job.returncode == 0, job.stderr_text
    assert int(job.stdout_text.split(":")[1]) > 100, job.stdout_text
    assert Checkpoint.objects.filter(run__key="job-k").count() == 300
