"""Restoring a sharded checkpoint (lifeboat/download.py, webapp/domain/recovery/restore_load.py):
every shard is fetched at once and verified byte for byte, a corrupt shard fails the
restore naming it, and the load goes shard by shard."""

from __future__ import annotations

import hashlib
import threading
import urllib.request

import pytest
import torch

from lifeboat.download import RestoreError, download_files
from tests.support.restore import damage, replicate_checkpoint, restore
from webapp.domain.models import Replica
from webapp.domain.replication.restore import replica_files

pytestmark = pytest.mark.django_db(transaction=True)

SHARDS = 6


@pytest.fixture
def sharded(api, token, project, s3, tmp_path, settings):
    generator = torch.Generator().manual_seed(2)
    files = {
        f"shard-{i}.pt": {f"layer.{i}.w": torch.randn(300_000, generator=generator)}
        for i in range(SHARDS)
    }
    return replicate_checkpoint(files, api, token, project, s3, tmp_path, settings)


class CountingOpener:
    """urllib's urlopen, counting the requests open at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.open = self.most = 0

    def __call__(self, request, timeout):
        with self.lock:
            self.open += 1
            self.most = max(self.most, self.open)
        try:
            response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310
            data = response.read()
        finally:
            with self.lock:
                self.open -= 1
        return _Body(data)


class _Body:
    def __init__(self, data: bytes):
        self.data, self.at, self.status = data, 0, 200

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.at + n
        chunk, self.at = self.data[self.at : end], min(end, len(self.data))
        return chunk

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_every_shard_is_fetched_at_once_and_verified(sharded, tmp_path):
    files = replica_files(Replica.objects.get())
    opener = CountingOpener()
    seen = []
    paths = download_files(
        files, tmp_path / "out", lambda done, total: seen.append((done, total)),
        opener=opener, parallel=SHARDS,
    )  # fmt: skip
    assert [p.name for p in paths] == [f["path"] for f in files]
    for entry, path in zip(files, paths, strict=True):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
    assert opener.most >= 2  # one file at a time would never have two GETs open
    total = sum(f["size"] for f in files)
    assert seen[-1] == (total, total)


def test_a_sharded_checkpoint_restores_and_loads_shard_by_shard(sharded, queues):
    validation = restore(sharded)
    assert validation.status == "passed", validation.message
    assert f"{SHARDS} tensors" in validation.message
    assert validation.bytes_done == validation.bytes_total == sharded.total_size


def test_a_corrupt_shard_fails_the_restore_naming_it(sharded, s3, tmp_path, queues):
    damage(s3, "shard-3.pt", 1000)
    with pytest.raises(RestoreError, match=r"shard-3\.pt does not match its sha256"):
        download_files(replica_files(Replica.objects.get()), tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.partial"))
    validation = restore(sharded)
    assert validation.status == "failed"
    assert "shard-3.pt does not match its sha256" in validation.message
