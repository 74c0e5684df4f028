"""API tokens: stored only as a hash, scoped, and confined to their project."""

from __future__ import annotations

import hashlib

import pytest
from django.core.management import call_command
from django.db import connection

from tests.support.events import saved
from webapp.domain.models import ApiToken, Project, Run

pytestmark = pytest.mark.django_db


def test_a_token_is_stored_only_as_its_sha256(project):
    token, secret = project.issue_token("trainer", ["ingest"])
    assert secret.startswith("lb_") and len(secret) > 40
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    # The secret is nowhere in the table, not even in part beyond the display prefix.
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM domain_apitoken")
        rows = cursor.fetchall()
    dumped = repr(rows)
    assert secret not in dumped
    assert secret[len(token.prefix) :][:12] not in dumped


def test_scopes_must_be_known(project):
    with pytest.raises(ValueError):
        project.issue_token("bad", ["ingest", "root"])
    with pytest.raises(ValueError):
        project.issue_token("none", [])


def test_a_token_authenticates_and_records_its_use(project):
    token, secret = project.issue_token("trainer", ["ingest"])
    assert ApiToken.authenticate(secret) == token
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None
    assert ApiToken.authenticate(secret + "x") is None
    assert ApiToken.authenticate("Bearer " + secret) is None


def test_a_token_never_writes_another_projects_run(api, project, other_project):
    alpha = project.issue_token("a", ["ingest", "read"])[1]
    beta = other_project.issue_token("b", ["ingest", "read"])[1]
    api.post_events(alpha, saved(run="shared-key", step=1))
    api.post_events(beta, saved(run="shared-key", step=2))
    alpha_run = Run.objects.get(project=project, key="shared-key")
    beta_run = Run.objects.get(project=other_project, key="shared-key")
    assert list(alpha_run.checkpoints.values_list("step", flat=True)) == [1]
    assert list(beta_run.checkpoints.values_list("step", flat=True)) == [2]


def test_a_token_never_reads_another_projects_run(api, project, other_project):
    alpha = project.issue_token("a", ["ingest", "read"])[1]
    beta = other_project.issue_token("b", ["read"])[1]
    api.post_events(alpha, saved(run="secret-run", step=1))
    checkpoint_id = Run.objects.get(key="secret-run").checkpoints.get().pk
    for path in (
        "/runs/secret-run",
        "/runs/secret-run/checkpoints",
        "/runs/secret-run/latest",
        f"/checkpoints/{checkpoint_id}",
    ):
        response = api.get(beta, path)
        assert response.status_code == 404, path
        assert "error" in response.json()
    assert api.get(beta, "/runs").json()["runs"] == []


def test_create_project_prints_a_working_token_once(api, capsys):
    call_command(
        "create_project",
        "vision",
        "--root",
        "/data/vision",
        "--scopes",
        "ingest,read",
        "--token-name",
        "trainer",
    )
    out = capsys.readouterr().out
    secret = out.strip().splitlines()[-1]
    project = Project.objects.get(slug="vision")
    assert project.allowed_roots == ["/data/vision"]
    token = project.tokens.get()
    assert token.scopes == ["ingest", "read"]
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert api.post_events(secret, saved()).status_code == 202


def test_create_project_refuses_bad_roots_and_scopes():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="absolute path"):
        call_command("create_project", "x", "--root", "relative/dir")
    with pytest.raises(CommandError, match="unknown scopes"):
        call_command("create_project", "x", "--scopes", "ingest,root")
    assert not Project.objects.filter(slug="x").exists()


def test_a_cached_token_is_refused_as_soon_as_it_is_revoked(api, project):
    """The token cache saves a query per request, but a revocation in this process
    takes effect on the next request, not after the cache's lifetime."""
    token, secret = project.issue_token("trainer", ["ingest"])
    assert api.post_events(secret, saved(run="r", step=1)).status_code == 202  # cached
    token.revoke()
    response = api.post_events(secret, saved(run="r", step=2))
    assert response.status_code == 401
    assert response.json() == {"error": "unknown or revoked API token"}
