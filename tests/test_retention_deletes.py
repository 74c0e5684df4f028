"""Retention records a deletion only when it happened: single-file, directory and mixed
checkpoints; a file removed by hand; a real permission error (an immutable file, which
even root cannot unlink); a symlinked folder out of the root; a real SIGKILL of a
`manage.py retention --apply` process in the middle of a deletion."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.utils import timezone

from tests.support.replication import make_checkpoint
from tests.support.servers import ROOT
from webapp.domain.models import (
    Checkpoint,
    CheckpointFile,
    Event,
    Replica,
    RetentionPolicy,
    Run,
    StorageTarget,
)
from webapp.domain.retention import policy as retention

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def root(tmp_path, project):
    root = tmp_path / "ckpts"
    root.mkdir()
    project.allowed_roots = [str(root)]
    project.save()
    StorageTarget.objects.create(project=project, name="main", bucket="b")
    RetentionPolicy.objects.create(project=project, applies_to="local", keep_last=1)
    return root


def replicated(checkpoint) -> Checkpoint:
    target = StorageTarget.objects.get(project=checkpoint.project, name="main")
    Replica.objects.create(
        checkpoint=checkpoint, target=target, status="verified", verified_at=timezone.now()
    )
    return checkpoint


def single_file(project, root, step: int, run: str = "run-1") -> Checkpoint:
    """As lifeboat.torch.save writes it: the location is the file itself."""
    run_row, _ = Run.objects.get_or_create(project=project, key=run)
    name = f"epoch-000-step-{step}.pt"
    data = step.to_bytes(4, "big") * 10
    (root / run).mkdir(exist_ok=True)
    (root / run / name).write_bytes(data)
    checkpoint = Checkpoint.objects.create(
        project=project, run=run_row, step=step, location=str(root / run / name),
        total_size=len(data), file_count=1, status="verified", verified_at=timezone.now(),
    )  # fmt: skip
    CheckpointFile.objects.create(
        checkpoint=checkpoint, path=name, size=len(data), sha256=hashlib.sha256(data).hexdigest()
    )
    return replicated(checkpoint)


def directory(project, root, step: int, files=None) -> Checkpoint:
    files = files or {"model.pt": os.urandom(100), "sub/state.json": b"{}"}
    return replicated(make_checkpoint(project, root, step, files))


def status(step: int) -> str:
    return Checkpoint.objects.get(run__key="run-1", step=step).status


def test_single_file_directory_and_mixed_checkpoints_are_deleted_then_recorded(project, root):
    for step in (10, 30):
        single_file(project, root, step)
    for step in (20, 40):
        directory(project, root, step)
    single_file(project, root, 50)  # the latest: kept
    (root / "run-1" / "unrelated.txt").write_text("the job's own")

    done = retention.apply(project, actor="test")

    assert sorted(d.step for d in done) == [10, 20, 30, 40]
    assert sorted(os.listdir(root / "run-1")) == ["epoch-000-step-50.pt", "unrelated.txt"]
    for step in (10, 20, 30, 40):
        checkpoint = Checkpoint.objects.get(run__key="run-1", step=step)
        assert checkpoint.status == "deleted" and checkpoint.deleted_at is not None
        assert "Local copy deleted" in checkpoint.status_message
    assert status(50) == "verified"
    assert Event.objects.filter(type="checkpoint.deleted").count() == 4
    assert retention.apply(project) == []  # the next run: nothing, and no crash


def test_a_file_removed_by_hand_in_between_is_no_error(project, root):
    single_file(project, root, 10)
    directory(project, root, 20)
    directory(project, root, 30)
    os.unlink(root / "run-1" / "epoch-000-step-10.pt")
    os.unlink(root / "run-1" / "step-20" / "sub" / "state.json")
    done = retention.apply(project)
    assert sorted(d.step for d in done) == [10, 20]
    assert not (root / "run-1" / "step-20").exists()
    assert status(10) == status(20) == "deleted"


@contextmanager
def immutable(path):
    """chattr +i: the kernel refuses to unlink it, to root too (a real EPERM)."""
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_permission_error_leaves_the_status_and_never_blocks_later_applies(project, root):
    single_file(project, root, 10)
    directory(project, root, 20)
    directory(project, root, 30)
    stuck = root / "run-1" / "epoch-000-step-10.pt"
    with immutable(stuck):
        done = retention.apply(project, actor="test")
        assert [d.step for d in done] == [20]  # the other one still went
        checkpoint = Checkpoint.objects.get(run__key="run-1", step=10)
        assert checkpoint.status == "verified" and checkpoint.deleted_at is None
        assert stuck.exists()
        (failed,) = Event.objects.filter(type="checkpoint.delete_failed")
        assert failed.step == 10 and "Operation not permitted" in failed.message
        assert not Event.objects.filter(type="checkpoint.deleted", step=10).exists()
        assert retention.apply(project) == []  # no crash, still not deleted
        assert status(10) == "verified"
    done = retention.apply(project)  # the cause is gone: this time it goes
    assert [d.step for d in done] == [10]
    assert not stuck.exists() and status(10) == "deleted"


def test_a_symlinked_folder_out_of_the_root_is_unlinked_not_followed(project, root, tmp_path):
    checkpoint = directory(project, root, 10)
    directory(project, root, 20)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "state.json").write_bytes(b"precious")
    sub = root / "run-1" / "step-10" / "sub"
    os.unlink(sub / "state.json")
    os.rmdir(sub)
    os.symlink(outside, sub)
    done = retention.apply(project)
    assert [d.step for d in done] == [10]
    assert (outside / "state.json").read_bytes() == b"precious"
    assert not os.path.lexists(sub) and not os.path.exists(checkpoint.location)


def test_a_location_that_leads_out_of_the_root_is_refused_and_recorded(project, root, tmp_path):
    checkpoint = single_file(project, root, 10)
    directory(project, root, 20)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "epoch-000-step-10.pt").write_bytes(b"precious")
    os.rename(root / "run-1", root / "run-1.away")
    os.symlink(outside, root / "run-1")
    assert retention.apply(project) == []
    assert (outside / "epoch-000-step-10.pt").read_bytes() == b"precious"
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified"
    failed = Event.objects.get(type="checkpoint.delete_failed", step=10)
    assert "refused" in failed.message and "outside the allowed roots" in failed.message


def test_rows_an_older_version_marked_deleted_too_early_are_finished(project, root):
    """Before: `deleted` was written first, and a failure left it so for good."""
    checkpoint = single_file(project, root, 10)
    directory(project, root, 20)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="deleted", deleted_at=None)
    retention.apply(project)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "deleted" and checkpoint.deleted_at is not None
    assert not os.path.exists(checkpoint.location)


def test_a_worker_killed_mid_apply_leaves_deleting_and_the_next_apply_finishes(
    project, root, worker_env
):
    many = {f"shard-{i:04d}.bin": b"x" for i in range(1500)}  # a deletion that takes a while
    for step in (10, 20, 30, 40):
        directory(project, root, step, many)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "retention", "alpha", "--apply"],
        cwd=ROOT, env=worker_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not Checkpoint.objects.filter(status="deleting").exists():
            assert process.poll() is None, "the apply ended before it was caught deleting"
            assert time.monotonic() < deadline
            time.sleep(0.002)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(10)
    assert process.returncode == -signal.SIGKILL
    (caught,) = Checkpoint.objects.filter(status="deleting")
    assert caught.deleted_at is None
    assert not Event.objects.filter(type="checkpoint.deleted", step=caught.step).exists()

    retention.apply(project, actor="test")  # what the next (hourly) run does

    for checkpoint in Checkpoint.objects.filter(run__key="run-1"):
        gone = not os.path.exists(checkpoint.location)
        if checkpoint.step == 40:
            assert checkpoint.status == "verified" and not gone
        else:
            assert checkpoint.status == "deleted" and checkpoint.deleted_at and gone
    assert Event.objects.filter(type="checkpoint.deleted").count() == 3
    assert not Checkpoint.objects.filter(status="deleting").exists()


def test_the_dry_run_is_bounded_and_paged(project, root, api, read_token):
    for step in range(10, 260, 10):  # 25 checkpoints, 24 to delete
        single_file(project, root, step)
    out = io.StringIO()
    call_command("retention", "alpha", "--limit", "5", stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 7
    assert all(line.startswith("DELETE") for line in lines[:5])
    assert lines[5] == "... 20 more decisions not shown (--limit 0 shows all, --run one run)"
    assert lines[6] == "dry run: 24 would be deleted, 1 kept (--apply to delete)"

    body = api.get(read_token, "/retention", limit=10, offset=20).json()
    assert [d["step"] for d in body["local"]] == [210, 220, 230, 240, 250]
    assert (body["local_total"], body["local_deleting"], body["next_offset"]) == (25, 24, None)
    first = api.get(read_token, "/retention", limit=10).json()
    assert len(first["local"]) == 10 and first["next_offset"] == 10
    # Out of range is refused by name, like every other limit of the API, never clamped.
    refused = api.get(read_token, "/retention", limit=10**9)
    assert refused.status_code == 400 and refused.json()["error"].startswith("limit:")
    assert len(api.get(read_token, "/retention", limit=1000).json()["local"]) == 25
