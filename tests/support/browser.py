"""The browser tests' shared parts: the web server a module's tests share (`web`), a
`page`, screenshots (`shots`), people who sign in with a password, and a checkpoint whose file is
on disk. Loaded by tests/conftest.py (pytest_plugins); Chromium itself is the
`browser` fixture in tests/conftest.py."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.utils import timezone

from tests.support.servers import ROOT, WebServer
from webapp.domain.models import Checkpoint, CheckpointFile, Membership, Run

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def web(worker_env):
    server = WebServer(worker_env)
    yield server
    server.stop()


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture
def shots(request):
    """shots("name", page): a full-page screenshot in var/screenshots/<test name>/."""
    folder = ROOT / "var" / "screenshots" / request.node.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"\nscreenshots: {folder}")
    counter = iter(range(1, 100))

    def take(name: str, page) -> Path:
        path = folder / f"{next(counter):02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


def person(project, username: str, role: str):
    # The web server checks passwords with the production hashers (the test settings use
    # a fast MD5 one), so the hash is made with PBKDF2, at few iterations to stay quick.
    user = get_user_model().objects.create(
        username=username,
        password=PBKDF2PasswordHasher().encode(PASSWORD, "lifeboat-test-salt", iterations=1000),
    )
    Membership.objects.create(project=project, user=user, role=role)
    return user


def sign_in(page, web, username: str) -> None:
    page.goto(f"{web.url}/")
    assert "/accounts/login/" in page.url
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{web.url}/")


@pytest.fixture
def checkpoint_on_disk(project, tmp_path) -> Checkpoint:
    """A run with one checkpoint whose file really is on disk under an allowed root,
    reported but not yet checked (nothing queued: the test presses Validate)."""
    root = tmp_path / "ckpts"
    (root / "step-100").mkdir(parents=True)
    data = os.urandom(256 * 1024)
    (root / "step-100" / "model.bin").write_bytes(data)
    project.allowed_roots = [str(root)]
    project.save()
    now = timezone.now()
    run = Run.objects.create(
        project=project, key="llama/7b", name="Llama 7B", expected_interval_s=3600,
        started_at=now, last_seen_at=now, last_step=100, tags=["llama"],
    )  # fmt: skip
    checkpoint = Checkpoint.objects.create(
        project=project, run=run, step=100, epoch=1, saved_at=now, location=str(root / "step-100"),
        total_size=len(data), file_count=1, save_seconds=2.5, status="reported",
    )  # fmt: skip
    CheckpointFile.objects.create(
        checkpoint=checkpoint, path="model.bin", size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )  # fmt: skip
    return checkpoint
