"""A node-local checkpoint, checked, copied and deleted where its bytes are
(webapp/domain/validation/node_local.py, replication/host_legs.py, retention/host_deletion.py).

Three hosts are real Celery worker processes, each in a mount namespace of its own where
the checkpoints' folder is that host's own disk (a bind mount): a worker sees its host's
files and no other's, as on a cluster with node-local NVMe. A central worker on the plain
`validate` queue sees the folder empty. A real 4-rank DCP checkpoint (gloo) is spread over
the hosts as its ranks would have written it, and every rank reports its part; and a real
8-rank torchrun job runs each rank in its host's namespace, reporting its own part. Real
PostgreSQL (or SQLite), Redis, S3 and workers; nothing stands in for the thing under test."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
import torch

from bench import corpus as corpus_writer
from tests.support.celery_workers import start_worker, stop_worker
from tests.support.checkpoint_files import write_safetensors
from tests.support.client_scripts import RestartableServer
from tests.support.servers import ROOT, wait_for
from webapp.domain.health import live_workers, problems
from webapp.domain.models import (
    Checkpoint,
    Event,
    Replica,
    RetentionPolicy,
    StorageTarget,
    Validation,
    ValidationPart,
)
from webapp.domain.replication.restore import restore_replica
from webapp.domain.retention import policy as retention

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

RANKS = 4  # an 8-rank save takes 51 s to write here (spawned torch processes); 4 take half
HOSTS = ("node-0", "node-1", "node-2")


def host_of(rank: int) -> str:
    return HOSTS[rank % len(HOSTS)]


@pytest.fixture(scope="module")
def dcp_files(tmp_path_factory) -> Path:
    """A real DCP save by 4 ranks, written once for the module."""
    return corpus_writer.write("dcp", tmp_path_factory.mktemp("written"), 4 << 20, ranks=RANKS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, worker_env, dcp_files, s3_server):
    """The checkpoints' folder (empty here), each host's disk, and a worker per host that
    sees its own disk at that folder; a central worker that sees it empty. (No test here
    empties Redis while they run: that would drop the queues' bindings under them.)"""
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode
    ):
        pytest.fail("these tests need mount namespaces (unshare -m, as root; CI has them)")
    base = tmp_path_factory.mktemp("cluster")
    env = {
        **worker_env,
        "S3_ENDPOINT_URL": s3_server.endpoint,
        "S3_ACCESS_KEY_ID": s3_server.key,
        "S3_SECRET_ACCESS_KEY": s3_server.secret,
        # Files of 2 MiB and more are cut at their tensors (the DCP shards here are 1 MiB).
        "REPLICATION_PIECES_ABOVE": str(2 << 20),
    }
    shared = base / "ckpt"
    shared.mkdir()
    disks = {host: base / "disks" / host for host in HOSTS}
    workers = {}
    for host, disk in disks.items():
        disk.mkdir(parents=True)
        mount = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                 f'mount --bind "{disk}" "{shared}" && exec "$@"', "sh"]  # fmt: skip
        queues = f"validate.{host},replicate.{host}"
        workers[host] = start_worker(env, queues, base / f"{host}.log", name=host, prefix=mount)
    workers["central"] = start_worker(env, "validate,replicate", base / "central.log", "central")
    yield {"shared": shared, "disks": disks, "workers": workers, "base": base, "env": env}
    for process in workers.values():
        stop_worker(process)


def spread(cluster, dcp_files: Path, step: int) -> str:
    """Each rank's files on its host's disk, at the one location every rank reports."""
    location = f"{cluster['shared']}/run-1/step-{step}"
    for rank in range(RANKS):
        folder = cluster["disks"][host_of(rank)] / "run-1" / f"step-{step}"
        folder.mkdir(parents=True, exist_ok=True)
        names = [f"__{rank}_0.distcp"] + ([".metadata"] if rank == 0 else [])
        for name in names:
            shutil.copy2(dcp_files / name, folder / name)
    return location


def report_parts(api, token, dcp_files: Path, location: str, step: int, extra=None) -> None:
    """Each rank's part; `extra`: {rank: [file entries]} it reports besides its shard."""
    files = {f["path"]: f for f in corpus_writer.manifest(dcp_files)}
    events = []
    for rank in range(RANKS):
        names = [f"__{rank}_0.distcp"] + ([".metadata"] if rank == 0 else [])
        events.append(
            {
                "id": f"00000000-0000-4000-8000-{step:06d}{rank:06d}",
                "type": "checkpoint.saved",
                "run": "run-1",
                "time": "2026-12-03T10:00:00Z",
                "step": step,
                "location": location,
                "format": "dcp",
                "files": [files[n] for n in names] + (extra or {}).get(rank, []),
                "part": {"rank": rank, "world_size": RANKS, "host": host_of(rank)},
            }
        )
    answer = api.post_events(token, {"events": events})
    assert answer.status_code == 202, answer.content


@pytest.fixture
def node_local(project, cluster):
    project.allowed_roots = [str(cluster["shared"])]
    project.node_local = True
    project.save()
    return project


def settled(step: int, timeout: float = 90) -> Checkpoint:
    def done():
        checkpoint = Checkpoint.objects.get(step=step)
        return checkpoint if checkpoint.status not in ("reported", "verifying") else None

    try:
        return wait_for(done, timeout, interval=0.3)
    except AssertionError:
        parts = ValidationPart.objects.values("index", "host", "status", "finished_at", "result")
        checks = Validation.objects.values("status", "message", "finished_at", "files_total")
        raise AssertionError(f"not settled: {list(checks)} {list(parts)}"[:3000]) from None


def test_each_host_checks_its_own_part_and_the_checkpoint_is_verified(
    api, token, node_local, cluster, dcp_files
):
    location = spread(cluster, dcp_files, step=1)
    report_parts(api, token, dcp_files, location, step=1)
    checkpoint = settled(1)
    assert checkpoint.status == "verified", checkpoint.status_message
    # Its tensors were scanned, on their hosts: 4 ranks' shards of every weight.
    assert checkpoint.content["tensors"] > 0
    parts = list(ValidationPart.objects.order_by("index").values_list("host", "files", "worker"))
    assert parts[0] == ("node-0", [".metadata"], parts[0][2])  # rank 0's shared file first
    by_host = {host: (sorted(files), worker) for host, files, worker in parts[1:]}
    for host in HOSTS:
        shards = sorted(f"__{r}_0.distcp" for r in range(RANKS) if host_of(r) == host)
        assert by_host[host][0] == shards
        assert by_host[host][1].startswith(f"{host}@"), by_host  # taken by that host's worker
    assert parts[0][2].startswith("node-0@")
    # The central worker saw the folder empty, and read none of it.
    central = (cluster["base"] / "central.log").read_text()
    assert "validate_part[" not in central and "validate_checkpoint[" in central


def test_a_damaged_shard_on_one_host_is_named_with_its_host(
    api, token, node_local, cluster, dcp_files
):
    location = spread(cluster, dcp_files, step=2)
    shard = cluster["disks"]["node-2"] / "run-1" / "step-2" / "__2_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    report_parts(api, token, dcp_files, location, step=2)
    checkpoint = settled(2)
    assert checkpoint.status == "corrupt"
    findings = checkpoint.validations.get().findings
    bad = [f for f in findings if f.get("file") == "__2_0.distcp"]
    assert bad and "(on host node-2)" in bad[0]["message"], findings


def test_a_host_without_a_worker_is_a_problem_until_one_starts(
    api, token, node_local, cluster, dcp_files, settings, client, viewer
):
    settings.SWEEP_LOST_AFTER_S = 1
    stop_worker(cluster["workers"]["node-1"])
    location = spread(cluster, dcp_files, step=3)
    report_parts(api, token, dcp_files, location, step=3)
    # node-0 and node-2 check their parts; node-1's waits on its queue.
    wait_for(lambda: ValidationPart.objects.filter(finished_at__isnull=False).count() == 3, 60, 0.3)
    time.sleep(1.1)
    live_workers.refresh()
    found = [p["label"] for p in problems.summary(node_local.pk)]
    assert "no worker for host node-1" in found
    answer = api.get(token, "/workers")
    assert answer.json()["stranded"] == [
        {"host": "node-1", "queues": ["validate.node-1"], "waiting": 1}
    ]
    live = {q["queue"]: q["workers"] for q in answer.json()["queues"]}
    assert live["validate.node-0"][0].startswith("node-0@") and "validate.node-1" not in live
    assert len(live_workers.alert_stranded()) == 1
    # The runs page says it, and lists the workers alive per queue.
    client.force_login(viewer)
    page = client.get("/p/alpha/", {"problems": 1}, HTTP_HX_REQUEST="true").content.decode()
    assert "no worker for host node-1" in page
    assert "<code>validate.node-0</code></td><td>node-0@" in page
    assert Checkpoint.objects.get(step=3).status == "verifying"
    page = client.get(f"/p/alpha/checkpoints/{Checkpoint.objects.get(step=3).pk}/").content
    assert b"4 of 4 ranks reported" in page and b"node-1" in page

    mount = ["unshare", "-m", "--propagation", "private", "sh", "-c",
             f'mount --bind "{cluster["disks"]["node-1"]}" "{cluster["shared"]}" && exec "$@"',
             "sh"]  # fmt: skip
    cluster["workers"]["node-1"] = start_worker(
        cluster["env"], "validate.node-1,replicate.node-1", cluster["base"] / "node-1-again.log",
        "node-1", prefix=mount,
    )  # fmt: skip
    assert settled(3).status == "verified"
    live_workers.refresh()
    assert not [p for p in problems.summary(node_local.pk) if "no worker" in p["label"]]


def test_each_host_sends_and_later_deletes_its_own_share(
    api, token, node_local, cluster, dcp_files, s3
):
    StorageTarget.objects.create(
        project=node_local, name="main", bucket=s3.bucket, prefix="node-local",
        endpoint_url=s3.endpoint,
    )  # fmt: skip
    for step in (4, 5):
        report_parts(api, token, dcp_files, spread(cluster, dcp_files, step), step)
        assert settled(step).status == "verified"

    def copied(step):
        replica = Replica.objects.filter(checkpoint__step=step).first()
        return replica if replica and replica.is_final else None

    replica = wait_for(lambda: copied(4), 90, 0.3)
    assert replica.status == "verified", replica.last_error
    assert replica.legs == {host: "done" for host in HOSTS}
    assert replica.bytes_done == sum(f.size for f in replica.checkpoint.files.all())
    # Each host sent its own share; the central worker, which sees no file, wrote the
    # manifest once every share was confirmed.
    for host in HOSTS:  # (node-1's worker may have been started again: node-1-again.log)
        logs = "".join(p.read_text() for p in cluster["base"].glob(f"{host}*.log"))
        assert "replicate_leg[" in logs
    central = (cluster["base"] / "central.log").read_text()
    assert "replicate_leg[" not in central and "finish_legs[" in central
    client = boto3.client(
        "s3", endpoint_url=s3.endpoint, aws_access_key_id=s3.key,
        aws_secret_access_key=s3.secret, region_name="us-east-1",
    )  # fmt: skip
    body = client.get_object(Bucket=s3.bucket, Key=replica.manifest_key)["Body"].read()
    listed = {f["path"]: f["sha256"] for f in json.loads(body)["files"]}
    assert listed == {f["path"]: f["sha256"] for f in corpus_writer.manifest(dcp_files)}

    # Retention keeps the last one; step 4's local copy goes, each share on its host.
    assert wait_for(lambda: copied(5), 90, 0.3).status == "verified"
    RetentionPolicy.objects.create(project=node_local, applies_to="local", keep_last=1)
    retention.apply(node_local, actor="test")
    step4 = wait_for(lambda: Checkpoint.objects.filter(step=4, status="deleted").first(), 60, 0.3)
    assert step4.parts.filter(removed_at__isnull=True).count() == 0
    for host, disk in cluster["disks"].items():
        assert not (disk / "run-1" / "step-4").exists(), host
        assert (disk / "run-1" / "step-5").exists(), host
    assert Checkpoint.objects.get(step=5).status == "verified"


def test_each_hosts_small_files_go_in_packs_of_its_own(
    api, token, node_local, cluster, dcp_files, s3, tmp_path
):
    """40 small files a rank (its RNG and data-loader states, say): each host's leg packs
    its own, the row names where every file is, and the copy restores byte for byte."""
    target = StorageTarget.objects.create(
        project=node_local, name="packs", bucket=s3.bucket, prefix="node-packs",
        endpoint_url=s3.endpoint,
    )  # fmt: skip
    step, small = 6, {}
    location = spread(cluster, dcp_files, step)
    for rank in range(RANKS):
        folder = cluster["disks"][host_of(rank)] / "run-1" / f"step-{step}" / f"rank-{rank}"
        folder.mkdir()
        small[rank] = []
        for i in range(40):
            body = os.urandom(1000 + i)
            (folder / f"state-{i}.bin").write_bytes(body)
            small[rank].append({
                "path": f"rank-{rank}/state-{i}.bin", "size": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
            })  # fmt: skip
    report_parts(api, token, dcp_files, location, step, extra=small)
    assert settled(step).status == "verified"

    def copied():
        replica = Replica.objects.filter(checkpoint__step=step, target=target).first()
        return replica if replica and replica.is_final else None

    replica = wait_for(copied, 90, 0.3)
    assert replica.status == "verified", replica.last_error
    entries = {e["path"]: e for e in replica.files}
    packs_of = {host: set() for host in HOSTS}
    for rank, listed in small.items():
        for f in listed:
            assert "offset" in entries[f["path"]], entries[f["path"]]  # in a pack
            packs_of[host_of(rank)].add(entries[f["path"]]["key"])
    # Each host packed its own files: no pack holds two hosts' files.
    for host in HOSTS:
        assert packs_of[host] and all(
            not packs_of[host] & packs_of[other] for other in HOSTS if other != host
        ), packs_of
    restored = restore_replica(replica, tmp_path / "restored")
    assert len(restored) == len(replica.files)
    for listed in small.values():
        for f in listed:
            body = (tmp_path / "restored" / f["path"]).read_bytes()
            assert hashlib.sha256(body).hexdigest() == f["sha256"]


def test_each_hosts_large_files_are_cut_at_their_tensors(
    api, token, node_local, cluster, dcp_files, s3, tmp_path
):
    """A safetensors file a rank whose tensors stay but one (fine-tuning a frozen base):
    each host's leg cuts its own files, and the third copy sends only what changed (the
    run's first copy is whole, the second cuts to find out what cutting saves)."""
    target = StorageTarget.objects.create(
        project=node_local, name="cut", bucket=s3.bucket, prefix="node-cut",
        endpoint_url=s3.endpoint,
    )  # fmt: skip
    base = {f"layer{i}": torch.full((128 * 1024,), float(i)) for i in range(6)}  # 512 KiB each
    written = {}
    for step in (7, 8, 9):
        location = spread(cluster, dcp_files, step)
        extra = {}
        for rank in range(RANKS):
            path = cluster["disks"][host_of(rank)] / "run-1" / f"step-{step}" / f"{rank}.st"
            head = torch.full((128 * 1024,), float(step * 10 + rank))
            write_safetensors(path, {**base, "head": head})
            written[step, rank] = body = path.read_bytes()
            digest = hashlib.sha256(body).hexdigest()
            extra[rank] = [{"path": path.name, "size": len(body), "sha256": digest}]
        report_parts(api, token, dcp_files, location, step, extra=extra)
        assert settled(step).status == "verified"

    def copied(step):
        replica = Replica.objects.filter(checkpoint__step=step, target=target).first()
        return replica if replica and replica.is_final else None

    for step in (7, 8, 9):
        replica = wait_for(lambda step=step: copied(step), 90, 0.3)
        assert replica.status == "verified", replica.last_error
    large = [e for e in replica.files if e["path"].endswith(".st")]
    assert len(large) == RANKS and all("pieces" in e for e in large), large
    # Only each rank's changed tensor was sent: 4 of 28 tensors' bytes, and the metadata.
    assert replica.bytes_sent < sum(e["size"] for e in large) / 4, replica.bytes_sent
    restore_replica(replica, tmp_path / "restored")
    for rank in range(RANKS):
        assert (tmp_path / "restored" / f"{rank}.st").read_bytes() == written[9, rank]


# A rank of a torchrun job on "its host": in a mount namespace of its own where the
# checkpoint folder is that host's disk, with LIFEBOAT_HOST naming the host.
RANK_ON_ITS_HOST = """
export LIFEBOAT_HOST="node-$((RANK % 3))"
export LIFEBOAT_SPOOL_DIR="$SPOOLS/$LIFEBOAT_HOST"
exec unshare -m --propagation private sh -c \
  'mount --bind "$DISKS/$LIFEBOAT_HOST" "$SHARED" && exec "$@"' sh "$@"
"""


def test_an_8_rank_torchrun_job_on_3_hosts_is_checked_where_each_part_is(
    node_local, cluster, token, tmp_path
):
    """The whole path: FSDP with DCP under torchrun, 8 ranks (gloo), each rank in its
    host's namespace writing to that host's disk and reporting its own part
    (--report-parts); every part checked on its host."""
    web = RestartableServer(cluster["env"])
    web.start()
    wrapper = tmp_path / "rank_on_its_host.sh"
    wrapper.write_text(RANK_ON_ITS_HOST)
    env = {
        **os.environ,
        "LIFEBOAT_URL": web.url,
        "LIFEBOAT_TOKEN": token,
        "SPOOLS": str(tmp_path / "spools"),
        "DISKS": str(cluster["disks"]["node-0"].parent),
        "SHARED": str(cluster["shared"]),
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "8", "--no-python", "sh", str(wrapper),
               sys.executable, "examples/fsdp_dcp.py", "--run-name", "torchrun-8",
               "--report-parts", "--steps", "10",
               "--checkpoint-dir", str(cluster["shared"])]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        checkpoint = wait_for(
            lambda: Checkpoint.objects.filter(run__key="torchrun-8", status="verified").first(),
            90,
            0.3,
        )
    finally:
        web.stop()
    hosts = dict(checkpoint.parts.values_list("rank", "host"))
    assert hosts == {rank: f"node-{rank % 3}" for rank in range(8)}
    # Each host's disk holds only its ranks' shards, and each was checked there.
    for host, disk in cluster["disks"].items():
        written = sorted(p.name for p in (disk / "torchrun-8" / "step-000010").iterdir())
        ranks = [r for r in range(8) if f"node-{r % 3}" == host]
        assert written == sorted(
            [f"__{r}_0.distcp" for r in ranks] + ([".metadata"] if 0 in ranks else [])
        )
    # Each rank's part holds its own shard; the shared .metadata is rank 0's.
    files = dict(checkpoint.files.values_list("path", "rank"))
    assert files == {".metadata": 0, **{f"__{r}_0.distcp": r for r in range(8)}}
    # Rank 0 alone speaks for the run: one run.started, one run.finished, and the
    # metrics of one rank (each rank trains on its own slice, so its losses differ).
    types = list(Event.objects.filter(run__key="torchrun-8").values_list("type", flat=True))
    assert types.count("run.started") == types.count("run.finished") == 1
    assert types.count("checkpoint.saved") == 8
    losses: dict[int, set[float]] = {}
    for event in Event.objects.filter(run__key="torchrun-8", type="metrics"):
        for point in event.data["points"]:
            losses.setdefault(point["step"], set()).add(point["values"]["loss"])
    assert sorted(losses) == list(range(1, 11))
    assert all(len(values) == 1 for values in losses.values()), losses
    workers = dict(
        ValidationPart.objects.filter(validation__checkpoint=checkpoint)
        .exclude(result__phase=1)
        .values_list("host", "worker")
    )
    assert sorted(workers) == list(HOSTS)
    assert all(worker.startswith(f"{host}@") for host, worker in workers.items())
