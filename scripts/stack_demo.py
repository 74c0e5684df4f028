"""The demo that `make run` sets up (scripts/run_stack.py): the Django shell snippets
that create the superuser, the demo project's storage target and launch profile, the
look-up of which saved token this database knows, and the banner printed at each start
with a curl command that reports a small real checkpoint."""

from __future__ import annotations

import hashlib
import json
import shlex
import uuid
from datetime import UTC, datetime
from pathlib import Path

DEMO_PROJECT, DEMO_RUN = "demo", "demo-run"

CREATE_ADMIN = """
import os
from django.contrib.auth import get_user_model
User = get_user_model()
if User.objects.filter(username="admin").exists():
    print("existed")
else:
    User.objects.create_superuser("admin", "admin@localhost", os.environ["LB_ADMIN_PASSWORD"])
    print("created")
"""
CREATE_DEMO_TARGET = """
import os
from webapp.domain.models import Project, StorageTarget
project = Project.objects.filter(slug="demo").first()
if project is not None and not StorageTarget.objects.filter(project=project).exists():
    StorageTarget.objects.create(
        project=project, name="local-s3", bucket=os.environ.get("S3_BUCKET", "lifeboat"),
        prefix="replicas",
    )
"""
CREATE_DEMO_PROFILE = """
import os, shlex, sys
from webapp.domain.models import LaunchProfile, Project
project = Project.objects.filter(slug="demo").first()
if project is not None and not LaunchProfile.objects.filter(project=project).exists():
    python = shlex.quote(os.environ["LB_PYTHON"])
    profile = LaunchProfile(
        project=project, name="digits-local", kind="local",
        command_template=python + " examples/train_digits.py --run {{new_run_key}} "
        "--resume-from {{checkpoint_path}} --epochs 10",
        options={"workdir": os.environ["LB_ROOT"]},
    )
    profile.full_clean(); profile.save()  # the settings form's checks of the template
"""
FIND_DEMO_ACCESS = """
import os
from webapp.domain.models import ApiToken
known = [
    token for token in os.environ["LB_TOKENS"].split()
    if ApiToken.objects.filter(
        digest=ApiToken.digest_of(token), revoked_at__isnull=True
    ).exists()
]
print(known[0] if known else "none")
"""
# A user admin made before credentials.txt (e.g. in a shared DATABASE_URL) keeps its password.
ADMIN_EXISTED = "(unknown: user admin existed; set it with manage.py changepassword admin)"


def demo_checkpoint(var: Path) -> tuple[str, list[dict]]:
    """A small real checkpoint on disk, for the demo curl command to report."""
    folder = var / "checkpoints" / DEMO_RUN / "step-100"
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / "model.bin"
    if not weights.exists():
        weights.write_bytes(bytes(range(256)) * 64)
    data = weights.read_bytes()
    files = [{"path": weights.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    return str(folder), files


def banner(url: str, creds: dict[str, str], var: Path, credentials: Path) -> str:
    """What every start prints: where it runs, the secrets, a curl that reports a real
    checkpoint, and where to see it."""
    location, files = demo_checkpoint(var)
    event = {
        "id": str(uuid.uuid4()),
        "type": "checkpoint.saved",
        "run": DEMO_RUN,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "step": 100,
        "location": location,
        "files": files,
    }
    curl = [
        f"curl -sS -X POST {url}/api/v1/events",
        "-H " + shlex.quote(f"Authorization: Bearer {creds.get('token', '')}"),
        "-H 'Content-Type: application/json'",
        "-d " + shlex.quote(json.dumps(event)),
    ]
    rule = "=" * 78
    lines = [
        rule,
        f"Lifeboat is running at {url}   (Ctrl-C stops all of it)",
        f"  sign in as:     {creds.get('admin_user', 'admin')} / {creds.get('admin_password')}",
        f"  demo API token: {creds.get('token')}   (project {DEMO_PROJECT!r})",
        f"  secrets kept in {credentials}, logs in {var / 'log'}",
        "",
        "Report a checkpoint:",
        "  " + " \\\n    ".join(curl),
        "",
        f"then see it at {url}/p/{DEMO_PROJECT}/runs/{DEMO_RUN}/",
        rule,
    ]
    return "\n".join(lines)
