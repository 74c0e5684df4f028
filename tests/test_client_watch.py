"""`lifeboat watch`: every complete checkpoint reported once, never a half-written one."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

import lifeboat
from lifeboat.watch import Watcher, step_of
from tests.support.servers import wait_for
from webapp.domain.models import Checkpoint, Event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def root(tmp_path, project):
    root = tmp_path / "out"
    root.mkdir()
    project.allowed_roots = [str(root)]
    project.save()
    return root


def sidecar(server, token, tmp_path, key="watched") -> lifeboat.Run:
    return lifeboat.Run(
        key,
        url=server.url,
        token=token,
        spool_dir=tmp_path / "spool",
        lifecycle=False,
        enabled=True,
    ).start()


def reported(watcher: Watcher) -> list[tuple[str, int]]:
    events = watcher.poll()
    for item in events:
        item["report"].wait(30)
    return sorted((item["path"].rsplit("/", 1)[-1], item["step"]) for item in events)


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("epoch=3-step=1200.ckpt", 1200),
        ("checkpoint-500", 500),
        ("model_step_42.pt", 42),
        ("ckpt-iter-7.pth", 7),
        ("global_step300", 300),
        ("weights-000090.safetensors", 90),
        ("last.ckpt", None),
    ],
)
def test_it_reads_the_step_from_the_name(name, step):
    assert step_of(name) == step


def test_it_reports_each_complete_checkpoint_once_and_never_a_partial_one(
    server, token, root, tmp_path
):
    run = sidecar(server, token, tmp_path)
    watcher = Watcher(root, run, settle_s=0.6)

    # A torch file still being written: growing, so never quiet long enough.
    growing = root / "model_step_10.pt"
    stop = threading.Event()

    def write_slowly():
        with growing.open("wb") as handle:
            while not stop.is_set():
                handle.write(b"w" * 10_000)
                handle.flush()
                time.sleep(0.1)

    writer = threading.Thread(target=write_slowly)
    writer.start()
    # An HF checkpoint without trainer_state.json yet; a temporary name; a DCP directory.
    hf = root / "checkpoint-20"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"s" * 5000)
    (root / ".model_step_30.pt.tmp").write_bytes(b"t" * 100)
    (root / "model_step_40.pt.lifeboat-tmp-1234").write_bytes(b"t" * 100)
    dcp = root / "dcp" / "step_50"
    dcp.mkdir(parents=True)
    (dcp / "__0_0.distcp").write_bytes(b"d" * 4000)

    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        assert reported(watcher) == []
        time.sleep(0.2)

    stop.set()
    writer.join()
    (hf / "trainer_state.json").write_text("{}")
    (dcp / ".metadata").write_bytes(b"m")
    time.sleep(0.7)
    assert reported(watcher) == [
        ("checkpoint-20", 20),
        ("model_step_10.pt", 10),
        ("step_50", 50),
    ]
    time.sleep(0.7)
    assert reported(watcher) == []  # once only
    run.finish()

    stored = {c.step: c for c in Checkpoint.objects.filter(run__key="watched")}
    assert sorted(stored) == [10, 20, 50]
    files = {f.path: f for f in stored[10].files.all()}
    assert files["model_step_10.pt"].sha256 == hashlib.sha256(growing.read_bytes()).hexdigest()
    assert files["model_step_10.pt"].size == growing.stat().st_size
    assert sorted(f.path for f in stored[20].files.all()) == [
        "model.safetensors",
        "trainer_state.json",
    ]
    assert stored[50].format == "dcp"


def test_a_restarted_watcher_does_not_report_again_and_a_rewrite_is_new(
    server, token, root, tmp_path
):
    (root / "epoch=0-step=10.ckpt").write_bytes(b"a" * 1000)
    time.sleep(0.5)
    run = sidecar(server, token, tmp_path)
    assert reported(Watcher(root, run, settle_s=0.3)) == [("epoch=0-step=10.ckpt", 10)]
    # A second watcher (a restarted sidecar) with the same spool and run.
    assert reported(Watcher(root, run, settle_s=0.3)) == []
    # The job writes the same name again with other bytes: a new checkpoint.
    (root / "epoch=0-step=10.ckpt").write_bytes(b"b" * 1200)
    time.sleep(0.5)
    assert reported(Watcher(root, run, settle_s=0.3)) == [("epoch=0-step=10.ckpt", 10)]
    run.finish()
    saved = Event.objects.filter(run__key="watched", type="checkpoint.saved")
    assert saved.count() == 2
    assert Checkpoint.objects.get(run__key="watched", step=10).total_size == 1200


def test_with_the_world_size_each_nodes_watcher_reports_the_parts_of_its_ranks(
    server, token, root, tmp_path, monkeypatch
):
    # One DCP folder of a 3-rank job on node-local disks, as two nodes see it at the same
    # path: node-b holds ranks 1 and 2 (no .metadata: rank 0's coordinator writes it on
    # node-a). Each node's sidecar reports the parts of the ranks whose files it holds.
    folder = root / "step_70"
    folder.mkdir()
    for rank in (1, 2):
        (folder / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 3000)
    run = sidecar(server, token, tmp_path)
    monkeypatch.setenv("LIFEBOAT_HOST", "node-b")
    node_b = Watcher(root, run, settle_s=0.3, world_size=3)
    assert reported(node_b) == []  # not quiet yet: written just now
    time.sleep(0.4)
    events = node_b.poll()
    assert [e["report"].wait(30)["part"] for e in events] == [
        {"rank": 1, "world_size": 3, "host": "node-b"},
        {"rank": 2, "world_size": 3, "host": "node-b"},
    ]
    checkpoint = wait_for(
        lambda: Checkpoint.objects.filter(run__key="watched", step=70, parts__rank=2).first(), 20
    )
    assert checkpoint.status == "saving" and "0" in checkpoint.status_message

    for rank in (1, 2):  # node-a's view of the same path
        (folder / f"__{rank}_0.distcp").unlink()
    (folder / "__0_0.distcp").write_bytes(b"\0" * 3000)
    (folder / ".metadata").write_bytes(b"m" * 10)
    time.sleep(0.4)
    monkeypatch.setenv("LIFEBOAT_HOST", "node-a")
    node_a = Watcher(root, run, settle_s=0.3, world_size=3, state_path=tmp_path / "a.json")
    events = node_a.poll()
    assert [e["report"].wait(30)["part"]["rank"] for e in events] == [0]
    run.finish()
    wait_for(lambda: checkpoint.parts.filter(rank=0).exists(), 20)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "reported" and checkpoint.world_size == 3
    files = dict(checkpoint.files.values_list("path", "rank"))
    assert files == {".metadata": 0, "__0_0.distcp": 0, "__1_0.distcp": 1, "__2_0.distcp": 2}
    hosts = dict(checkpoint.parts.values_list("rank", "host"))
    assert hosts == {0: "node-a", 1: "node-b", 2: "node-b"}


def test_the_cli_watches_once_and_exits(server, token, root, tmp_path):
    from tests.support.client_scripts import run_script

    (root / "step-5.pt").write_bytes(b"z" * 777)
    time.sleep(0.3)
    done = run_script(
        f"import sys, lifeboat.cli; sys.exit(lifeboat.cli.main("
        f"['watch', {str(root)!r}, '--run', 'cli-run', '--once', '--settle', '0.2']))",
        {
            "LIFEBOAT_URL": server.url,
            "LIFEBOAT_TOKEN": token,
            "LIFEBOAT_SPOOL_DIR": str(tmp_path / "spool"),
        },
    )
    assert done.returncode == 0, done.stderr_text
    assert "reported" in done.stderr_text
    checkpoint = Checkpoint.objects.get(run__key="cli-run")
    assert (checkpoint.step, checkpoint.total_size) == (5, 777)
    # The sidecar does not speak for the job's life cycle.
    types = set(Event.objects.filter(run__key="cli-run").values_list("type", flat=True))
    assert types == {"checkpoint.saved"}
