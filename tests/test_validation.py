"""The validate task end to end: real torch checkpoints on disk, reported through the
API, checked, and the verdict a person reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from django.utils import timezone

from tests.support.events import saved
from tests.support.servers import ROOT, wait_for
from tests.support.validation import check, file_entry, report, small_model, write_state
from webapp.domain.lease import Busy
from webapp.domain.models import Checkpoint, Event, Validation
from workers.validate import claim, validate_checkpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def test_a_good_checkpoint_is_verified_with_its_content(api, token, root):
    write_state(root / "step-1" / "model.pt", small_model())
    checkpoint = check(report(api, token, root / "step-1", 1))
    assert checkpoint.status == "verified", checkpoint.status_message
    assert checkpoint.status_message.startswith("The file matches its sha256")
    assert "3 tensors, 2,752 parameters load safely and are finite" in checkpoint.status_message
    assert checkpoint.content["tensors"] == 3
    assert checkpoint.content["keys"]["model.pt:fc.weight"] == ["float32", [10, 64]]
    validation = checkpoint.validations.get()
    assert validation.status == "passed"
    assert validation.bytes_done == validation.bytes_total == checkpoint.total_size
    assert set(validation.timings) >= {"hash_s", "load_s", "scan_s"}
    assert Event.objects.filter(type="checkpoint.verified", step=1).exists()


def test_one_flipped_byte_makes_it_corrupt(api, token, root):
    write_state(root / "step-1" / "model.pt", small_model())
    checkpoint = report(api, token, root / "step-1", 1)
    path = root / "step-1" / "model.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    checkpoint = check(checkpoint)
    assert checkpoint.status == "corrupt"
    assert "model.pt does not match its sha256" in checkpoint.status_message
    assert checkpoint.validations.get().status == "failed"


def test_a_nan_tensor_makes_it_corrupt_and_is_named(api, token, root):
    weights = torch.randn(64, 32)
    weights[3, 4] = float("nan")
    write_state(root / "step-1" / "model.pt", small_model(**{"layer1.weight": weights}))
    checkpoint = check(report(api, token, root / "step-1", 1))
    assert checkpoint.status == "corrupt"
    assert "layer1.weight" in checkpoint.status_message
    assert "NaN" in checkpoint.status_message


def test_a_truncated_torch_file_reported_with_its_truncated_size_is_corrupt(api, token, root):
    # The job's own report can describe a cut file (it hashed what was there).
    write_state(root / "step-1" / "model.pt", small_model())
    path = root / "step-1" / "model.pt"
    path.write_bytes(path.read_bytes()[:-200])
    checkpoint = check(report(api, token, root / "step-1", 1))
    assert checkpoint.status == "corrupt"
    assert "central directory" in checkpoint.status_message


def test_a_malicious_pickle_is_never_executed(api, token, root, tmp_path):
    victim = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (victim,))

    write_state(root / "step-1" / "model.pt", {"weight": torch.ones(2), "payload": Evil()})
    checkpoint = check(report(api, token, root / "step-1", 1))
    assert not victim.exists()
    assert checkpoint.status == "suspicious"
    assert "not loadable safely" in checkpoint.status_message


def test_a_location_escaping_the_root_by_dot_dot_is_refused(api, token, root, tmp_path):
    outside = tmp_path / "outside"
    write_state(outside / "model.pt", small_model())
    body = saved(
        location=f"{root}/../outside", files=[file_entry(outside / "model.pt", "model.pt")]
    )
    api.post_events(token, body)
    checkpoint = check(Checkpoint.objects.get())
    assert checkpoint.status == "suspicious"
    assert "without '..'" in checkpoint.status_message
    assert checkpoint.validations.get().bytes_done == 0


def test_a_location_escaping_the_root_by_symlink_is_refused(api, token, root, tmp_path):
    outside = tmp_path / "outside"
    write_state(outside / "model.pt", small_model())
    os.symlink(outside, root / "step-1")
    checkpoint = check(report(api, token, root / "step-1", 1))
    assert checkpoint.status == "suspicious"
    assert "by a symlink" in checkpoint.status_message


def test_keys_that_change_between_checkpoints_are_suspicious(api, token, root):
    write_state(root / "step-1" / "model.pt", small_model())
    assert check(report(api, token, root / "step-1", 1)).status == "verified"
    changed = small_model(seed=1)
    del changed["fc.weight"]
    changed["layer1.bias"] = torch.randn(128)
    write_state(root / "step-2" / "model.pt", changed)
    checkpoint = check(report(api, token, root / "step-2", 2))
    assert checkpoint.status == "suspicious"
    assert "1 tensor removed since the verified checkpoint at step 1: model.pt:fc.weight" in (
        checkpoint.status_message
    )
    assert "layer1.bias" in checkpoint.status_message


def test_one_file_checkpoints_named_after_their_step_compare_by_tensor_names(api, token, root):
    def single(step: int, state: dict) -> Checkpoint:
        path = root / f"epoch-{step:03d}-step-{step}.pt"
        write_state(path, state)
        body = saved(step=step, t=step, location=str(path), files=[file_entry(path, path.name)])
        assert api.post_events(token, body).status_code == 202
        return check(Checkpoint.objects.get(step=step))

    assert single(1, small_model(seed=1)).status == "verified"
    assert single(2, small_model(seed=2)).status == "verified"
    changed = small_model(seed=3)
    del changed["fc.weight"]
    checkpoint = single(3, changed)
    assert checkpoint.status == "suspicious"
    assert "1 tensor removed since the verified checkpoint at step 2: fc.weight" in (
        checkpoint.status_message
    )


def test_a_checkpoint_much_smaller_than_usual_is_possibly_truncated(api, token, root):
    for step in (1, 2):
        write_state(root / f"step-{step}" / "model.pt", small_model(seed=step))
        assert check(report(api, token, root / f"step-{step}", step)).status == "verified"
    (root / "step-3").mkdir()
    (root / "step-3" / "notes.txt").write_bytes(b"x" * 100)
    checkpoint = check(report(api, token, root / "step-3", 3))
    assert checkpoint.status == "suspicious"
    assert checkpoint.status_message.startswith("possibly truncated: 100 B against a usual")


def test_a_checkpoint_in_s3_is_checked_through_boto3(api, token, root, project, s3):
    write_state(root / "tmp" / "model.pt", small_model())
    data = (root / "tmp" / "model.pt").read_bytes()
    s3.put("team/run-1/step-5/model.pt", data)
    project.allowed_roots = [str(root), f"s3://{s3.bucket}/team"]
    project.save()
    body = saved(
        step=5,
        location=f"s3://{s3.bucket}/team/run-1/step-5",
        files=[file_entry(root / "tmp" / "model.pt", "model.pt")],
    )
    api.post_events(token, body)
    checkpoint = check(Checkpoint.objects.get())
    assert checkpoint.status == "verified", checkpoint.status_message
    assert checkpoint.content["tensors"] == 3


def test_running_twice_is_harmless(api, token, root):
    write_state(root / "step-1" / "model.pt", small_model())
    checkpoint = check(report(api, token, root / "step-1", 1))
    assert validate_checkpoint(checkpoint.pk) == "settled"
    assert checkpoint.validations.count() == 1


def test_a_redelivered_task_takes_up_the_same_validation(api, token, root):
    write_state(root / "step-1" / "model.pt", small_model())
    checkpoint = report(api, token, root / "step-1", 1)
    claim(checkpoint.pk, "system", False)  # a worker claimed it...
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verifying"
    # ...and holds its lease: a copy of the task leaves it to that worker.
    assert isinstance(claim(checkpoint.pk, "system", False), Busy)
    # It died: once its lease has lapsed, the next copy takes the same row over.
    Validation.objects.filter(checkpoint=checkpoint).update(
        lease_until=timezone.now() - timedelta(seconds=1)
    )
    assert check(checkpoint).status == "verified"
    assert checkpoint.validations.count() == 1


def test_a_step_saved_again_during_the_check_is_not_given_the_old_verdict(api, token, root):
    write_state(root / "step-1" / "model.pt", small_model())
    checkpoint = report(api, token, root / "step-1", 1)
    validation_id, fingerprint = claim(checkpoint.pk, "system", False)
    write_state(root / "step-1" / "model.pt", small_model(seed=9))
    report(api, token, root / "step-1", 1, t=50)  # the job re-saved the step
    from workers.validate import record, run_checks

    result = run_checks(validation_id)
    assert record(validation_id, fingerprint, *result) == "superseded"
    checkpoint.refresh_from_db()
    assert checkpoint.status == "reported"
    assert "saved this step again" in Validation.objects.get(pk=validation_id).message


def test_revalidation_keeps_the_verdict_until_the_new_one(api, token, root, queues):
    write_state(root / "step-1" / "model.pt", small_model())
    checkpoint = check(report(api, token, root / "step-1", 1))
    (root / "step-1" / "model.pt").write_bytes(b"rotted")
    response = api.post(token, f"/checkpoints/{checkpoint.pk}/validate")
    assert response.status_code == 202
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified"  # still, until the check has run
    validate_checkpoint(checkpoint.pk, revalidate=True)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "corrupt"
    assert checkpoint.validations.count() == 2


def test_the_schedule_rechecks_latest_and_pinned_after_a_while(api, token, root, settings, queues):
    from tests.support.celery_workers import queued_tasks
    from workers.sweeper import revalidate_stale

    for step in (1, 2, 3):
        write_state(root / f"step-{step}" / "model.pt", small_model(seed=step))
        check(report(api, token, root / f"step-{step}", step))
    Checkpoint.objects.filter(step=1).update(pinned=True)
    queues.flushdb()
    assert revalidate_stale() == 0  # all checked just now
    settings.REVALIDATE_AFTER_S = 0
    assert revalidate_stale() == 2
    steps = {Checkpoint.objects.get(pk=t["args"][0]).step for t in queued_tasks(queues)}
    assert steps == {1, 3}  # pinned, and the latest verified; not step 2


@pytest.mark.worker
def test_a_worker_killed_mid_check_is_redelivered_and_finishes(
    api, token, root, worker_env, queues, tmp_path
):
    """SIGKILL the worker while it hashes a 1 GiB checkpoint; Redis redelivers the
    task after the visibility timeout to a new worker, which finishes the same
    Validation."""
    big = root / "step-1" / "weights.dat"  # no load check: this test is about the hashing
    big.parent.mkdir()
    block = os.urandom(1024 * 1024)
    with big.open("wb") as handle:
        for _ in range(1024):
            handle.write(block)
    # A short visibility timeout so that the redelivery comes within the test, after the
    # dead worker's lease on the check has lapsed (a live one's would make it wait).
    env = {**worker_env, "CELERY_VISIBILITY_TIMEOUT": "8", "VALIDATION_LEASE_S": "4"}

    def start_worker(name):
        log = (tmp_path / f"{name}.log").open("w")
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "validate",
             "-P", "solo", "-l", "info", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    first = start_worker("first")
    try:
        checkpoint = report(api, token, root / "step-1", 1)
        wait_for(
            lambda: Validation.objects.filter(checkpoint=checkpoint, status="running").exists(),
            timeout=60,
            interval=0.02,
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        checkpoint.refresh_from_db()
        assert checkpoint.status == "verifying"
        assert queues.llen("validate") == 0  # the message is unacknowledged, not queued
        assert queues.zcard("unacked_index") == 1
        second = start_worker("second")
        try:
            wait_for(lambda: Checkpoint.objects.get(pk=checkpoint.pk).is_settled, timeout=90)
        finally:
            second.terminate()
            second.wait(20)
    finally:
        if first.poll() is None:
            first.kill()
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified", checkpoint.status_message
    assert checkpoint.validations.count() == 1
