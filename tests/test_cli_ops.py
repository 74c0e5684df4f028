"""The operator's CLI (`python -m lifeboat runs|checkpoints|show|latest|validate|
restore-test|resume`) run as a process of its own against a live server (gunicorn), real
S3 (SeaweedFS) and a real Celery worker: its tables, its --json (the API's answer as it
came), its progress lines and its exit codes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.support.cli import cli_env, lifeboat
from tests.support.client_scripts import stop_while_hashing
from tests.support.events import event, saved
from tests.support.servers import ROOT, free_port, wait_for
from webapp.domain.models import Checkpoint, LaunchProfile, Replica

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stored(replicated):  # noqa: F811 (the fixture imported above)
    """A live server, and run "job" whose step-5 checkpoint (two files) is verified and
    has a verified replica in S3: (server, checkpoint, its directory, files)."""
    return replicated


def api_get(url: str, token: str, path: str) -> dict:
    request = urllib.request.Request(
        f"{url}/api/v1{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def columns(header: str, names: list[str]) -> dict[str, int]:
    return {name: header.index(name) for name in names}


def without_volatile(value):
    """An answer without what changes from one request to the next (presigned URLs,
    rates measured against the clock)."""
    if isinstance(value, dict):
        return {k: without_volatile(v) for k, v in value.items() if k not in ("url", "progress")}
    if isinstance(value, list):
        return [without_volatile(v) for v in value]
    return value


def test_runs_checkpoints_and_show_print_tables_and_the_apis_json(stored, token, tmp_path):
    server, checkpoint, _, files = stored
    hostile = "node\x1b]0;owned\x07-7"  # a job's host that would retitle the terminal
    status, _ = server.web.post_events(
        token, event("run.started", run="sweep/b", t=1, host=hostile)
    )
    assert status == 202
    env = cli_env(server.url, token, tmp_path)

    done = lifeboat(env, "runs")
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    at = columns(header, ["RUN", "STATUS", "STEP", "LAST SEEN", "HOST"])
    by_key = {row.split()[0]: row for row in rows}
    assert set(by_key) == {"job", "sweep/b"}
    assert by_key["job"][at["STATUS"] :].startswith("finished")
    assert by_key["sweep/b"][at["STATUS"] :].startswith("running")
    assert "ago" in by_key["job"][at["LAST SEEN"] : at["HOST"]]
    assert by_key["sweep/b"][at["HOST"] :] == "node?]0;owned?-7"  # no escape reaches the tty
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout

    done = lifeboat(env, "runs", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == api_get(server.url, token, "/runs")

    done = lifeboat(env, "checkpoints", "job")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.split() == ["ID", "STEP", "STATUS", "SIZE", "FILES", "SAVED", "VERIFIED", "PIN"]
    at = columns(header, ["ID", "STEP", "STATUS", "SIZE", "FILES", "SAVED"])
    size = sum(len(data) for data in files.values())  # 4,024,000 bytes
    assert row[at["STATUS"] :].startswith("verified")
    assert row[: at["STEP"] + len("STEP")].split() == [str(checkpoint.pk), "5"]
    assert row[at["STATUS"] : at["FILES"] + len("FILES")].split()[1:] == ["3.8", "MiB", "2"]
    assert size == 4_024_000
    done = lifeboat(env, "checkpoints", "job", "--json")
    assert json.loads(done.stdout) == api_get(server.url, token, "/runs/job/checkpoints")

    done = lifeboat(env, "show", str(checkpoint.pk))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith(f"checkpoint {checkpoint.pk} of run job, step 5\n")
    assert (
        "\nstatus    verified: All 2 files match their sha256" in text
        and "\nsize      3.8 MiB in 2 file(s)\n" in text
    )
    files_part = text.split("\nfiles:\n")[1].split("\n\n")[0].splitlines()
    assert files_part[0].split() == ["PATH", "SIZE", "SHA256"]
    sha = hashlib.sha256(files["model.bin"]).hexdigest()[:16]
    assert files_part[1].split() == ["model.bin", "2.9", "MiB", sha]
    replicas_part = text.split("\nreplicas:\n")[1].split("\n\n")[0].splitlines()
    assert replicas_part[1].split()[1:3] == ["backup", "verified"]
    checks_part = text.split("\nchecks:\n")[1].splitlines()
    assert checks_part[1].split()[1:3] == ["integrity", "passed"]
    done = lifeboat(env, "show", str(checkpoint.pk), "--json")
    shown = json.loads(done.stdout)
    assert without_volatile(shown) == without_volatile(
        api_get(server.url, token, f"/checkpoints/{checkpoint.pk}")
    )
    assert shown["replicas"][0]["files"][0]["url"].startswith("http")  # as the API sent it


def test_exit_codes_say_what_went_wrong(server, token, project, tmp_path):
    read_only = project.issue_token("reader", ["read"])[1]
    status, _ = server.web.post_events(token, event("checkpoint.started", run="r", step=3))
    assert status == 202
    never_saved = Checkpoint.objects.get(run__key="r", step=3)
    env = cli_env(server.url, token, tmp_path)

    for args in (["show", "999999"], ["checkpoints", "nobody"], ["latest", "nobody"]):
        done = lifeboat(env, *args)
        assert done.returncode == 3, (args, done.stderr)
        assert "(HTTP 404)" in done.stderr and done.stdout == ""
    assert "no checkpoint 999999" in lifeboat(env, "show", "999999").stderr

    done = lifeboat(env, "runs", "--json", "--token", "not-a-token")
    assert done.returncode == 6 and done.stdout == ""
    assert "unknown or revoked API token (HTTP 401)" in done.stderr
    done = lifeboat({**env, "LIFEBOAT_TOKEN": read_only}, "validate", str(never_saved.pk))
    assert done.returncode == 6 and "lacks the 'operate' scope" in done.stderr

    done = lifeboat(env, "validate", str(never_saved.pk))
    assert done.returncode == 1 and "(HTTP 409)" in done.stderr  # refused: never saved

    nobody = f"http://127.0.0.1:{free_port()}"
    done = lifeboat(env, "runs", "--url", nobody)
    assert done.returncode == 4 and f"the server at {nobody} is unreachable" in done.stderr

    # Not the API (a wrong URL): a page of HTML is not shown, its status line is.
    done = lifeboat(env, "runs", "--url", f"{server.url}/not-here")
    assert done.returncode == 3 and "HTTP 404 Not Found (HTTP 404)" in done.stderr
    assert "<" not in done.stderr

    done = lifeboat({k: v for k, v in env.items() if k != "LIFEBOAT_TOKEN"}, "runs")
    assert done.returncode == 2 and "no token" in done.stderr
    done = lifeboat(env, "show", "not-a-number")
    assert done.returncode == 2 and "invalid int value" in done.stderr


def test_latest_download_fetches_and_verifies_a_real_checkpoint(stored, s3, token, tmp_path):
    server, checkpoint, _, files = stored
    env = cli_env(server.url, token, tmp_path)
    target = tmp_path / "here"
    done = lifeboat(env, "latest", "job", "--download", str(target))
    assert done.returncode == 0, done.stderr
    path = target / "job" / f"checkpoint-{checkpoint.pk}"
    assert done.stdout == f"{path}\n"
    assert {name: (path / name).read_bytes() for name in files} == files
    progress = done.stderr.splitlines()[-1]  # "\r" reads as a line end in text mode
    assert progress.startswith("restoring from backup: 3.8 MiB / 3.8 MiB (100%)")
    assert "/s, ETA 0 s" in progress

    # Asked again: the whole copy is checked and kept, nothing is downloaded.
    done = lifeboat(env, "latest", "job", "--download", str(target), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["path"] == str(path) and answer["id"] == checkpoint.pk
    assert answer["files"] == api_get(server.url, token, "/runs/job/latest")["files"]
    assert "restoring" not in done.stderr

    # A replica whose bytes were changed in S3 is never handed over.
    replica = Replica.objects.get(checkpoint=checkpoint)
    entry = next(e for e in replica.files if e["path"] == "model.bin")
    s3.client.put_object(Bucket=s3.bucket, Key=entry["key"], Body=b"x" * len(files["model.bin"]))
    elsewhere = tmp_path / "elsewhere"
    done = lifeboat(env, "latest", "job", "--download", str(elsewhere), "--quiet")
    assert done.returncode == 1 and "model.bin does not match its sha256" in done.stderr
    assert done.stdout == "" and not any(elsewhere.rglob("model.bin"))


@pytest.mark.worker
def test_validate_wait_follows_a_real_worker_to_its_verdict(
    server, token, project, celery_worker, tmp_path
):
    root = tmp_path / "ckpts"
    big = root / "step-1" / "weights.dat"  # no load check: the hashing is what is followed
    big.parent.mkdir(parents=True)
    block = os.urandom(1024 * 1024)
    with big.open("wb") as handle:
        for _ in range(128):
            handle.write(block)
    project.allowed_roots = [str(root)]
    project.save()
    files = [{"path": "weights.dat", "size": big.stat().st_size,
              "sha256": hashlib.sha256(big.read_bytes()).hexdigest()}]  # fmt: skip
    body = saved(run="big", step=1, location=str(big.parent), files=files, format="")
    assert server.web.post_events(token, body)[0] == 202
    checkpoint = wait_for(
        lambda: Checkpoint.objects.filter(run__key="big", step=1, status="verified").first(), 60
    )
    env = cli_env(server.url, token, tmp_path)

    # Stopped in the middle of the check, the worker holds it at "running": the command
    # shows its bytes meanwhile, and its verdict once the worker goes on.
    with (tmp_path / "stderr").open("w+") as stderr:
        command = subprocess.Popen(
            [sys.executable, "-m", "lifeboat", "validate", str(checkpoint.pk), "--wait",
             "--interval", "0.1"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
        try:
            try:
                stop_while_hashing(celery_worker, big.resolve())
                line = wait_for(
                    lambda: (
                        "running: 0 B / 128.0 MiB (0%)" in (tmp_path / "stderr").read_text()
                        and (tmp_path / "stderr").read_text()
                    ),
                    30,
                )
            finally:
                os.kill(celery_worker.pid, signal.SIGCONT)  # harmless if it was not stopped
            out, _ = command.communicate(timeout=60)
        finally:
            if command.poll() is None:
                command.kill()
    assert command.returncode == 0, (tmp_path / "stderr").read_text()
    assert "of checkpoint" in line and "B/s, ETA" in line
    first, second = out.splitlines()
    assert (
        first.startswith("check ") and f"(integrity) of checkpoint {checkpoint.pk}: passed" in first
    )
    assert second == f"checkpoint {checkpoint.pk} (step 1) is verified"

    # One flipped byte, same size: only the sha256 tells. The check ends corrupt: 5.
    with big.open("r+b") as handle:
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 1]))
    started = time.monotonic()
    done = lifeboat(env, "validate", str(checkpoint.pk), "--wait", "--json", "--quiet")
    assert done.returncode == 5, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["kind"] == "integrity" and verdict["status"] == "failed"
    assert "sha256" in verdict["message"] and done.stderr == ""
    assert Checkpoint.objects.get(pk=checkpoint.pk).status == "corrupt"
    assert time.monotonic() - started < 60

    # Without --wait: what was queued, and at once.
    done = lifeboat(env, "validate", str(checkpoint.pk))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"checkpoint {checkpoint.pk}: ") and "queued" in done.stdout
    done = lifeboat(env, "validate", str(checkpoint.pk), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["checkpoint"] == checkpoint.pk


def test_restore_test_queues_names_its_check_and_times_out_waiting(stored, token, queues, tmp_path):
    server, checkpoint, _, _ = stored
    env = cli_env(server.url, token, tmp_path)
    done = lifeboat(env, "restore-test", str(checkpoint.pk), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["checkpoint"] == checkpoint.pk and answer["status"] == "queued"
    check = answer["validation"]

    done = lifeboat(env, "restore-test", str(checkpoint.pk))  # the same test, not a second
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"checkpoint {checkpoint.pk}: restore test {check} ")

    # No restore worker listens: --wait gives up after --timeout, with its own status.
    done = lifeboat(
        env, "restore-test", str(checkpoint.pk), "--wait", "--timeout", "1", "--interval", "0.2"
    )
    assert done.returncode == 7, done.stderr
    assert f"check {check} (restore) of checkpoint {checkpoint.pk}: queued, waiting" in done.stderr
    assert f"check {check} is still queued after 1 s" in done.stderr


def test_resume_queues_a_restart_with_a_launch_profile(stored, token, project, queues, tmp_path):
    server, checkpoint, _, _ = stored
    LaunchProfile.objects.create(
        project=project, name="again", kind="local", command_template="echo {{checkpoint_path}}"
    )
    env = cli_env(server.url, token, tmp_path)
    done = lifeboat(env, "resume", str(checkpoint.pk), "--profile", "again")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("resume ") and first.endswith(
        f"of run job from checkpoint {checkpoint.pk} with profile again: requested"
    )
    assert second.startswith("command: echo ")

    done = lifeboat(env, "resume", str(checkpoint.pk), "--profile", "again", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["profile"] == "again" and answer["checkpoint"] == checkpoint.pk

    done = lifeboat(env, "resume", str(checkpoint.pk), "--profile", "nope")
    assert done.returncode == 3 and "no launch profile 'nope'" in done.stderr
