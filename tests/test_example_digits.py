"""examples/train_digits.py end to end: it trains, checkpoints through the client, crashes
on purpose, and resumes from the newest verified checkpoint, repeating the same losses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.servers import ROOT, wait_for
from webapp.domain.health import goodput
from webapp.domain.models import Checkpoint, Event, Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def losses(process_events) -> dict[int, float]:
    out = {}
    for event in process_events:
        for point in event.data["points"]:
            out[point["step"]] = point["values"]["loss"]
    return out


def test_it_crashes_then_resumes_from_the_last_verified_epoch(
    server, celery_worker, token, project, tmp_path
):
    project.allowed_roots = [str(tmp_path)]
    project.save()
    env = {
        "LIFEBOAT_URL": server.url,
        "LIFEBOAT_TOKEN": token,
        "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
        "PATH": "/usr/bin:/bin",
    }
    command = [
        sys.executable,
        "examples/train_digits.py",
        "--run",
        "digits",
        "--epochs",
        "3",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    crashed = subprocess.run(
        command + ["--crash-at-step", "50"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert crashed.returncode == 1, crashed.stderr
    assert "crashing on purpose at step 50" in crashed.stderr
    run = Run.objects.get(key="digits")
    assert run.status == "failed" and "step 50" in run.error
    # 23 steps an epoch: epochs 0 and 1 were saved at steps 23 and 46.
    wait_for(lambda: Checkpoint.objects.filter(run=run, status="verified").count() == 2, 60)
    first_losses = losses(Event.objects.filter(run=run, type="metrics"))
    assert sorted(first_losses)[-1] == 50

    resumed = subprocess.run(
        command + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "(epoch 1, step 46)" in resumed.stdout
    step_46 = Checkpoint.objects.get(run=run, step=46)
    started = Event.objects.filter(run=run, type="run.started").order_by("-time").first()
    assert started.data["resumed_from"] == step_46.id
    run.refresh_from_db()
    assert run.status == "finished"
    assert sorted(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == [23, 46, 69]
    # Its goodput ledger: two attempts of one run key, the second from step 46; the
    # steps after 46 were lost and redone, and the parts add up to the elapsed time.
    ledger = goodput.for_run(run)
    assert [(a["attempt"], a["status"]) for a in ledger.attempts] == [
        (1, "failed"),
        (2, "finished"),
    ]
    assert ledger.failures == 1 and ledger.badput["lost_work"] > 0
    assert ledger.badput["restore"] > 0 and ledger.badput["checkpoint_save"] > 0
    parts = ledger.productive_seconds + sum(ledger.badput.values())
    assert parts == pytest.approx(ledger.wall_seconds) and ledger.overlap_seconds == 0
    # Deterministic training: the resumed job repeats the losses of steps 47..50 exactly.
    all_losses = losses(Event.objects.filter(run=run, type="metrics").order_by("received_at"))
    for step in range(47, 51):
        assert all_losses[step] == pytest.approx(first_losses[step], rel=1e-6)
