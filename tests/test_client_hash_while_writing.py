"""lifeboat.torch.save hashes the bytes as torch.save writes them (lifeboat.files.
HashingWriter): the report reads nothing back, its sha256 is that of the file, and a file
changed on disk after the job reported it is caught by the server's validation."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

import lifeboat
import lifeboat.torch as lbtorch
from lifeboat.files import HashingWriter, describe
from webapp.domain.models import Checkpoint
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


def sha256_file(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_digest_made_while_writing_is_the_sha256_of_the_file(tmp_path):
    state = {"w": torch.randn(300_000), "step": 7, "nested": {"b": torch.arange(1000)}}
    with open(tmp_path / "plain.pt", "wb") as handle:
        writer = HashingWriter(handle)
        torch.save(state, writer)
    assert writer.digest() == {
        "size": (tmp_path / "plain.pt").stat().st_size,
        "sha256": sha256_file(tmp_path / "plain.pt"),
    }
    digests: dict = {}
    lbtorch.atomic_save(state, tmp_path / "atomic.pt", digests=digests)
    assert digests == {
        "atomic.pt": {"size": (tmp_path / "atomic.pt").stat().st_size,
                      "sha256": sha256_file(tmp_path / "atomic.pt")},
    }  # fmt: skip
    folder: dict = {}
    lbtorch.atomic_save({"model.pt": state, "optim.pt": {"lr": 0.1}}, str(tmp_path / "d") + "/",
                        digests=folder)  # fmt: skip
    assert folder == {
        name: {"size": (tmp_path / "d" / name).stat().st_size,
               "sha256": sha256_file(tmp_path / "d" / name)}
        for name in ("model.pt", "optim.pt")
    }  # fmt: skip


def test_a_writer_used_for_more_than_writing_gives_no_digest(tmp_path):
    with open(tmp_path / "f.bin", "wb") as handle:
        writer = HashingWriter(handle)
        writer.write(b"abc")
        writer.seek(0)  # torch.save never does this; a digest would no longer hold
        writer.write(b"x")
    assert writer.digest() is None


def test_described_files_use_the_written_digest_and_are_not_read(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"written by the job")
    written = {"model.pt": {"size": 18, "sha256": "ab" * 32}}
    read = []
    files = describe(path, on_read=read.append, written=written)
    assert files == [{"path": "model.pt", "size": 18, "sha256": "ab" * 32}]
    assert read == []  # nothing read back
    assert describe(path, on_read=read.append)[0]["sha256"] == sha256_file(path)
    assert read == [18]


def test_a_file_changed_after_the_job_reported_it_is_caught(server, token, root, tmp_path):
    run = lifeboat.Run(
        "changed-run", url=server.url, token=token, spool_dir=tmp_path / "spool",
        handle_signals=False,
    )  # fmt: skip
    path = root / "step-5.pt"
    # The run's hashing thread is not started yet: the report waits in its queue while
    # the file is changed on disk, size and mtime kept (a bit flip, a stray writer).
    report = lbtorch.save({"w": torch.randn(50_000)}, path, step=5, run=run)
    written = sha256_file(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    run.start()
    event = report.wait(30)
    run.finish()
    # What is reported is what the job wrote, not what the disk holds now ...
    assert event["files"][0]["sha256"] == written != sha256_file(path)
    # ... so the worker's validation, reading the file, finds the change.
    checkpoint = Checkpoint.objects.get(run__key="changed-run")
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "corrupt", checkpoint.status_message
    assert "step-5.pt" in checkpoint.status_message
