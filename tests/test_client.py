"""The client against a real server (gunicorn, PostgreSQL or SQLite): every event
arrives exactly once, also across a server outage and a SIGKILLed training process."""

from __future__ import annotations

import hashlib
import logging
import signal
import time

import pytest

import lifeboat
from lifeboat.spool import Spool
from tests.support.client_scripts import run_script
from tests.support.servers import wait_for
from webapp.domain.models import Checkpoint, Event, MetricPoint, Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def open_run(server, token, tmp_path, key="job-1", **kwargs) -> lifeboat.Run:
    return lifeboat.Run(
        key,
        url=server.url,
        token=token,
        spool_dir=tmp_path / "spool",
        handle_signals=False,
        **kwargs,
    )


def event_ids(key: str) -> list[str]:
    return [str(e) for e in Event.objects.filter(run__key=key).values_list("event_id", flat=True)]


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_run_delivers_each_event_exactly_once(server, token, root, tmp_path):
    checkpoint = root / "step-50.pt"
    checkpoint.write_bytes(b"weights" * 10_000)
    with open_run(server, token, tmp_path, name="first", tags=["demo"]) as run:
        for step in range(50):
            run.log(step, loss=1 / (step + 1), lr=0.1)
        report = run.checkpoint(checkpoint, step=50, epoch=2, metrics={"loss": 0.02})
        event = report.wait(30)

    assert event["files"] == [{"path": "step-50.pt", "size": 70_000, "sha256": sha256(checkpoint)}]
    ids = event_ids("job-1")
    assert len(ids) == len(set(ids)) == run.spool.written
    types = sorted(Event.objects.filter(run__key="job-1").values_list("type", flat=True))
    assert types.count("run.started") == types.count("run.finished") == 1
    assert types.count("checkpoint.saved") == 1
    assert MetricPoint.objects.filter(run__key="job-1").count() == 50
    stored = Checkpoint.objects.get(run__key="job-1")
    assert (stored.step, stored.epoch, stored.location) == (50, 2, str(checkpoint))
    assert [f.sha256 for f in stored.files.all()] == [sha256(checkpoint)]
    assert Run.objects.get(key="job-1").status == "finished"
    assert run.spool.names() == []


def test_a_directory_checkpoint_lists_every_file_with_hashlib_checksums(
    server, token, root, tmp_path
):
    directory = root / "checkpoint-7"
    (directory / "shards").mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    (directory / "shards" / "a.bin").write_bytes(b"a" * 3_000_000)
    (directory / "shards" / "b.bin").write_bytes(bytes(range(256)) * 999)
    with open_run(server, token, tmp_path) as run:
        event = run.checkpoint(directory, step=7).wait(30)
    expected = sorted(
        (p.relative_to(directory).as_posix(), p.stat().st_size, sha256(p))
        for p in directory.rglob("*")
        if p.is_file()
    )
    assert sorted((f["path"], f["size"], f["sha256"]) for f in event["files"]) == expected
    stored = Checkpoint.objects.get(run__key="job-1", step=7)
    assert sorted((f.path, f.size, f.sha256) for f in stored.files.all()) == expected


def test_events_sent_while_the_server_is_down_arrive_when_it_is_back(server, token, root, tmp_path):
    server.stop()
    checkpoint = root / "step-1.pt"
    checkpoint.write_bytes(b"x" * 1000)
    run = open_run(server, token, tmp_path).start()
    for step in range(20):
        run.log(step, loss=float(step))
    run.checkpoint(checkpoint, step=1).wait(30)
    run.heartbeat(step=20)
    time.sleep(2)  # the sender meets a closed port and backs off
    assert run.sender.last_error.startswith("server unreachable")
    assert not Event.objects.exists()

    server.start()
    run.finish()  # delivers what is left within LIFEBOAT_EXIT_TIMEOUT_S (10 s)
    ids = event_ids("job-1")
    assert len(ids) == len(set(ids)) == run.spool.written
    assert MetricPoint.objects.filter(run__key="job-1").count() == 20
    assert Checkpoint.objects.filter(run__key="job-1", step=1).count() == 1


def test_a_training_process_killed_with_sigkill_loses_nothing(server, token, root, tmp_path):
    server.stop()
    big = root / "step-300.pt"
    with big.open("wb") as handle:  # big enough that hashing is still running when killed
        for _ in range(64):
            handle.write(b"\x01" * (4 * 1024 * 1024))
    env = {
        "LIFEBOAT_URL": server.url,
        "LIFEBOAT_TOKEN": token,
        "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
        "LIFEBOAT_RUN": "job-k",
    }
    killed = run_script(
        f"""
        import os, signal, lifeboat
        run = lifeboat.Run().start()
        for step in range(300):
            run.log(step, loss=1.0 / (step + 1))
        run._flush_points()
        run.checkpoint({str(big)!r}, step=300)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        env,
    )
    assert killed.returncode == -signal.SIGKILL
    spool = Spool(
        lifeboat.Config.resolve(
            url=server.url, token=token, spool_dir=tmp_path / "spool"
        ).spool_dir,
        10**9,
    )
    assert list(spool.pending.glob("*.json")), "the checkpoint report was on disk"
    assert not Event.objects.exists()

    server.start()
    successor = run_script(
        """
        import lifeboat
        with lifeboat.Run(handle_signals=False):
            pass
        """,
        env,
    )
    assert successor.returncode == 0, successor.stderr_text
    types = list(Event.objects.filter(run__key="job-k").values_list("type", flat=True))
    assert sorted(set(types)) == ["checkpoint.saved", "metrics", "run.finished", "run.started"]
    assert types.count("run.started") == 2 and types.count("checkpoint.saved") == 1
    assert MetricPoint.objects.filter(run__key="job-k").count() == 300
    stored = Checkpoint.objects.get(run__key="job-k")
    assert [f.sha256 for f in stored.files.all()] == [sha256(big)]
    assert not list(spool.pending.glob("*.json")) and spool.names() == []


def test_lifeboat_flush_delivers_what_a_dead_job_left(server, token, root, tmp_path):
    server.stop()
    run = open_run(server, token, tmp_path, key="job-f")
    run.start()
    run.heartbeat(step=3, loss=0.5)
    run.sender.stop(0.5)  # as if the process died: events stay spooled
    assert len(run.spool.names()) == 2
    server.start()
    flushed = run_script(
        "import sys, lifeboat.cli; sys.exit(lifeboat.cli.main(['flush', '--timeout', '30']))",
        {
            "LIFEBOAT_URL": server.url,
            "LIFEBOAT_TOKEN": token,
            "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
        },
    )
    assert flushed.returncode == 0, flushed.stderr_text
    assert "delivered 2 of 2 events" in flushed.stdout_text
    assert sorted(Event.objects.values_list("type", flat=True)) == ["run.heartbeat", "run.started"]


def test_an_event_the_server_refuses_is_set_aside_and_the_rest_arrive(
    server, token, tmp_path, caplog
):
    run = open_run(server, token, tmp_path, key="job-r", lifecycle=False).start()
    run.emit("run.heartbeat", step=1)
    run.spool.put(
        {
            "id": "not-a-uuid",
            "type": "run.heartbeat",
            "run": "job-r",
            "time": "2026-11-30T12:00:00Z",
        }
    )
    run.emit("run.heartbeat", step=2)
    with caplog.at_level(logging.ERROR, logger="lifeboat"):
        assert run.sender.stop(20)
    assert Event.objects.filter(type="run.heartbeat").count() == 2
    rejected = sorted(p.name for p in run.spool.rejected.iterdir())
    assert len(rejected) == 2 and rejected[1].endswith(".error")
    assert "id" in (run.spool.rejected / rejected[1]).read_text()
    assert "refused an event for good" in caplog.text


def test_a_full_spool_drops_heartbeats_first_and_says_so(tmp_path, caplog):
    spool = Spool(tmp_path / "spool", max_bytes=2_000, durable=False)
    beat = {"id": "0", "type": "run.heartbeat", "run": "r", "time": "t", "metrics": {}}
    saved = {"id": "1", "type": "checkpoint.saved", "run": "r", "time": "t", "files": []}
    with caplog.at_level(logging.ERROR, logger="lifeboat"):
        accepted = [spool.put(beat) for _ in range(40)]
    assert accepted.count(True) < 40 and spool.dropped == accepted.count(False)
    assert "is full" in caplog.text and str(spool.dir) in caplog.text
    # Checkpoint reports still fit, up to twice the bound, then are dropped too.
    assert spool.put(saved)
    while spool.put(saved):
        pass
    assert 2_000 < spool.stats()["bytes"] <= 4_000


def test_sigterm_records_the_run_as_preempted_and_still_dies(server, token, tmp_path):
    env = {
        "LIFEBOAT_URL": server.url,
        "LIFEBOAT_TOKEN": token,
        "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
        "LIFEBOAT_RUN": "job-t",
    }
    job = run_script(
        """
        import sys, time, lifeboat
        with lifeboat.Run():
            print("ready", flush=True)
            time.sleep(60)
        """,
        env,
        wait=False,
    )
    assert job.stdout.readline().strip() == "ready"
    job.send_signal(signal.SIGTERM)
    assert job.wait(30) == -signal.SIGTERM
    # The scheduler's signal: a preemption, not a failure (no run.failed alert, not in
    # the MTBF; docs/restore.md).
    run = wait_for(lambda: Run.objects.filter(key="job-t", status="preempted").first())
    assert "SIGTERM" in run.error and run.exit_code == 128 + signal.SIGTERM
    saved = Event.objects.get(run=run, type="run.preempted")
    assert saved.data["signal"] == "SIGTERM"


def test_an_exception_in_the_training_loop_fails_the_run_with_its_traceback(
    server, token, tmp_path
):
    with pytest.raises(ZeroDivisionError), open_run(server, token, tmp_path, key="job-x"):
        1 / 0  # noqa: B018
    run = Run.objects.get(key="job-x")
    assert run.status == "failed" and "ZeroDivisionError" in run.error
