"""The two distributions built from this checkout: the client wheel installs alone into a
fresh venv (on the oldest Python it claims, when this machine has it), reports a real
checkpoint to a real server from there, and pulls in nothing of the server; the server
wheel depends on the client at exactly lifeboat.__version__, the one place it is written.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import lifeboat
from tests.support.servers import ROOT
from webapp.domain.models import Checkpoint

CLIENT = "lifeboat-ckpt-client"
SERVER = "lifeboat-ckpt-server"
# What a venv holds besides what was installed into it (ensurepip's own).
VENV_OWN = {"pip", "setuptools"}
# The client's requires-python (client/pyproject.toml) names this as the oldest.
OLDEST = "3.9"


def copy_sources(dest: Path, names: list[str]) -> Path:
    """A clean copy of parts of the checkout: a build from it cannot pick up stale files
    from an earlier build/ folder, and leaves nothing behind in the checkout."""
    for name in names:
        source = ROOT / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
            shutil.copytree(source, dest / name, ignore=ignore)
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def build_wheel(project: Path, out: Path) -> Path:
    """`pip wheel` with this environment's setuptools (the dev extra asks for the version
    the build-system table names): an isolated build would fetch it again, 5 s a wheel."""
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*command, "--quiet", "-w", str(out), "."],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def metadata(wheel: Path) -> list[tuple[str, str]]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(name).decode()
    headers = text.split("\n\n", 1)[0]
    return [tuple(line.split(": ", 1)) for line in headers.splitlines() if ": " in line]


def oldest_python() -> str:
    """Python OLDEST when this machine has one (PATH, or pyenv's versions), else ours."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{OLDEST}")]
    candidates += sorted(glob.glob(f"{pyenv}/versions/{OLDEST}.*/bin/python{OLDEST}"))
    for candidate in filter(None, candidates):
        # A pyenv shim is on PATH even where that version is not selected: it must run.
        works = subprocess.run([candidate, "-c", ""], capture_output=True, timeout=30)
        if works.returncode == 0:
            return candidate
    return sys.executable


def bare_env(**extra: str) -> dict:
    """This process's environment without what would let the venv see the checkout or
    another environment (PYTHONPATH, VIRTUAL_ENV, pyenv's version pin) or a server."""
    drop = ("PYTHON", "VIRTUAL_ENV", "PYENV_VERSION", "LIFEBOAT_", "DJANGO_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, **extra}


class Venv:
    def __init__(self, path: Path):
        self.path = path
        self.python = str(path / "bin" / "python")

    def run(self, *args: str, env: dict | None = None, cwd: Path | None = None):
        return subprocess.run(
            list(args),
            cwd=cwd or self.path,
            env=env or bare_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def script(self, code: str, env: dict | None = None):
        return self.run(self.python, "-c", textwrap.dedent(code), env=env)


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("client-build")
    source = copy_sources(tmp / "src", ["client/pyproject.toml", "client/README.md", "lifeboat"])
    return build_wheel(source / "client", tmp / "wheel")


@pytest.fixture(scope="module")
def client_venv(client_wheel, tmp_path_factory) -> Venv:
    """A fresh venv (no system site-packages) with the client wheel installed from the
    wheel alone: `--no-index` fails if the wheel asked for any other distribution."""
    path = tmp_path_factory.mktemp("client-venv") / "venv"
    made = subprocess.run(
        [oldest_python(), "-m", "venv", str(path)],
        env=bare_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    venv = Venv(path)
    installed = venv.run(venv.python, "-m", "pip", "install", "--no-index", str(client_wheel))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv


def test_the_client_wheel_holds_the_client_package_and_asks_for_nothing(client_wheel):
    fields = metadata(client_wheel)
    assert ("Name", CLIENT) in fields
    assert ("Version", lifeboat.__version__) in fields
    assert ("Requires-Python", f">={OLDEST}") in fields
    # Only the extras' lines, each under its extra: a bare install needs nothing.
    requires = [value for key, value in fields if key == "Requires-Dist"]
    assert requires and all("; extra ==" in line for line in requires), requires
    assert {v for k, v in fields if k == "Provides-Extra"} == {"torch", "lightning", "hf"}
    with zipfile.ZipFile(client_wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
        entry_points = next(n for n in archive.namelist() if n.endswith("entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    assert tops == {"lifeboat", f"lifeboat_ckpt_client-{lifeboat.__version__}.dist-info"}
    assert "lifeboat = lifeboat.cli:main" in scripts


def test_a_fresh_venv_holds_only_the_client_and_not_django(client_venv):
    listed = client_venv.script(
        """
        import importlib.metadata, json, sys
        import lifeboat
        names = sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions())
        print(json.dumps({"dists": names, "file": lifeboat.__file__, "prefix": sys.prefix,
                          "version": lifeboat.__version__, "python": sys.version}))
        """
    )
    assert listed.returncode == 0, listed.stderr
    seen = json.loads(listed.stdout)
    assert set(seen["dists"]) - VENV_OWN == {CLIENT}, seen
    # The installed copy, not the checkout's.
    assert seen["file"].startswith(seen["prefix"]) and seen["version"] == lifeboat.__version__
    print("client venv on Python", seen["python"])

    django = client_venv.script("import django")
    assert django.returncode != 0
    assert "No module named 'django'" in django.stderr

    helped = client_venv.run(str(client_venv.path / "bin" / "lifeboat"), "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: lifeboat")


@pytest.mark.django_db(transaction=True)
def test_the_installed_client_reports_a_checkpoint_to_a_real_server(
    client_venv, server, token, project, tmp_path
):
    root = tmp_path / "ckpts"
    root.mkdir()
    project.allowed_roots = [str(root)]
    project.save()
    checkpoint = root / "step-7.pt"
    checkpoint.write_bytes(os.urandom(200_000))

    reported = client_venv.script(
        """
        import json
        import lifeboat
        with lifeboat.Run("from-the-wheel", handle_signals=False) as run:
            event = run.checkpoint(CHECKPOINT, step=7).wait(30)
        print(json.dumps(event["files"]))
        """.replace("CHECKPOINT", repr(str(checkpoint))),
        env=bare_env(
            LIFEBOAT_URL=server.url,
            LIFEBOAT_TOKEN=token,
            LIFEBOAT_SPOOL_DIR=str(tmp_path / "spool"),
        ),
    )
    assert reported.returncode == 0, reported.stdout + reported.stderr
    digest = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert json.loads(reported.stdout) == [{"path": "step-7.pt", "size": 200_000, "sha256": digest}]
    stored = Checkpoint.objects.get(run__key="from-the-wheel", step=7)
    assert stored.location == str(checkpoint)
    assert [(f.size, f.sha256) for f in stored.files.all()] == [(200_000, digest)]


def test_the_server_wheel_depends_on_the_client_at_the_one_version(client_wheel, tmp_path):
    written = re.findall(
        r"^__version__ = \"(.+)\"$", (ROOT / "lifeboat" / "version.py").read_text(), re.M
    )
    assert written == [lifeboat.__version__]
    source = copy_sources(
        tmp_path / "src",
        ["pyproject.toml", "setup.py", "README.md", "lifeboat/version.py", "webapp", "workers"],
    )
    wheel = build_wheel(source, tmp_path / "wheel")
    fields = metadata(wheel)
    assert ("Name", SERVER) in fields
    assert ("Version", lifeboat.__version__) in fields
    pins = [v for k, v in fields if k == "Requires-Dist" and v.startswith(CLIENT)]
    assert f"{CLIENT}=={lifeboat.__version__}" in pins
    assert ("Version", lifeboat.__version__) in metadata(client_wheel)
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
    # The client's package ships once, in the client's wheel.
    assert "lifeboat" not in tops and {"webapp", "workers"} <= tops
