"""Every rank reports its own part of a checkpoint (lifeboat.Run(parts=True) or
LIFEBOAT_PARTS=1; docs/client.md, "Many ranks: every rank reports its part"), against a
live Lifeboat (gunicorn + a Celery validate worker): a rank other than 0 hashes only its
own files and says nothing of the run's life; a part survives its rank being killed.
FSDP under torchrun with 8 ranks, each reporting its part: tests/test_node_local.py."""

# ruff: noqa: F811 (the fixtures imported from tests/test_integrations.py are parameters here)

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lifeboat
import lifeboat.torch
from lifeboat.parts import own_files, part_host, rank_of_name
from tests.support.client_scripts import kill_while_hashing, run_script
from tests.support.client_stack import verified_steps
from tests.support.servers import ROOT
from webapp.domain.models import Checkpoint, Event

# The tests that talk to the live server (the pure ones below need no database).
live = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_by_rank(checkpoint) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for path, rank in checkpoint.files.order_by("path").values_list("path", "rank"):
        found.setdefault(rank, []).append(path)
    return found


def types_of(run_key: str) -> list[str]:
    return sorted(Event.objects.filter(run__key=run_key).values_list("type", flat=True))


def dcp_folder(folder: Path, world_size: int) -> Path:
    """A folder laid out as torch.distributed.checkpoint's FileSystemWriter lays it out:
    rank r's shards `__r_<n>.distcp`, the coordinator's `.metadata`."""
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"metadata" * 100)
    for rank in range(world_size):
        (folder / f"__{rank}_0.distcp").write_bytes(os.urandom(MIB + rank))
    (folder / "__2_1.distcp").write_bytes(os.urandom(1000))  # a second shard of rank 2
    return folder


# FSDP under torchrun with every rank reporting its part, verified as one, and rank 0
# alone speaking for the run: tests/test_node_local.py's 8-rank job on 3 hosts.


@live
def test_a_rank_other_than_0_hashes_only_its_own_files_and_reports_only_them(job_env, tmp_path):
    folder = dcp_folder(tmp_path / "ckpt" / "parts-unit" / "step-000100", world_size=4)
    env = {**job_env, "RANK": "2", "WORLD_SIZE": "4", "LIFEBOAT_PARTS": "1"}
    # Every file this process opens in the folder, as Python's audit hook sees it.
    job = run_script(
        f"""
        import json, os, sys
        opened = []
        def seen(event, args):
            path = args[0] if event == "open" else None
            path = os.fspath(path) if isinstance(path, os.PathLike) else path
            if isinstance(path, str) and "step-000100" in path:
                opened.append(path)
        sys.addaudithook(seen)
        import lifeboat
        with lifeboat.Run("parts-unit", handle_signals=False, heartbeat_s=0.1,
                          metrics_flush_s=0.1) as run:
            run.log(100, loss=0.25)
            run.heartbeat(step=100)
            event = run.checkpoint({str(folder)!r}, step=100, format="dcp").wait(30)
        print(json.dumps({{"event": event, "opened": sorted(set(opened))}}))
        """,
        env,
    )
    assert job.returncode == 0, job.stderr_text
    answer = json.loads(job.stdout_text)
    event = answer["event"]
    mine = ["__2_0.distcp", "__2_1.distcp"]
    assert answer["opened"] == [str(folder / name) for name in mine]
    assert event["part"] == {"rank": 2, "world_size": 4, "host": part_host()}
    assert event["location"] == str(folder)
    assert event["files"] == [
        {"path": name, "size": (folder / name).stat().st_size, "sha256": sha256(folder / name)}
        for name in mine
    ]
    assert event["metrics"] == {"loss": 0.25}

    # No run.started, heartbeat, metrics or run.finished from rank 2: its part only.
    assert types_of("parts-unit") == ["checkpoint.saved"]
    checkpoint = Checkpoint.objects.get(run__key="parts-unit", step=100)
    assert checkpoint.status == "saving"
    assert checkpoint.status_message == (
        "1 of 4 ranks reported their part; waiting for ranks 0, 1, 3"
    )
    assert files_by_rank(checkpoint) == {2: mine}


def test_which_files_are_a_ranks_own(tmp_path):
    folder = dcp_folder(tmp_path / "dcp", world_size=3)
    assert own_files(folder, 0) == (str(folder), [".metadata", "__0_0.distcp"])
    assert own_files(folder, 2) == (str(folder), ["__2_0.distcp", "__2_1.distcp"])
    assert own_files(folder / "__1_0.distcp", 1) == (str(folder), ["__1_0.distcp"])
    # Not there: taken for a file, so that hashing reports the save failed ("gone").
    assert own_files(folder / "never.pt", 1) == (str(folder), ["never.pt"])
    assert own_files(folder, 1, files=["b/x.bin", "a.bin", "a.bin"]) == (
        str(folder), ["a.bin", "b/x.bin"]
    )  # fmt: skip
    with pytest.raises(ValueError, match="named as a rank's for rank 5.*pass files="):
        own_files(folder, 5)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "model.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="pass files="):
        own_files(plain, 0)
    assert own_files(plain, 0, world_size=1) == (str(plain), ["model.bin"])  # alone: all
    for outside in (["../elsewhere.bin"], ["/etc/passwd"], [], "model.bin"):
        with pytest.raises(ValueError, match="files="):
            own_files(plain, 0, files=outside)


def test_the_names_writers_give_say_which_ranks_files_are_whose(tmp_path):
    # The HF Trainer's folder under FSDP's sharded state dict on 2 processes: the main
    # process writes everything but the other's RNG state and DCP shards.
    folder = tmp_path / "checkpoint-8"
    names = [
        "trainer_state.json", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth",
        "pytorch_model_fsdp_0/.metadata", "pytorch_model_fsdp_0/__0_0.distcp",
        "pytorch_model_fsdp_0/__1_0.distcp", "optimizer_0/.metadata",
        "optimizer_0/__0_0.distcp", "optimizer_0/__1_0.distcp",
    ]  # fmt: skip
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x")
    location, rank_1 = own_files(folder, 1)
    assert rank_1 == [
        "optimizer_0/__1_0.distcp", "pytorch_model_fsdp_0/__1_0.distcp", "rng_state_1.pth"
    ]  # fmt: skip
    _, rank_0 = own_files(folder, 0)
    assert sorted(rank_0 + rank_1) == sorted(names) and not set(rank_0) & set(rank_1)
    # DeepSpeed's ZeRO folder, and a job's own rank-<n> names (a folder names its files).
    deepspeed = tmp_path / "global_step20"
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                 "zero_pp_rank_1_mp_rank_00_optim_states.pt", "rank-1/model.pt"):  # fmt: skip
        (deepspeed / name).parent.mkdir(parents=True, exist_ok=True)
        (deepspeed / name).write_bytes(b"x")
    assert own_files(deepspeed, 1)[1] == [
        "rank-1/model.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    ]  # fmt: skip
    assert own_files(deepspeed, 0)[1] == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    ]  # fmt: skip
    # A name that only looks like one is nobody's: "ranking", "frank7".
    assert [rank_of_name(n) for n in ("ranking_2.json", "frank7.pt", "rank12.bin")] == [
        None, None, 12
    ]  # fmt: skip


def test_a_part_names_the_host_as_the_workers_queues_do(monkeypatch):
    assert part_host("node 7/gpu") == "node-7-gpu"  # what the contract takes
    assert part_host("-._x") == "x"
    monkeypatch.setenv("LIFEBOAT_HOST", "node-17")
    assert part_host() == "node-17"


@live
@pytest.mark.worker
def test_lifeboat_torch_save_on_every_rank_reports_what_each_wrote(job_env, tmp_path, monkeypatch):
    import torch

    for name in ("LIFEBOAT_URL", "LIFEBOAT_TOKEN", "LIFEBOAT_SPOOL_DIR"):
        monkeypatch.setenv(name, job_env[name])
    monkeypatch.setenv("WORLD_SIZE", "2")
    runs = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        runs.append(lifeboat.Run("torch-parts", handle_signals=False, parts=True).start())
    folder = tmp_path / "ckpt" / "torch-parts" / "step-5"
    reports = [
        lifeboat.torch.save({"w": torch.ones(8)}, folder / "rank-0.pt", step=5, run=runs[0]),
        lifeboat.torch.save(
            {"model.pt": {"w": torch.zeros(4)}, "optim.pt": {"lr": torch.tensor(0.1)}},
            f"{folder}/rank-1/", step=5, run=runs[1],
        ),
    ]  # fmt: skip
    events = [report.wait(30) for report in reports]
    for run in reversed(runs):
        run.finish()
    assert [e["part"]["rank"] for e in events] == [0, 1]
    assert {e["location"] for e in events} == {str(folder)}
    checkpoint = verified_steps("torch-parts", 1)[5]
    assert files_by_rank(checkpoint) == {
        0: ["rank-0.pt"],
        1: ["rank-1/model.pt", "rank-1/optim.pt"],
    }
    assert types_of("torch-parts").count("run.started") == 1


@live
def test_a_part_left_by_a_killed_rank_is_completed_by_lifeboat_flush(job_env, tmp_path):
    folder = tmp_path / "ckpt" / "parts-crash" / "step-300"
    (folder / "rank-0").mkdir(parents=True)
    (folder / "rank-0" / "shard.bin").write_bytes(b"rank 0" * 1000)
    (folder / "rank-1").mkdir()
    big = folder / "rank-1" / "shard.bin"
    chunk = os.urandom(MIB)
    with big.open("wb") as handle:
        for _ in range(192):
            handle.write(chunk)
    env = {**job_env, "RANK": "1", "WORLD_SIZE": "2", "LIFEBOAT_RUN": "parts-crash"}
    job = run_script(
        f"""
        import time, lifeboat
        run = lifeboat.Run(handle_signals=False, parts=True).start()
        run.checkpoint({str(folder)!r}, step=300, files=["rank-1/shard.bin"])
        time.sleep(120)
        """,
        env,
        wait=False,
    )
    kill_while_hashing(job, big)
    assert not Event.objects.filter(run__key="parts-crash").exists()

    flushed = subprocess.run(
        [sys.executable, "-m", "lifeboat", "flush", "--timeout", "30"],
        cwd=ROOT, env={k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE")},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert flushed.returncode == 0, flushed.stdout + flushed.stderr
    saved = Event.objects.get(run__key="parts-crash", type="checkpoint.saved")
    assert saved.data["part"] == {"rank": 1, "world_size": 2, "host": part_host()}
    assert saved.data["files"] == [
        {"path": "rank-1/shard.bin", "size": 192 * MIB, "sha256": sha256(big)}
    ]
    checkpoint = Checkpoint.objects.get(run__key="parts-crash", step=300)
    assert checkpoint.status_message.endswith("waiting for rank 0")
    assert files_by_rank(checkpoint) == {1: ["rank-1/shard.bin"]}


def torchrun_2(args: list[str], env: dict, timeout: float = 240) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         *args],
        cwd=ROOT, env={**env, "LIFEBOAT_PARTS": "1"}, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout


@live
@pytest.mark.worker
def test_the_hf_trainer_on_two_processes_reports_a_part_from_each(job_env, tmp_path):
    # examples/hf_trainer.py unchanged, under torchrun, with LIFEBOAT_PARTS=1: the main
    # process reports the Trainer's files and its RNG state, the other its own RNG state.
    torchrun_2(["examples/hf_trainer.py", "--run-name", "hf-parts", "--steps", "4",
                "--checkpoint-dir", str(tmp_path / "ckpt")], job_env)  # fmt: skip
    checkpoint = verified_steps("hf-parts", 1)[4]
    assert checkpoint.world_size == 2
    by_rank = files_by_rank(checkpoint)
    assert by_rank[1] == ["rng_state_1.pth"]
    assert {"rng_state_0.pth", "trainer_state.json", "model.safetensors"} <= set(by_rank[0])
    folder = tmp_path / "ckpt" / "hf-parts" / "checkpoint-4"
    assert sorted(by_rank[0] + by_rank[1]) == sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
    )
    assert types_of("hf-parts").count("run.started") == 1


@live
@pytest.mark.worker
def test_the_lightning_callback_on_two_ranks_reports_parts_of_a_folder_and_a_file_whole(
    job_env, tmp_path
):
    torchrun_2(["tests/support/jobs/lightning_parts_job.py", "pl-sharded",
                str(tmp_path / "ckpt" / "s"), "sharded"], job_env)  # fmt: skip
    steps = verified_steps("pl-sharded", 2)
    assert sorted(steps) == [2, 4]  # 2 epochs of 64 samples, batches of 16 on each of 2
    assert files_by_rank(steps[4]) == {0: ["rank-0.pt"], 1: ["rank-1.pt"]}
    assert steps[4].parts.count() == 2
    # DDP's .ckpt: rank 0 writes it alone, and reports it whole.
    torchrun_2(["tests/support/jobs/lightning_parts_job.py", "pl-file",
                str(tmp_path / "ckpt" / "f"), "file"], job_env)  # fmt: skip
    steps = verified_steps("pl-file", 2)
    assert steps[4].world_size is None and not steps[4].parts.exists()
    assert steps[4].location.endswith("epoch=1-step=4.ckpt")
    assert types_of("pl-file").count("run.started") == 1
