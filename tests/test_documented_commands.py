"""The commands and snippets of the README and docs/*.md, run the documented way against a
live `make run` stack (tests/support/documented_stack.py): taken from the markdown files themselves,
so a doc cannot drift from the code. Issue 21, items 2 and 3."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import UTC, datetime

import boto3
import pytest

from tests.support.documented_stack import (
    BIN,
    ROOT,
    Stack,
    argv_of,
    documented,
    fenced_blocks,
    run_documented,
    users_environment,
)
from tests.support.servers import free_block

README = "README.md"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = Stack(tmp_path_factory.mktemp("stack-a")).wait_ready()
    yield running
    running.stop()


def get(base_url: str, path: str, token: str | None = None):
    request = urllib.request.Request(base_url + path)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
        return json.loads(answer.read())


def wait_verified(stack: Stack, run: str, step: int, timeout: float = 60) -> dict:
    token = stack.banner_value("demo API token")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for checkpoint in get(stack.url, f"/api/v1/runs/{run}/checkpoints", token)["checkpoints"]:
            if checkpoint["step"] == step and checkpoint["status"] == "verified":
                return checkpoint
        time.sleep(0.5)
    raise AssertionError(f"{run} step {step} was not verified within {timeout} s")


def report_checkpoint(stack: Stack, run: str, step: int) -> None:
    """A real file under the demo project's root, reported as a checkpoint of RUN."""
    folder = stack.var / "checkpoints" / run / f"step-{step}"
    folder.mkdir(parents=True)
    data = uuid.uuid4().bytes * 1024
    (folder / "model.bin").write_bytes(data)
    event = {
        "id": str(uuid.uuid4()),
        "type": "checkpoint.saved",
        "run": run,
        "time": datetime.now(UTC).isoformat(),
        "step": step,
        "location": str(folder),
        "files": [
            {"path": "model.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        ],
    }
    request = urllib.request.Request(
        f"{stack.url}/api/v1/events",
        data=json.dumps(event).encode(),
        headers={
            "Authorization": f"Bearer {stack.banner_value('demo API token')}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        assert response.status == 202


def test_settings_file_is_private_and_names_the_stack(stack):
    settings = (stack.var / "lifeboat.env").read_text()
    assert (stack.var / "lifeboat.env").stat().st_mode & 0o777 == 0o600
    assert f"SITE_URL={stack.url}\n" in settings
    assert f"REDIS_URL=redis://127.0.0.1:{stack.ports['LIFEBOAT_REDIS_PORT']}/0" in settings
    assert "SECRET_KEY=" in settings


def test_readme_create_project_joins_the_running_stack(stack):
    (command,) = documented(README, ".venv/bin/python manage.py create_project")
    result = run_documented(command, stack.var)  # as written: /data/checkpoints need not exist
    assert result.returncode == 0, result.stderr
    token = next(w for w in result.stdout.split() if w.startswith("lb_"))
    # The token works against the live server: the command wrote the stack's database.
    assert get(stack.url, "/api/v1/runs", token) is not None


def test_a_command_without_make_run_says_what_is_missing(tmp_path):
    (command,) = documented(README, ".venv/bin/python manage.py create_project")
    result = run_documented(command, tmp_path / "never-ran")
    assert result.returncode != 0
    assert "run `make run` once in this checkout" in result.stderr
    assert "or set SECRET_KEY" in result.stderr
    assert "Traceback" not in result.stderr


def test_deployment_node_local_project(stack):
    """docs/deployment.md's node-local recipe: the project is created node-local."""
    (command,) = documented("docs/deployment.md", ".venv/bin/python manage.py create_project")
    result = run_documented(command, stack.var)
    assert result.returncode == 0, result.stderr
    assert "checkpoints on node-local storage" in result.stdout


def test_deployment_migrate(stack):
    commands = documented("docs/deployment.md", ".venv/bin/python manage.py migrate")
    for command in set(commands):
        result = run_documented(command, stack.var)
        assert result.returncode == 0, result.stderr
        assert "No migrations to apply" in result.stdout


def test_retention_dry_run_of_the_docs(stack):
    # A policy as an admin sets it in the project's settings.
    policy = (
        "from webapp.domain.models import Project, RetentionPolicy\n"
        "RetentionPolicy.objects.get_or_create(project=Project.objects.get(slug='demo'),"
        " applies_to='local', defaults={'keep_last': 1})"
    )
    created = run_documented(
        f".venv/bin/python manage.py shell -c {shlex.quote(policy)}", stack.var
    )
    assert created.returncode == 0, created.stderr
    commands = documented("docs/replication.md", ".venv/bin/python manage.py retention")
    dry_runs = [c for c in commands if "--apply" not in c]
    # The plain dry run, --limit 0 (every decision) and --json.
    assert len(dry_runs) == 3, dry_runs
    for command in dry_runs:
        result = run_documented(command, stack.var)
        assert result.returncode == 0, result.stdout + result.stderr
        if "--json" in command:
            json.loads(result.stdout)


def test_readme_tour_step_4_validates_its_own_checkpoint(stack):
    """Step 2's curl (pasted from the banner), then step 4's commands, with the banner's
    token, on a database where checkpoint 1 is another run's."""
    token = stack.banner_value("demo API token")
    # Another run's checkpoint first: on this database checkpoint 1 is not the tour's.
    another = re.sub(r'"id": "[^"]+"', f'"id": "{uuid.uuid4()}"', stack.banner_curl())
    other = subprocess.run(
        ["bash", "-c", another.replace("demo-run", "another-run")],
        text=True,
        capture_output=True,
        check=True,
    )
    assert json.loads(other.stdout)["created"] == 1
    pasted = subprocess.run(["bash", "-c", stack.banner_curl()], capture_output=True, text=True)
    assert json.loads(pasted.stdout)["accepted"] == 1, pasted.stdout + pasted.stderr
    checkpoint = wait_verified(stack, "demo-run", 100)
    step4 = [b for b in fenced_blocks(README, "bash") if "/validate" in b]
    assert len(step4) == 1
    script = step4[0].replace("http://127.0.0.1:8000", stack.url)
    script = script.replace("var/", f"{stack.var}/").replace(".venv/bin/", f"{BIN}/")
    result = subprocess.run(
        ["bash", "-ec", f"TOKEN={token}\n{script}"], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["checkpoint"] == checkpoint["id"]
    deadline = time.monotonic() + 60
    while get(stack.url, f"/api/v1/checkpoints/{checkpoint['id']}", token)["status"] != "corrupt":
        assert time.monotonic() < deadline, "the damaged checkpoint was not found corrupt"
        time.sleep(0.5)


def test_client_snippets_run_against_a_live_server(stack):
    """Every complete python block of docs/client.md (those without `...`), in order, in
    one directory under the demo project's root."""
    blocks = [b for b in fenced_blocks("docs/client.md", "python") if "..." not in b]
    assert len(blocks) >= 2
    workdir = stack.var / "checkpoints"
    env = users_environment(
        stack.var,
        LIFEBOAT_URL=stack.url,
        LIFEBOAT_TOKEN=stack.banner_value("demo API token"),
        LIFEBOAT_SPOOL_DIR=str(stack.var / "client-spool"),
    )
    for number, block in enumerate(blocks):
        if "lifeboat.latest(" in block:
            wait_verified(stack, "linear-lr0.1", 300)
        result = subprocess.run(
            [str(BIN / "python"), "-c", block],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, (
            f"block {number} of docs/client.md:\n{block}\n{result.stderr}"
        )
    token = stack.banner_value("demo API token")
    steps = [
        c["step"]
        for c in get(stack.url, "/api/v1/runs/linear-lr0.1/checkpoints", token)["checkpoints"]
    ]
    assert steps == [300, 200, 100]
    assert "resuming from" in result.stdout


def test_slurm_launch_worker_gives_its_jobs_the_server(stack, slurm_cluster, tmp_path):  # noqa: F811
    """docs/slurm.md's launch worker, started as written beside the stack: a resume with a
    slurm profile pinned to its host runs as a real Slurm job that reaches the server with
    the LIFEBOAT_URL and LIFEBOAT_TOKEN it was given."""
    (command,) = documented("docs/slurm.md", ".venv/bin/celery -A workers worker")
    answer = tmp_path / "answer.json"
    profile = (
        "from webapp.domain.models import LaunchProfile, Project\n"
        "p = LaunchProfile(project=Project.objects.get(slug='demo'), name='slurm-login1',"
        " kind='slurm', host='login1', command_template="
        f'\'curl -sf -H "Authorization: Bearer $LIFEBOAT_TOKEN" "$LIFEBOAT_URL/api/v1/runs"'
        f" -o {answer}')\n"
        "p.full_clean(); p.save()"
    )
    created = run_documented(
        f".venv/bin/python manage.py shell -c {shlex.quote(profile)}", stack.var
    )
    assert created.returncode == 0, created.stderr
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        argv_of(command),
        cwd=ROOT,
        env=users_environment(stack.var),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        process_group=0,
    )
    try:
        report_checkpoint(stack, "slurm-source", 7)
        checkpoint = wait_verified(stack, "slurm-source", 7)
        request = urllib.request.Request(
            f"{stack.url}/api/v1/checkpoints/{checkpoint['id']}/resume",
            data=json.dumps({"profile": "slurm-login1"}).encode(),
            headers={
                "Authorization": f"Bearer {stack.banner_value('demo API token')}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            assert response.status == 202
        deadline = time.monotonic() + 90
        while not answer.exists() or not answer.read_text():
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.5)
        assert "runs" in json.loads(answer.read_text())
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()


def test_two_stacks_side_by_side(stack, tmp_path_factory):
    """A second `make run`, other ports and var dir, beside the first: both answer, each
    with its own Redis, S3 and settings file; none of them on SeaweedFS's default ports."""
    second = Stack(tmp_path_factory.mktemp("stack-b")).wait_ready()
    try:
        for each in (stack, second):
            assert get(each.url, "/api/v1/runs", each.banner_value("demo API token")) is not None
            s3 = boto3.client(
                "s3",
                endpoint_url=f"http://127.0.0.1:{each.ports['LIFEBOAT_S3_PORT']}",
                region_name="us-east-1",
                aws_access_key_id="lifeboat",
                aws_secret_access_key="lifeboat-secret",
            )
            s3.head_bucket(Bucket="lifeboat")
            settings = (each.var / "lifeboat.env").read_text()
            assert f"S3_ENDPOINT_URL=http://127.0.0.1:{each.ports['LIFEBOAT_S3_PORT']}" in settings
        assert stack.banner_value("demo API token") != second.banner_value("demo API token")
    finally:
        second.stop()
    assert second.proc.returncode == 0
    assert get(stack.url, "/api/v1/runs", stack.banner_value("demo API token")) is not None


def test_the_environment_wins_over_the_settings_file(tmp_path):
    (tmp_path / "lifeboat.env").write_text(
        "# written by make run\nDEBUG=1\nSITE_URL=http://from-the-file:1\nMETRICS_PUBLIC=1\n"
    )
    show = ".venv/bin/python manage.py shell -c " + shlex.quote(
        "from django.conf import settings; print(settings.SITE_URL, settings.METRICS_PUBLIC)"
    )
    from_file = run_documented(show, tmp_path)
    assert from_file.stdout.splitlines()[-1].split() == ["http://from-the-file:1", "True"], (
        from_file.stderr
    )
    env = users_environment(tmp_path, SITE_URL="http://from-the-environment:2")
    exported = subprocess.run(argv_of(show), cwd=ROOT, env=env, capture_output=True, text=True)
    assert exported.stdout.splitlines()[-1].split() == ["http://from-the-environment:2", "True"]
    off = subprocess.run(
        argv_of(show),
        cwd=ROOT,
        env=env | {"LIFEBOAT_ENV_FILE": "off"},
        capture_output=True,
        text=True,
    )
    assert "SECRET_KEY must be set" in off.stderr  # DEBUG came from the file, now unset


def test_deployment_web_line_serves_the_stacks_database(stack):
    """docs/deployment.md's gunicorn line beside the stack (on a free port): the same
    database, so the banner's token works on it."""
    (command,) = documented("docs/deployment.md", ".venv/bin/gunicorn webapp.asgi")
    port = free_block(1)
    argv = argv_of(command, **{"0.0.0.0:8000": f"127.0.0.1:{port}", "2": "1"})
    web = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=users_environment(stack.var),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        process_group=0,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert web.poll() is None, web.stderr.read()
            try:
                runs = get(
                    f"http://127.0.0.1:{port}", "/api/v1/runs", stack.banner_value("demo API token")
                )
                break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn did not answer"
                time.sleep(0.5)
        assert runs is not None
    finally:
        web.terminate()
        try:
            web.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(web.pid, signal.SIGKILL)
            web.wait()


def test_manage_py_under_a_python_without_django_says_which_to_use():
    # -S: no site-packages, as the system's python3 on a fresh machine.
    result = subprocess.run(
        [sys.executable, "-S", "manage.py", "check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "Django cannot be imported" in result.stderr
    assert ".venv/bin/python manage.py" in result.stderr


def test_make_runs_database_url_reaches_the_commands(tmp_path):
    """What make run chose is saved, and only that: a DATABASE_URL of the stack sends a
    later command to the same PostgreSQL."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from stack_settings import save_settings
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    chosen = {
        "DEBUG": "1",
        "SECRET_KEY": "k" * 50,
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
        "HOME": "/not/a/setting",
    }
    path = save_settings(tmp_path, chosen)
    assert "DATABASE_URL=postgres://" in path.read_text()
    assert "HOME" not in path.read_text()
    show = ".venv/bin/python manage.py shell -c " + shlex.quote(
        "from django.db import connection; print(connection.vendor)"
    )
    result = run_documented(show, tmp_path)
    assert result.stdout.splitlines()[-1] == "postgresql", result.stderr


def test_make_run_serves_pages_as_production_does(stack):
    """DEBUG off: a missing page is the app's own 404 (no URL patterns listed), static
    files (the favicon, uPlot, Swagger UI) come from the app, and the sign-in page works
    over make run's plain http (its cookies are not secure-only)."""
    import urllib.error

    settings = (stack.var / "lifeboat.env").read_text()
    assert "DEBUG=0\n" in settings and "SECURE_COOKIES=0\n" in settings
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{stack.url}/no-such-page/", timeout=10)  # noqa: S310
    page = missing.value.read().decode()
    assert missing.value.code == 404 and "Back to your projects" in page
    assert "URLconf" not in page and "DEBUG = True" not in page
    for path in (
        "/favicon.ico",
        "/static/vendor/uplot/uPlot.iife.min.js",
        "/static/ninja/swagger-ui-bundle.js",
    ):
        with urllib.request.urlopen(stack.url + path, timeout=10) as answer:  # noqa: S310
            assert answer.status == 200, path
    with urllib.request.urlopen(f"{stack.url}/api/v1/docs", timeout=10) as answer:  # noqa: S310
        assert "https://" not in answer.read().decode()
    with urllib.request.urlopen(f"{stack.url}/accounts/login/", timeout=10) as answer:  # noqa: S310
        assert "; secure" not in (answer.headers.get("Set-Cookie") or "").lower()
