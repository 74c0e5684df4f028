"""lifeboat.latest: a restarting job gets the newest verified checkpoint, its own copy if
whole, else a verified download from a replica in a real S3 server (SeaweedFS)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest

import lifeboat
from tests.support.client_scripts import run_script
from tests.support.events import saved
from webapp.domain.models import Checkpoint, Replica, StorageTarget
from webapp.domain.replication import policy
from workers.replicate import replicate
from workers.validate import validate_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


def env_for(server, token, tmp_path) -> dict:
    return {
        "LIFEBOAT_URL": server.url,
        "LIFEBOAT_TOKEN": token,
        "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
        "LIFEBOAT_RESTORE_DIR": str(tmp_path / "restored"),
    }


def test_an_intact_local_copy_is_handed_back_as_it_is(replicated, token, tmp_path):
    server, checkpoint, directory, _ = replicated
    path = lifeboat.latest("job", url=server.url, token=token, dest=tmp_path / "restored")
    assert path == directory
    assert not (tmp_path / "restored").exists()  # nothing was downloaded


def test_a_missing_local_copy_comes_back_from_the_replica_verified(
    replicated, token, tmp_path, capsys
):
    server, checkpoint, directory, files = replicated
    for name in files:
        (directory / name).unlink()
    path = lifeboat.latest("job", url=server.url, token=token, dest=tmp_path / "restored")
    assert path != directory and path.is_dir()
    assert {name: (path / name).read_bytes() for name in files} == files
    progress = capsys.readouterr().err
    assert "is missing; restoring step 5 from a replica" in progress
    assert "restoring from backup:" in progress and "(100%)" in progress and "ETA" in progress
    # Asked again, the restored copy is checked and handed back without a download.
    assert lifeboat.latest("job", url=server.url, token=token, dest=tmp_path / "restored") == path


def test_a_damaged_local_copy_is_left_alone_and_a_good_one_fetched(replicated, token, tmp_path):
    server, checkpoint, directory, files = replicated
    damaged = bytearray(files["model.bin"])
    damaged[1000] ^= 1  # same size, one bit off: only the sha256 tells
    (directory / "model.bin").write_bytes(bytes(damaged))
    done = run_script(
        "import sys, lifeboat.cli; sys.exit(lifeboat.cli.main(['latest', 'job']))",
        env_for(server, token, tmp_path),
    )
    assert done.returncode == 0, done.stderr_text
    path = done.stdout_text.strip()
    assert path.startswith(str(tmp_path / "restored"))
    restored = (tmp_path / "restored").glob("job/checkpoint-*/model.bin")
    assert [p.read_bytes() for p in restored] == [files["model.bin"]]
    assert (directory / "model.bin").read_bytes() == bytes(damaged)  # evidence kept
    assert "does not match its sha256" in done.stderr_text


def test_a_replica_damaged_in_s3_is_never_handed_back(replicated, s3, token, tmp_path):
    server, checkpoint, directory, files = replicated
    (directory / "model.bin").unlink()
    replica = Replica.objects.get(checkpoint=checkpoint)
    entry = next(e for e in replica.files if e["path"] == "model.bin")
    s3.client.put_object(Bucket=s3.bucket, Key=entry["key"], Body=b"x" * len(files["model.bin"]))
    with pytest.raises(lifeboat.LatestError, match="model.bin does not match its sha256"):
        lifeboat.latest("job", url=server.url, token=token, dest=tmp_path / "restored")
    assert not any((tmp_path / "restored").rglob("model.bin"))


def test_no_verified_checkpoint_is_a_clear_error(server, token, tmp_path):
    with pytest.raises(lifeboat.LatestError, match="nothing to resume run 'nobody' from"):
        lifeboat.latest("nobody", url=server.url, token=token)
    with lifeboat.Run(
        "fresh", url=server.url, token=token, spool_dir=tmp_path / "spool", handle_signals=False
    ):
        pass
    done = run_script(
        "import sys, lifeboat.cli; sys.exit(lifeboat.cli.main(['latest', 'fresh']))",
        env_for(server, token, tmp_path),
    )
    assert done.returncode == 3
    assert "run 'fresh' has no verified checkpoint yet (HTTP 404)" in done.stderr_text


def test_a_big_file_comes_in_parallel_ranges_hashed_in_order(s3, tmp_path):
    import hashlib
    import os

    from lifeboat.download import CHUNK, RestoreError, download_files

    data = os.urandom(2 * CHUNK + 12345)  # three ranged GETs
    s3.put("big/model.bin", data)
    url = s3.client.generate_presigned_url(
        "get_object", Params={"Bucket": s3.bucket, "Key": "big/model.bin"}, ExpiresIn=600
    )
    spec = {"path": "model.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    seen = []
    (path,) = download_files([{**spec, "url": url}], tmp_path / "out", lambda d, t: seen.append(d))
    # Progress comes on the calling thread (about every 0.2 s and at the end), rising.
    assert path.read_bytes() == data and seen[-1] == len(data) and seen == sorted(seen)
    # One byte off in the last range: never handed back, nothing left behind.
    with pytest.raises(RestoreError, match="does not match its sha256"):
        download_files([{**spec, "sha256": "0" * 64, "url": url}], tmp_path / "bad")
    assert not any((tmp_path / "bad").iterdir())


@pytest.fixture
def replicated_parts(s3_server_env, s3, token, project, tmp_path, api):
    """A checkpoint of 2 ranks, each reporting its part (rank 0 with the shared index),
    verified and replicated; then its local copy is gone."""
    directory = tmp_path / "ckpts" / "job" / "step-7"
    directory.mkdir(parents=True)
    files = {"index.json": b'{"shards": 2}', "rank0.bin": b"0" * 500_000, "rank1.bin": b"1" * 700}
    for name, data in files.items():
        (directory / name).write_bytes(data)
    project.allowed_roots = [str(tmp_path / "ckpts")]
    project.save()
    owners = {"index.json": 0, "rank0.bin": 0, "rank1.bin": 1}
    for rank in (0, 1):
        mine = [
            {"path": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
            for n, d in files.items()
            if owners[n] == rank
        ]
        body = saved(run="job", step=7, location=str(directory), files=mine, format="")
        body["part"] = {"rank": rank, "world_size": 2, "host": f"node-{rank}"}
        assert api.post_events(token, body).status_code == 202
    checkpoint = Checkpoint.objects.get(run__key="job", step=7)
    validate_checkpoint(checkpoint.pk)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified", checkpoint.status_message
    target = StorageTarget.objects.create(
        project=project, name="backup", bucket=s3.bucket,
        prefix=f"parts-{uuid.uuid4().hex[:6]}", endpoint_url=s3.endpoint,
    )  # fmt: skip
    (replica_id,) = policy.request(checkpoint, [target], by_policy=False)
    replicate(replica_id)
    assert Replica.objects.get(pk=replica_id).status == "verified"
    return s3_server_env, directory, files


def test_a_rank_fetches_its_share_on_the_same_world_size_and_all_on_another(
    replicated_parts, token, tmp_path
):
    server, directory, files = replicated_parts
    # On its host, rank 1 finds its own file and the shared index there: nothing is
    # fetched, though rank 0's shard is not on this host.
    (directory / "rank0.bin").unlink()
    here = lifeboat.latest(
        "job", url=server.url, token=token, dest=tmp_path / "r", rank=1, world_size=2
    )
    assert here == directory and not (tmp_path / "r").exists()
    # On a new host: rank 1 fetches its file and the shared index, not rank 0's shard.
    (directory / "rank1.bin").unlink()
    (directory / "index.json").unlink()
    path = lifeboat.latest(
        "job", url=server.url, token=token, dest=tmp_path / "r", rank=1, world_size=2
    )
    assert sorted(p.name for p in path.iterdir()) == ["index.json", "rank1.bin"]
    assert (path / "rank1.bin").read_bytes() == files["rank1.bin"]
    # Rank 0 on the same host adds its share beside it; the folder is whole.
    assert (
        lifeboat.latest(
            "job", url=server.url, token=token, dest=tmp_path / "r", rank=0, world_size=2
        )
        == path
    )
    assert {p.name: p.read_bytes() for p in path.iterdir()} == files
    # Resumed on another world size: every rank needs every shard.
    other = lifeboat.latest(
        "job", url=server.url, token=token, dest=tmp_path / "r4", rank=3, world_size=4
    )
    assert {p.name: p.read_bytes() for p in other.iterdir()} == files


def test_every_rank_restores_the_checkpoint_rank_0_chose(replicated_parts, token, api, tmp_path):
    # A job on many hosts: rank 0 asks for the newest id and broadcasts it; a checkpoint
    # verified while the ranks start does not split them between two steps.
    server, directory, files = replicated_parts
    chosen = lifeboat.latest_id("job", url=server.url, token=token)
    newer = directory.parent / "step-9.bin"
    newer.write_bytes(b"9" * 100)
    spec = {"path": newer.name, "size": 100, "sha256": hashlib.sha256(b"9" * 100).hexdigest()}
    body = saved(run="job", step=9, location=str(newer), files=[spec], format="")
    assert api.post_events(token, body).status_code == 202
    validate_checkpoint(Checkpoint.objects.get(run__key="job", step=9).pk)
    assert lifeboat.latest_id("job", url=server.url, token=token) != chosen
    (directory / "rank1.bin").unlink()
    path = lifeboat.latest(
        "job", url=server.url, token=token, dest=tmp_path / "r", rank=1, world_size=2,
        checkpoint=chosen,
    )  # fmt: skip
    assert (path / "rank1.bin").read_bytes() == files["rank1.bin"]
    # The command does the same for a job script: rank 1's share of the chosen one.
    done = run_script(
        "import sys, lifeboat.cli; sys.exit(lifeboat.cli.main(['latest', 'job', '--rank', "
        f"'1', '--world-size', '2', '--checkpoint', '{chosen}', '--download', "
        f"{str(tmp_path / 'cli')!r}, '--quiet']))",
        {"LIFEBOAT_URL": server.url, "LIFEBOAT_TOKEN": token},
    )
    assert done.returncode == 0, done.stderr_text
    fetched = Path(done.stdout_text.strip())
    assert sorted(p.name for p in fetched.iterdir()) == ["index.json", "rank1.bin"]
    # An id that is not a verified checkpoint of this run is refused, never another one.
    body = saved(run="other", step=1, location=str(newer), files=[spec], format="")
    assert api.post_events(token, body).status_code == 202
    other = Checkpoint.objects.get(run__key="other")
    validate_checkpoint(other.pk)
    for wrong in (other.pk, chosen + 10_000):
        with pytest.raises(lifeboat.LatestError, match=f"no verified checkpoint {wrong}"):
            lifeboat.latest("job", url=server.url, token=token, checkpoint=wrong)
