"""Small files sent in packs, on a real SeaweedFS (webapp/domain/replication/packs.py):
a checkpoint of 200 small files and a large one is copied as one pack, one object and a
manifest; it restores byte for byte on the server and through the client's own path; the
next checkpoint sends only its changed small files, pointing into the first pack for the
rest; retention keeps a pack another copy still names; a damaged pack is named by file;
a file changed after validation is never packed."""

from __future__ import annotations

import hashlib
import os
import random

import pytest

from lifeboat.restore import fetch_replica
from tests.support.replication import MiB, make_checkpoint, make_target, replicate_now
from webapp.domain.models import Replica, RetentionPolicy
from webapp.domain.replication import targets
from webapp.domain.replication.restore import RestoreError, restore_replica
from webapp.domain.retention import policy as retention

pytestmark = pytest.mark.django_db(transaction=True)


def small_files(seed: int, n: int = 200) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {
        f"shards/{i // 50}/t{i:03d}.bin": rng.randbytes(rng.randint(100, 5000)) for i in range(n)
    }


def tree(root) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*")) if p.is_file()
    }  # fmt: skip


def stored_keys(s3, target) -> set[str]:
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=targets.blobs_prefix(target))
    return {item["Key"] for item in listed.get("Contents", [])}


def test_small_files_go_in_one_pack_and_restore_byte_for_byte(
    project, root, s3, api, read_token, tmp_path
):
    target = make_target(project, s3, "packed")
    files = {**small_files(1), "model.pt": os.urandom(2 * MiB)}
    checkpoint = make_checkpoint(project, root, 1, files)
    (replica,) = replicate_now(checkpoint)
    assert replica.status == "verified", replica.last_error
    packed = [e for e in replica.files if "offset" in e]
    assert len(packed) == 200
    assert len({e["key"] for e in packed}) == 1  # one pack
    assert packed[0]["object_size"] == sum(len(d) for p, d in files.items() if p != "model.pt")
    assert len(stored_keys(s3, target)) == 2  # the pack and the model: not 201 objects

    restore_replica(replica, tmp_path / "server")
    assert tree(tmp_path / "server") == tree(root / "run-1" / "step-1")

    # The client's path: the API's answer (with each packed file's offset), then the
    # same download code a job runs.
    answer = api.get(read_token, f"/checkpoints/{checkpoint.pk}").json()
    assert all("offset" in f for f in answer["replicas"][0]["files"] if f["path"] != "model.pt")
    fetched = fetch_replica(answer, tmp_path / "client", show_progress=False)
    assert tree(fetched) == tree(root / "run-1" / "step-1")


def test_the_next_checkpoint_sends_only_what_changed_and_retention_keeps_shared_packs(
    project, root, s3, tmp_path
):
    target = make_target(project, s3, "dedup")
    first = small_files(2)
    (one,) = replicate_now(make_checkpoint(project, root, 1, first))
    second = dict(first)
    changed = sorted(second)[:10]
    for path in changed:
        second[path] = os.urandom(3000)
    (two,) = replicate_now(make_checkpoint(project, root, 2, second))
    assert two.status == "verified", two.last_error
    assert two.bytes_sent == 10 * 3000  # the ten changed files, in a pack of their own
    first_pack = next(e["key"] for e in one.files)
    reused = [e for e in two.files if e["key"] == first_pack]
    assert len(reused) == 190
    assert len(stored_keys(s3, target)) == 2

    # Retention deletes the first copy: its pack stays, named by the second.
    RetentionPolicy.objects.create(project=project, applies_to="replicas", keep_last=1)
    assert [d.step for d in retention.apply(project)] == [1]
    assert first_pack in stored_keys(s3, target)
    restore_replica(two, tmp_path / "two")
    assert tree(tmp_path / "two") == tree(root / "run-1" / "step-2")


def test_a_damaged_pack_is_named_by_file(project, root, s3, tmp_path):
    make_target(project, s3, "damaged")
    (replica,) = replicate_now(make_checkpoint(project, root, 1, small_files(3)))
    pack = replica.files[0]["key"]
    body = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=pack)["Body"].read())
    victim = replica.files[17]
    body[victim["offset"] + 5] ^= 0xFF
    s3.put(pack, bytes(body))
    with pytest.raises(RestoreError, match=victim["path"].replace("/", "/") + " does not match"):
        restore_replica(replica, tmp_path / "restored")


def test_a_small_file_changed_after_validation_is_never_packed(project, root, s3):
    make_target(project, s3, "changed")
    checkpoint = make_checkpoint(project, root, 1, small_files(4))
    victim = root / "run-1" / "step-1" / "shards" / "1" / "t060.bin"
    victim.write_bytes(b"not what was verified")
    (replica,) = replicate_now(checkpoint)
    replica = Replica.objects.get(pk=replica.pk)
    assert replica.status == "failed"
    assert (
        "shards/1/t060.bin" in replica.last_error
        and "changed after validation" in replica.last_error
    )
    assert replica.manifest_key == ""


def test_with_packing_off_every_file_is_its_own_object(project, root, s3, settings, tmp_path):
    settings.REPLICATION_PACK_BELOW = 0
    target = make_target(project, s3, "unpacked")
    (replica,) = replicate_now(make_checkpoint(project, root, 1, small_files(5, n=40)))
    assert not any("offset" in e for e in replica.files)
    assert len(stored_keys(s3, target)) == 40
    restore_replica(replica, tmp_path / "restored")
    assert tree(tmp_path / "restored") == tree(root / "run-1" / "step-1")


def test_a_copy_whose_small_files_are_all_in_earlier_packs_records_where_they_are(
    project, root, s3, tmp_path
):
    """No new pack to send: the row must still say which packs hold its small files."""
    make_target(project, s3, "all-reused")
    first = small_files(3)
    (one,) = replicate_now(make_checkpoint(project, root, 1, {**first, "m.pt": os.urandom(MiB)}))
    (two,) = replicate_now(make_checkpoint(project, root, 2, {**first, "m.pt": os.urandom(MiB)}))
    assert two.status == "verified", two.last_error
    two.refresh_from_db()
    pack = next(e["key"] for e in one.files if "offset" in e)
    assert sum(1 for e in two.files if e.get("key") == pack) == 200
    # Retention of the first copy keeps the pack the second points into.
    RetentionPolicy.objects.create(project=project, applies_to="replicas", keep_last=1)
    assert [d.step for d in retention.apply(project)] == [1]
    restore_replica(two, tmp_path / "two")
    assert tree(tmp_path / "two") == tree(root / "run-1" / "step-2")
