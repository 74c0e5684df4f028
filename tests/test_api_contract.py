"""The API's contract, checked from outside: schemathesis generates requests from
/api/v1/openapi.json (valid and invalid ones) and sends them to a live server
(gunicorn + uvicorn, as in production) with a token that has every scope, `admin`
included, so the /settings/ routes are exercised too (a token cannot revoke itself, so
it keeps its access throughout). Any server
error, any status the document does not declare for the operation, any answer that
does not match its declared schema fails the test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.events import saved
from tests.support.servers import ROOT, WebServer
from webapp.domain.models.projects import Scope

pytestmark = pytest.mark.django_db(transaction=True)


def test_schemathesis_finds_no_server_error_and_no_undocumented_status(
    project, token, worker_env, queues, tmp_path
):
    web = WebServer(worker_env)
    try:
        # Something to find: a run and a checkpoint (id 1 or near it).
        assert web.post_events(token, saved(run="r", step=1))[0] == 202
        every_scope = project.issue_token("contract", list(Scope.values))[1]
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "st"),
                "--config-file",
                str(ROOT / "tests" / "schemathesis.toml"),
                "--no-color",
                "run",
                f"{web.url}/api/v1/openapi.json",
                "--header",
                f"Authorization: Bearer {every_scope}",
                "--checks",
                "all",
                "--max-examples",
                "15",
                "--seed",
                "18",
                # One: hypothesis parses lambdas' source with ast, which CPython 3.11 does
                # not allow in two threads at once ("AST constructor recursion depth").
                "--workers",
                "1",
                "--request-timeout",
                "20",
            ],
            cwd=tmp_path,  # its .schemathesis/ cache stays out of the tree
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        web.stop()
    (tmp_path / "schemathesis.out").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout[-15000:] + result.stderr[-3000:]
