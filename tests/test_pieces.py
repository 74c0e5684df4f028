"""Large files cut at tensor boundaries, on a real SeaweedFS and PostgreSQL
(webapp/domain/replication/pieces.py): a `torch.save` file of a model whose base is
frozen is sent whole by the run's first copy, cut by the next, and the one after sends
only the tensors that changed; a run whose tensors all change (full training) is cut only
now and then;
both restore byte for byte on the server and through the client's own path; retention
keeps the pieces another copy names and deletes the rest; the audit finds no orphans;
the ledger counts a shared piece once; a hostile header never loses a byte; a file that
changes between the two passes is refused, never stored under a wrong address."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from django.db import connection

from lifeboat.restore import fetch_replica
from tests.support.replication import MiB, make_checkpoint, make_target, replicate_now
from webapp.api.reads import CUT_REASON
from webapp.domain.models import Checkpoint, Replica, RetentionPolicy
from webapp.domain.replication import ledger, targets
from webapp.domain.replication.restore import RestoreError, restore_replica
from webapp.domain.retention import orphans
from webapp.domain.retention import policy as retention

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def cut_above_a_mebibyte(settings):
    settings.REPLICATION_PIECES_ABOVE = MiB


def saved(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def frozen_model(step: int) -> bytes:
    """12 frozen 256x256 weights (3 MiB) and a head that changes at every step."""
    base = torch.Generator().manual_seed(0)
    state = {f"blocks.{i}.weight": torch.randn(256, 256, generator=base) for i in range(12)}
    state["head.weight"] = torch.randn(64, 256, generator=torch.Generator().manual_seed(step))
    return saved({"model": state, "step": step})


def stored(s3, target) -> dict[str, int]:
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=targets.blobs_prefix(target))
    return {item["Key"]: item["Size"] for item in listed.get("Contents", [])}


def same_bytes(path, data: bytes) -> bool:
    return hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_the_next_checkpoint_of_a_frozen_model_sends_only_the_tensors_that_changed(
    project, root, s3, api, read_token, tmp_path
):
    target = make_target(project, s3, "tensors")
    (first,) = replicate_now(make_checkpoint(project, root, 0, {"model.pt": frozen_model(0)}))
    assert "pieces" not in first.files[0]  # the run's first copy: nothing to share with yet
    one_bytes, two_bytes = frozen_model(1), frozen_model(2)
    (one,) = replicate_now(make_checkpoint(project, root, 1, {"model.pt": one_bytes}))
    assert one.status == "verified", one.last_error
    (entry,) = one.files
    assert "key" not in entry and len(entry["pieces"]) >= 13  # a piece a tensor at least
    assert sum(p["size"] for p in entry["pieces"]) == len(one_bytes)
    assert one.bytes_sent == len(one_bytes)

    step2 = make_checkpoint(project, root, 2, {"model.pt": two_bytes})
    (two,) = replicate_now(step2)
    assert two.status == "verified", two.last_error
    # The head (64 KiB) and the records around it, not the 3 MiB of frozen weights.
    assert two.bytes_sent < len(two_bytes) / 10, (two.bytes_sent, len(two_bytes))
    shared = {p["key"] for p in one.files[0]["pieces"]} & {p["key"] for p in two.files[0]["pieces"]}
    assert len(shared) >= 12

    restore_replica(two, tmp_path / "server")
    assert same_bytes(tmp_path / "server" / "model.pt", two_bytes)
    # The client's path: the API lists each piece's URL; the job's own download code.
    answer = api.get(read_token, f"/checkpoints/{step2.pk}").json()
    (listed,) = answer["replicas"][0]["files"]
    assert len(listed["pieces"]) == len(two.files[0]["pieces"])
    # A client from before pieces fetches `url`: it gets a 410 whose reason says why.
    gone = api.get(None, listed["url"].removeprefix("http://testserver/api/v1"))
    assert (gone.status_code, gone.reason_phrase) == (410, CUT_REASON)
    fetched = fetch_replica(answer, tmp_path / "client", show_progress=False)
    assert same_bytes(fetched / "model.pt", two_bytes)

    # Shared pieces are stored and counted once.
    figures = ledger.target_ledger(target)
    assert figures["stored_bytes"] == sum(stored(s3, target).values())
    assert figures["saved_bytes"] >= len(one_bytes) - two.bytes_sent - 1024
    assert orphans.audit(target, "test").orphan_objects == 0

    # Retention deletes the older copies: the pieces the last names stay, the rest go.
    RetentionPolicy.objects.create(project=project, applies_to="replicas", keep_last=1)
    assert sorted(d.step for d in retention.apply(project)) == [0, 1]
    assert set(stored(s3, target)) == {p["key"] for p in two.files[0]["pieces"]}
    assert Replica.objects.get(pk=one.pk).deleted_at is not None
    restore_replica(Replica.objects.get(pk=two.pk), tmp_path / "after")
    assert same_bytes(tmp_path / "after" / "model.pt", two_bytes)


def safetensors_file(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def tensors(n: int = 4, size: int = 400_000) -> tuple[dict, bytes]:
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for i in range(n):
        header[f"w{i}"] = {
            "dtype": "U8",
            "shape": [size],
            "data_offsets": [len(data), len(data) + size],
        }
        data += os.urandom(size)
    return header, data


HOSTILE = {
    "offsets past the end": lambda h: {**h, "w1": {**h["w1"], "data_offsets": [0, 10**15]}},
    "negative offsets": lambda h: {**h, "w1": {**h["w1"], "data_offsets": [-5, -1]}},
    "overlapping": lambda h: {**h, "w2": {**h["w2"], "data_offsets": [100, 900_000]}},
    "offsets that are not numbers": lambda h: {**h, "w1": {**h["w1"], "data_offsets": ["a", {}]}},
    "a header that is a list": lambda h: [1, 2, 3],
    "more cuts than a file may have": lambda h: {
        f"t{i}": {"data_offsets": [i, i + 1]} for i in range(20_000)
    },
}


@pytest.mark.parametrize("damage", [None, *HOSTILE])
def test_a_safetensors_file_restores_byte_for_byte_whatever_its_header_says(
    project, root, s3, tmp_path, damage
):
    make_target(project, s3, "st")
    header, data = tensors()
    if damage:
        header = HOSTILE[damage](header)
    body = safetensors_file(header, data)
    replicate_now(make_checkpoint(project, root, 1, {"m.safetensors": b"first" * MiB}))
    (replica,) = replicate_now(make_checkpoint(project, root, 2, {"m.safetensors": body}))
    assert replica.status == "verified", replica.last_error
    (entry,) = replica.files
    if damage is None:
        assert len(entry["pieces"]) == 5  # the header, then each tensor
    if "pieces" in entry:
        assert sum(p["size"] for p in entry["pieces"]) == len(body)
        assert all(p["size"] > 0 for p in entry["pieces"])
    restore_replica(replica, tmp_path / "restored")
    assert same_bytes(tmp_path / "restored" / "m.safetensors", body)


def test_a_file_that_changes_between_the_passes_is_refused(project, root, s3):
    """The first pass hashed the pieces; the file changes before the second reads them:
    no piece is stored under an address that is not its content, the copy fails and the
    checkpoint is no longer called good."""
    target = make_target(project, s3, "changed")
    replicate_now(make_checkpoint(project, root, 0, {"model.pt": frozen_model(0)}))
    body = frozen_model(1)
    checkpoint = make_checkpoint(project, root, 1, {"model.pt": body})
    path = root / "run-1" / "step-1" / "model.pt"

    def change_the_file_once_the_pieces_are_named(execute, sql, params, many, context):
        # The claim's save names every column; pieces.plan writes only the files.
        if 'SET "files" = ' in sql and path.read_bytes() == body:
            path.write_bytes(body[:-100_000] + os.urandom(100_000))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(change_the_file_once_the_pieces_are_named):
        (replica,) = replicate_now(checkpoint)
    assert path.read_bytes() != body
    replica = Replica.objects.get(pk=replica.pk)
    assert replica.status == "failed" and "changed after validation" in replica.last_error
    assert Checkpoint.objects.get(pk=checkpoint.pk).status == "corrupt"
    for key, size in stored(s3, target).items():
        got = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        assert key.endswith(hashlib.sha256(got).hexdigest()) and len(got) == size


def test_a_file_changed_before_the_copy_is_never_cut(project, root, s3):
    make_target(project, s3, "before")
    replicate_now(make_checkpoint(project, root, 0, {"model.pt": frozen_model(0)}))
    body = frozen_model(1)
    checkpoint = make_checkpoint(project, root, 1, {"model.pt": body})
    (root / "run-1" / "step-1" / "model.pt").write_bytes(frozen_model(9))
    (replica,) = replicate_now(checkpoint)
    replica = Replica.objects.get(pk=replica.pk)
    assert replica.status == "failed" and "model.pt" in replica.last_error


def test_with_cutting_off_a_large_file_is_one_object(project, root, s3, settings, tmp_path):
    settings.REPLICATION_PIECES_ABOVE = 0
    target = make_target(project, s3, "whole")
    body = frozen_model(1)
    replicate_now(make_checkpoint(project, root, 0, {"model.pt": frozen_model(0)}))
    (replica,) = replicate_now(make_checkpoint(project, root, 1, {"model.pt": body}))
    assert "pieces" not in replica.files[0] and len(stored(s3, target)) == 2
    # A copy cut in pieces after one that was not: both restore.
    settings.REPLICATION_PIECES_ABOVE = MiB
    (second,) = replicate_now(make_checkpoint(project, root, 2, {"model.pt": frozen_model(2)}))
    assert "pieces" in second.files[0]
    restore_replica(replica, tmp_path / "one")
    restore_replica(second, tmp_path / "two")
    assert same_bytes(tmp_path / "one" / "model.pt", body)
    assert same_bytes(tmp_path / "two" / "model.pt", frozen_model(2))


def cut_or_not(project, root, run: str, steps: int, tensors_at) -> list[bool]:
    """Copy `steps` checkpoints of a safetensors file of the tensors `tensors_at(step)`;
    whether each copy cut it."""
    pattern = []
    for step in range(1, steps + 1):
        header, data = {}, b""
        for i, tensor in enumerate(tensors_at(step)):
            header[f"w{i}"] = {"dtype": "U8", "shape": [len(tensor)],
                               "data_offsets": [len(data), len(data) + len(tensor)]}  # fmt: skip
            data += tensor
        body = safetensors_file(header, data)
        checkpoint = make_checkpoint(project, root, step, {"m.safetensors": body}, run=run)
        (replica,) = replicate_now(checkpoint)
        assert replica.status == "verified", replica.last_error
        pattern.append("pieces" in replica.files[0])
    return pattern


def test_full_training_is_cut_only_now_and_then_and_fine_tuning_always(project, root, s3):
    """Every tensor changes at every step: after two copies cut for nothing, copies go
    whole until that measurement leaves the window of 8 copies. Frozen tensors: cut from
    the second copy on, and from the third on only what changed is sent."""
    make_target(project, s3, "full")
    full = cut_or_not(project, root, "full", 13, lambda _: [os.urandom(300_000) for _ in range(4)])
    assert full == [False, True, True] + [False] * 7 + [True, True, False]
    frozen = [os.urandom(300_000) for _ in range(3)]
    tuned = cut_or_not(project, root, "tuned", 6, lambda _: [*frozen, os.urandom(300_000)])
    assert tuned == [False] + [True] * 5
    last = Replica.objects.filter(checkpoint__run__key="tuned").latest("pk")
    assert last.bytes_sent < 400_000  # the changed tensor (and the header), not 1.2 MB


@pytest.mark.parametrize("fault", ["damaged", "gone"])
def test_a_damaged_or_missing_piece_fails_the_restore_naming_the_file(
    project, root, s3, tmp_path, fault
):
    make_target(project, s3, "faults")
    replicate_now(make_checkpoint(project, root, 0, {"model.pt": frozen_model(0)}))
    (replica,) = replicate_now(make_checkpoint(project, root, 1, {"model.pt": frozen_model(1)}))
    piece = max(replica.files[0]["pieces"], key=lambda p: p["size"])
    if fault == "damaged":
        body = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=piece["key"])["Body"].read())
        body[1000] ^= 0xFF
        s3.put(piece["key"], bytes(body))
    else:
        s3.client.delete_object(Bucket=s3.bucket, Key=piece["key"])
    with pytest.raises(RestoreError, match="model.pt") as failed:
        restore_replica(replica, tmp_path / "restored")
    assert failed.value.replica_at_fault
    assert not (tmp_path / "restored" / "model.pt").exists()


def dcp_save(state: dict, folder) -> dict[str, bytes]:
    """A DCP save of one rank (FSDP2's format): its files' bytes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=folder, no_dist=True)
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_dcp_shard_is_cut_at_its_tensors_and_sends_only_what_changed(project, root, s3, tmp_path):
    """A DCP shard is torch zips end to end, one a tensor: each zip's directory says
    where its tensor is."""
    make_target(project, s3, "dcp")
    base = torch.Generator().manual_seed(0)
    frozen = {f"blocks.{i}.weight": torch.randn(256, 256, generator=base) for i in range(8)}
    sent = []
    for step in (1, 2, 3):
        head = torch.randn(64, 256, generator=torch.Generator().manual_seed(step))
        files = dcp_save({**frozen, "head.weight": head}, tmp_path / f"save-{step}")
        (replica,) = replicate_now(make_checkpoint(project, root, step, files))
        assert replica.status == "verified", replica.last_error
        sent.append(replica.bytes_sent)
    shard = next(e for e in replica.files if e["path"].endswith(".distcp"))
    assert len(shard["pieces"]) >= 9
    assert sent[2] < sent[0] / 10, sent  # the head and the metadata, not 2 MiB of frozen weights
    restore_replica(replica, tmp_path / "restored")
    assert same_bytes(tmp_path / "restored" / shard["path"], files[shard["path"]])


def zip_damage(kind: str) -> bytes:
    body = bytearray(frozen_model(1))
    end = body.rfind(b"PK\x05\x06")
    if kind == "an end record pointing past the file":
        body[end + 16 : end + 20] = (2**32 - 2).to_bytes(4, "little")
        locator = end - 20
        body[locator - 56 + 48 : locator - 56 + 56] = (2**60).to_bytes(8, "little")
    elif kind == "a directory entry pointing past the file":
        entry = body.rfind(b"PK\x01\x02")
        body[entry + 42 : entry + 46] = (2**32 - 2).to_bytes(4, "little")
    elif kind == "end signatures in random bytes after it":
        body += b"".join(os.urandom(1000) + b"PK\x05\x06" + os.urandom(30) for _ in range(50))
    elif kind == "a directory of garbage":
        entry = body.find(b"PK\x01\x02")
        body[entry:end] = os.urandom(end - entry)
    return bytes(body)


@pytest.mark.parametrize(
    "kind",
    [
        "an end record pointing past the file",
        "a directory entry pointing past the file",
        "end signatures in random bytes after it",
        "a directory of garbage",
    ],
)
def test_a_torch_zip_whose_directory_lies_restores_byte_for_byte(project, root, s3, tmp_path, kind):
    make_target(project, s3, "zips")
    replicate_now(make_checkpoint(project, root, 1, {"model.pt": frozen_model(0)}))
    body = zip_damage(kind)
    (replica,) = replicate_now(make_checkpoint(project, root, 2, {"model.pt": body}))
    assert replica.status == "verified", replica.last_error
    if "pieces" in replica.files[0]:
        assert sum(p["size"] for p in replica.files[0]["pieces"]) == len(body)
    restore_replica(replica, tmp_path / "restored")
    assert same_bytes(tmp_path / "restored" / "model.pt", body)
