"""Replication of many files at once (webapp/domain/replication/fanout.py): a many-file
checkpoint arrives complete and byte-exact, several files are on the wire at the same
time, and one bad file among many leaves no replica recorded as verified."""

from __future__ import annotations

import json
import os
import threading

import pytest

from tests.support.replication import (
    make_checkpoint,
    make_target,
    objects,
    open_uploads,
    replicate_now,
)
from webapp.domain.models import Event

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 1024 * 1024


@pytest.fixture
def _prefix(monkeypatch):
    # make_target writes under tests.support.replication.PREFIX: this test's own.
    import tests.support.replication

    prefix = f"many-{os.urandom(4).hex()}"
    monkeypatch.setattr(tests.support.replication, "PREFIX", prefix)
    return prefix


def tree(small: int, large: int = 0, large_size: int = 6 * MiB) -> dict[str, bytes]:
    files = {f"shard-{i:05d}/part.bin": os.urandom(100 + i % 4000) for i in range(small)}
    files.update(
        {f"model-{i:02d}-of-{large:02d}.safetensors": os.urandom(large_size) for i in range(large)}
    )
    return files


def test_a_many_file_checkpoint_is_copied_complete_and_byte_exact(
    project, root, s3, settings, _prefix
):
    settings.REPLICATION_PART_SIZE = 5 * MiB
    settings.REPLICATION_CONCURRENCY = 4
    settings.REPLICATION_FILES_AT_ONCE = 8
    # One object a file, sent 8 at once (small files in packs: tests/test_packs.py).
    settings.REPLICATION_PACK_BELOW = 0
    files = tree(small=400, large=3)
    checkpoint = make_checkpoint(project, root, 1, files)
    make_target(project, s3, "main")
    (replica,) = replicate_now(checkpoint)
    assert replica.status == "verified", replica.last_error
    assert (
        replica.bytes_done
        == replica.bytes_sent
        == replica.bytes_total
        == sum(map(len, files.values()))
    )
    assert replica.uploads == {}
    manifest = json.loads(
        s3.client.get_object(Bucket=s3.bucket, Key=replica.manifest_key)["Body"].read()
    )
    assert sorted(e["path"] for e in manifest["files"]) == sorted(files)
    stored = objects(s3, f"{_prefix}/main/sha256/")
    assert len(stored) == len(files)
    for entry in manifest["files"]:
        body = s3.client.get_object(Bucket=s3.bucket, Key=entry["key"])["Body"].read()
        assert body == files[entry["path"]], entry["path"]
    assert open_uploads(s3, f"{_prefix}/main/") == []
    assert "403 files" in Event.objects.get(type="replica.verified").message


def test_several_large_files_are_on_the_wire_at_the_same_time(project, root, s3, settings, _prefix):
    # Throttled so that the uploads last seconds; S3 itself, watched from another thread,
    # shows how many multipart uploads are open at once (one at a time would show 1).
    settings.REPLICATION_PART_SIZE = 5 * MiB
    settings.REPLICATION_CONCURRENCY = 4
    settings.REPLICATION_FILES_AT_ONCE = 4
    settings.REPLICATION_MAX_BYTES_PER_S = 16 * MiB
    checkpoint = make_checkpoint(project, root, 1, tree(small=0, large=4, large_size=11 * MiB))
    make_target(project, s3, "main")
    seen, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            seen[0] = max(seen[0], len(open_uploads(s3, f"{_prefix}/main/")))
            done.wait(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        (replica,) = replicate_now(checkpoint)
    finally:
        done.set()
        watcher.join()
    assert replica.status == "verified", replica.last_error
    assert seen[0] >= 2


def test_one_changed_file_among_many_leaves_no_verified_replica(
    project, root, s3, settings, _prefix
):
    settings.REPLICATION_PART_SIZE = 5 * MiB
    settings.REPLICATION_CONCURRENCY = 4
    settings.REPLICATION_FILES_AT_ONCE = 8
    files = tree(small=200, large=2, large_size=11 * MiB)
    checkpoint = make_checkpoint(project, root, 3, files)
    # One large file is changed in its last part after validation: the other files are
    # sent meanwhile, but the replica must not be verified nor its manifest written, and
    # no multipart upload may stay open.
    name = "model-01-of-02.safetensors"
    changed = bytearray(files[name])
    changed[-10] ^= 0xFF
    (root / "run-1" / "step-3" / name).write_bytes(bytes(changed))
    make_target(project, s3, "main")
    (replica,) = replicate_now(checkpoint)
    assert replica.status == "failed"
    assert replica.verified_at is None and replica.manifest_key == ""
    assert f"{name} does not match its recorded sha256" in replica.last_error
    assert not [k for k in objects(s3, f"{_prefix}/main/") if "/manifests/" in k]
    assert open_uploads(s3, f"{_prefix}/main/") == []
    changed_key = next(e["key"] for e in replica.files if e["path"] == name)
    assert changed_key not in objects(s3, f"{_prefix}/main/")
    checkpoint.refresh_from_db()
    assert checkpoint.status == "corrupt"


def test_a_small_object_is_sent_without_waiting_for_100_continue(
    project, root, s3, settings, _prefix
):
    """botocore asks for "Expect: 100-continue" on every upload: a round trip before the
    body. A small object is sent at once; a part large enough to be worth refusing
    unread still asks first."""
    from webapp.domain.replication import targets

    settings.REPLICATION_PART_SIZE = 5 * MiB
    files = tree(small=5, large=1, large_size=6 * MiB)
    checkpoint = make_checkpoint(project, root, 1, files)
    target = make_target(project, s3, "main")
    client = targets.client_for(target)
    seen: list[tuple[str, int, str | None]] = []

    def record(request, event_name, **kwargs):
        body = request.body
        if hasattr(body, "seek"):  # a part or object body as botocore sends it
            here = body.tell()
            size = body.seek(0, os.SEEK_END) - here
            body.seek(here)
        else:
            size = len(body or b"")
        seen.append((event_name.rsplit(".", 1)[-1], size, request.headers.get("Expect")))

    client.meta.events.register("before-send.s3", record)
    try:
        (replica,) = replicate_now(checkpoint)
    finally:
        client.meta.events.unregister("before-send.s3", record)
    assert replica.status == "verified", replica.last_error
    puts = [s for s in seen if s[0] == "PutObject"]
    parts = [s for s in seen if s[0] == "UploadPart"]
    assert len(puts) == 5 + 1  # the small files and the manifest
    assert all(expect is None for _, _, expect in puts), puts
    assert sorted(size for _, size, _ in parts) == [1 * MiB, 5 * MiB]
    expects = {size: expect for _, size, expect in parts}
    assert expects[5 * MiB] in ("100-continue", b"100-continue"), parts
    assert expects[1 * MiB] is None, parts


def test_a_forked_process_never_sends_on_its_parents_connections(s3, settings):
    """A process forked after the parent used its S3 client (a Celery prefork child, a
    pool) gets a client of its own: two processes writing on one pooled socket mix their
    bytes, and the server refuses the bodies (BadDigest)."""
    from webapp.domain.replication import storage

    def make():
        return storage.client(s3.endpoint, "us-east-1", s3.key, s3.secret)

    parent = make()
    parent.put_object(Bucket=s3.bucket, Key="fork-test/parent", Body=b"p")  # a pooled socket
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answers 1 if it got the parent's client, else sends
        os.close(read)
        try:
            child = make()
            mine = child is not parent
            if mine:
                child.put_object(Bucket=s3.bucket, Key="fork-test/child", Body=b"c")
            os.write(write, b"0" if mine else b"1")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"0", "the forked process was handed its parent's client"
    assert make() is parent  # still one client per process
    body = parent.get_object(Bucket=s3.bucket, Key="fork-test/child")["Body"].read()
    assert body == b"c"


@pytest.mark.parametrize("swapped", ["file", "folder"])
def test_a_symlink_out_of_the_roots_swapped_in_after_validation_is_never_sent(
    project, root, s3, tmp_path, settings, _prefix, swapped
):
    """The worst value a job can leave on disk after its checkpoint was verified: a file,
    or a folder on the way to it, replaced by a symlink to a secret outside the allowed
    roots holding the very bytes recorded (so no checksum would catch it). The replica is
    failed, naming the path, and nothing of the secret reaches the target."""
    secret = os.urandom(4096)
    files = {f"shard-{i:02d}/part.bin": os.urandom(100) for i in range(40)}
    files["shard-07/part.bin"] = secret
    checkpoint = make_checkpoint(project, root, 1, files)
    outside = tmp_path / "outside"
    (outside / "shard-07").mkdir(parents=True)
    (outside / "shard-07" / "part.bin").write_bytes(secret)
    folder = root / "run-1" / "step-1" / "shard-07"
    if swapped == "file":
        (folder / "part.bin").unlink()
        (folder / "part.bin").symlink_to(outside / "shard-07" / "part.bin")
    else:
        (folder / "part.bin").unlink()
        folder.rmdir()
        folder.symlink_to(outside / "shard-07")
    make_target(project, s3, "main")

    (replica,) = replicate_now(checkpoint)

    assert replica.status == "failed", replica.last_error
    assert "shard-07" in replica.last_error and "symlink" in replica.last_error
    sent = objects(s3, _prefix)
    secret_key = next(e["key"] for e in replica.files if e["path"] == "shard-07/part.bin")
    assert not any(key.endswith(secret_key) for key in sent), "the secret was sent"
    assert not any(key.endswith(".json") for key in sent)  # no manifest: not a copy
