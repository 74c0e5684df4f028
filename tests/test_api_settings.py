"""A project's settings through the API: tokens, storage targets, launch profiles, alert
channels and members, for tokens with the `admin` scope, through the same actions as the
dashboard's settings pages (webapp.domain.actions). Each kind: the happy path, a
non-admin refused, hostile values refused with a clear 4xx, nothing secret in an answer
(the recovery settings, the badge key and the one audit path: test_api_settings_audit.py)."""

from __future__ import annotations

import pytest

from tests.support.api_settings import Admin, audit_lines, error_of
from tests.support.dashboard import make_checkpoint, make_run
from tests.support.people import member
from webapp.domain.models import (
    ApiToken,
    Event,
    LaunchProfile,
    Membership,
    Project,
    Replica,
    Resume,
    StorageTarget,
)
from webapp.domain.models.alerts import AlertChannel

pytestmark = pytest.mark.django_db


@pytest.fixture
def boss(project) -> Admin:
    return Admin(project)


# --- Tokens ---------------------------------------------------------------------------------


def test_an_admin_token_issues_lists_and_revokes_tokens_and_the_secret_is_shown_once(project, boss):
    made = boss.post("/tokens", {"name": "trainer", "scopes": ["ingest"]})
    assert made.status_code == 201, made.content
    body = made.json()
    secret = body["secret"]
    assert ApiToken.authenticate(secret).name == "trainer" and body["scopes"] == ["ingest"]
    assert body["prefix"] == secret[: len(body["prefix"])]
    listed = boss.get("/tokens")
    assert listed.status_code == 200
    assert {t["name"] for t in listed.json()} == {"boss", "trainer"}
    assert secret not in listed.content.decode() and "secret" not in listed.json()[0]
    revoked = boss.delete(f"/tokens/{body['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert ApiToken.authenticate(secret) is None
    assert [line[:2] for line in audit_lines(project)] == [
        ("token.created", "token:boss"),
        ("token.revoked", "token:boss"),
    ]
    assert secret not in str(list(Event.objects.values_list("message", "data")))


def test_a_token_name_in_use_is_409_and_a_token_cannot_revoke_itself(project, boss):
    assert boss.post("/tokens", {"name": "boss", "scopes": ["read"]}).status_code == 409
    itself = boss.delete(f"/tokens/{boss.token.pk}")
    assert itself.status_code == 409 and "cannot revoke itself" in error_of(itself)
    assert ApiToken.authenticate(boss.secret) is not None


def test_hostile_token_values_are_refused_naming_the_field(project, boss):
    long = boss.post("/tokens", {"name": "x" * 101, "scopes": ["read"]})
    assert long.status_code == 400 and error_of(long).startswith("body.name:")
    unknown = boss.post("/tokens", {"name": "x", "scopes": ["root"]})
    assert unknown.status_code == 400 and "scopes" in error_of(unknown)
    assert boss.post("/tokens", {"name": "x", "scopes": []}).status_code == 400
    assert boss.post("/tokens", {"name": "a\u0000b", "scopes": ["read"]}).status_code == 400
    assert ApiToken.objects.count() == 1 and not Event.objects.exists()


# --- Who may ---------------------------------------------------------------------------------

ROUTES = [
    ("get", "/tokens", None),
    ("post", "/tokens", {"name": "t", "scopes": ["read"]}),
    ("delete", "/tokens/1", None),
    ("get", "/storage-targets", None),
    ("post", "/storage-targets", {"name": "s", "bucket": "b"}),
    ("patch", "/storage-targets/1", {"name": "s"}),
    ("delete", "/storage-targets/1", None),
    ("get", "/launch-profiles", None),
    ("post", "/launch-profiles", {"name": "p", "command_template": "true"}),
    ("patch", "/launch-profiles/1", {"host": "h"}),
    ("delete", "/launch-profiles/1", None),
    ("get", "/alert-channels", None),
    ("post", "/alert-channels", {"name": "c", "kind": "email", "target": "a@example.com"}),
    ("patch", "/alert-channels/1", {"enabled": False}),
    ("delete", "/alert-channels/1", None),
    ("get", "/members", None),
    ("post", "/members", {"username": "ada", "role": "viewer"}),
    ("patch", "/members/1", {"role": "viewer"}),
    ("delete", "/members/1", None),
    ("get", "/recovery", None),
    ("patch", "/recovery", {"max_restarts": 1}),
    ("post", "/badge-key", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_a_token_without_the_admin_scope_gets_403_and_changes_nothing(project, method, path, body):
    every_other = Admin(project, scopes=("ingest", "read", "operate"), name="ops")
    response = every_other.call(method, path, body)
    assert response.status_code == 403 and "'admin' scope" in error_of(response)
    assert not Event.objects.exists()
    assert ApiToken.objects.count() == 1 and not StorageTarget.objects.exists()


def test_the_action_itself_refuses_a_caller_who_is_not_an_admin(project):
    """The route's scope check is not the only one: the action checks its caller."""
    from webapp.domain import actions

    operator = member(project, "otto", "operator")
    with pytest.raises(actions.NotAllowed):
        actions.create_token(actions.Caller.of_user(project, operator), "t", ["read"])
    token = project.issue_token("ops", ["operate"])[0]
    with pytest.raises(actions.NotAllowed):
        actions.create_target(actions.Caller.of_token(token), name="s", bucket="b")
    assert not Event.objects.exists() and not StorageTarget.objects.exists()


def test_rows_of_another_project_are_not_found(project, boss):
    other = Project.objects.create(name="Beta", slug="beta")
    target = StorageTarget.objects.create(project=other, name="s", bucket="b")
    token = other.issue_token("theirs", ["read"])[0]
    assert boss.patch(f"/storage-targets/{target.pk}", {"bucket": "x"}).status_code == 404
    assert boss.delete(f"/tokens/{token.pk}").status_code == 404
    assert StorageTarget.objects.get(pk=target.pk).bucket == "b"


# --- Storage targets ------------------------------------------------------------------------


def test_an_admin_token_adds_changes_and_deletes_a_storage_target(project, boss):
    made = boss.post(
        "/storage-targets",
        {"name": "backup", "bucket": "ckpts", "prefix": "/alpha/", "gb_month_price": 0.02},
    )
    assert made.status_code == 201, made.content
    target = made.json()
    assert target["prefix"] == "alpha" and target["enabled"] and target["policy"] == "all"
    changed = boss.patch(f"/storage-targets/{target['id']}", {"region": "eu-west-1"})
    assert changed.status_code == 200 and changed.json()["region"] == "eu-west-1"
    assert [t["name"] for t in boss.get("/storage-targets").json()] == ["backup"]
    gone = boss.delete(f"/storage-targets/{target['id']}")
    assert gone.json() == {"id": target["id"], "outcome": "deleted"}
    assert [line[0] for line in audit_lines(project)] == [
        "storage_target.created",
        "storage_target.changed",
        "storage_target.deleted",
    ]
    assert "changed: region" in audit_lines(project)[1][2]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest", "link-local"),
        ("http://10.0.0.5:9000", "private"),
        ("http://127.0.0.1:8333", "loopback"),
    ],
)
def test_a_storage_endpoint_on_an_internal_address_is_refused(project, boss, settings, url, why):
    settings.OUTBOUND_ALLOW = []
    refused = boss.post("/storage-targets", {"name": "s", "bucket": "b", "endpoint_url": url})
    assert refused.status_code == 400
    assert error_of(refused).startswith("body.endpoint_url:") and why in error_of(refused)
    assert not StorageTarget.objects.exists() and not Event.objects.exists()


def test_hostile_storage_target_values_are_refused(project, boss, settings):
    settings.S3_CREDENTIALS_REFS = {}
    long = boss.post("/storage-targets", {"name": "n" * 101, "bucket": "b"})
    assert long.status_code == 400 and error_of(long).startswith("body.name:")
    keys = boss.post("/storage-targets", {"name": "s", "bucket": "b", "credentials_ref": "ROOT"})
    assert keys.status_code == 400 and error_of(keys).startswith("body.credentials_ref:")
    url = boss.post("/storage-targets", {"name": "s", "bucket": "b", "endpoint_url": "nope"})
    assert url.status_code == 400 and error_of(url).startswith("body.endpoint_url:")
    assert boss.post("/storage-targets", {"name": "s", "bucket": "b"}).status_code == 201
    assert boss.post("/storage-targets", {"name": "s", "bucket": "c"}).status_code == 409


def test_a_target_with_replicas_keeps_its_place_and_is_disabled_not_deleted(project, boss):
    target = StorageTarget.objects.create(project=project, name="s", bucket="b")
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    Replica.objects.create(checkpoint=checkpoint, target=target, status="verified")
    moved = boss.patch(f"/storage-targets/{target.pk}", {"bucket": "elsewhere"})
    assert moved.status_code == 409 and "1 replicas are stored there" in error_of(moved)
    assert boss.delete(f"/storage-targets/{target.pk}").json()["outcome"] == "disabled"
    target.refresh_from_db()
    assert target.bucket == "b" and not target.enabled


# --- Launch profiles ------------------------------------------------------------------------


def test_an_admin_token_adds_changes_and_deletes_a_launch_profile(project, boss):
    made = boss.post(
        "/launch-profiles",
        {
            "name": "local",
            "command_template": "python train.py --resume {{checkpoint_path}}",
            "workdir": "/scratch/alpha",
            "env": {"WANDB_API_KEY": "very-secret"},
        },
    )
    assert made.status_code == 201, made.content
    profile = made.json()
    assert profile["env_names"] == ["WANDB_API_KEY"] and profile["workdir"] == "/scratch/alpha"
    assert "very-secret" not in made.content.decode()
    assert "very-secret" not in boss.get("/launch-profiles").content.decode()
    changed = boss.patch(f"/launch-profiles/{profile['id']}", {"env": {}, "kind": "slurm"})
    assert changed.status_code == 200 and changed.json()["env_names"] == []
    assert "changed: kind, env" in audit_lines(project)[-1][2]
    assert boss.delete(f"/launch-profiles/{profile['id']}").json()["outcome"] == "deleted"
    assert not LaunchProfile.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command_template": "bash -c '{{run_key}}'"}, "command_template"),
        ({"command_template": "echo $({{run_key}})"}, "command_template"),
        ({"command_template": "true", "env": {"LD_PRELOAD": "/tmp/x.so"}}, "options"),
        ({"command_template": "true", "workdir": "relative/dir"}, "workdir"),
        ({"command_template": "true", "name": "p" * 101}, "name"),
    ],
)
def test_hostile_launch_profiles_are_refused(project, boss, body, field):
    refused = boss.post("/launch-profiles", {"name": "p", **body})
    assert refused.status_code == 400 and error_of(refused).startswith(f"body.{field}:"), (
        refused.json()
    )
    assert not LaunchProfile.objects.exists()


def test_a_profile_that_a_resume_used_is_409_on_delete(project, boss):
    profile = LaunchProfile.objects.create(project=project, name="p", command_template="true")
    checkpoint = make_checkpoint(make_run(project, "r"), 10)
    Resume.objects.create(
        project=project, run=checkpoint.run, checkpoint=checkpoint, profile=profile
    )
    kept = boss.delete(f"/launch-profiles/{profile.pk}")
    assert kept.status_code == 409 and "1 resumes used it" in error_of(kept)


# --- Alert channels -------------------------------------------------------------------------


def test_an_admin_token_adds_changes_and_deletes_an_alert_channel(project, boss, settings):
    settings.OUTBOUND_ALLOW = []
    url = "https://hooks.example.com/services/T000/B000/very-secret-path"
    made = boss.post(
        "/alert-channels", {"name": "ops", "kind": "slack", "target": url, "kinds": ["run.failed"]}
    )
    assert made.status_code == 201, made.content
    channel = made.json()
    row = AlertChannel.objects.get()
    assert row.target == url and channel["target"] == "https://hooks.example.com/…"
    for answer in (made, boss.get("/alert-channels")):
        assert "very-secret-path" not in answer.content.decode()
        assert row.secret not in answer.content.decode()
    off = boss.patch(f"/alert-channels/{row.pk}", {"enabled": False, "name": "ops-2"})
    assert off.status_code == 200 and off.json()["enabled"] is False
    assert boss.delete(f"/alert-channels/{row.pk}").json()["outcome"] == "deleted"
    types = [line[0] for line in audit_lines(project)]
    assert types == ["alert_channel.created", "alert_channel.changed", "alert_channel.deleted"]
    assert "very-secret-path" not in str(audit_lines(project))


@pytest.mark.parametrize(
    ("kind", "target", "why"),
    [
        ("email", "https://hooks.example.com/x", "Not an e-mail address"),
        ("webhook", "ops@example.com", "http:// or https:// URL"),
        ("webhook", "http://169.254.169.254/latest/meta-data", "link-local"),
        ("json", "http://192.168.1.10/hook", "private"),
    ],
)
def test_a_channel_target_of_the_wrong_kind_or_internal_is_refused(
    project, boss, settings, kind, target, why
):
    settings.OUTBOUND_ALLOW = []
    refused = boss.post("/alert-channels", {"name": "c", "kind": kind, "target": target})
    assert refused.status_code == 400
    assert error_of(refused).startswith("body.target:") and why in error_of(refused)
    assert not AlertChannel.objects.exists() and not Event.objects.exists()


def test_an_unknown_channel_kind_or_alert_kind_is_refused(project, boss):
    kind = boss.post("/alert-channels", {"name": "c", "kind": "pager", "target": "x"})
    assert kind.status_code == 400 and error_of(kind).startswith("body.kind:")
    alerts = boss.post(
        "/alert-channels",
        {"name": "c", "kind": "email", "target": "a@example.com", "kinds": ["nope"]},
    )
    assert alerts.status_code == 400 and "kinds" in error_of(alerts)


# --- Members --------------------------------------------------------------------------------


def test_an_admin_token_adds_changes_and_removes_members(project, boss, admin):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("bea", password="pw")
    added = boss.post("/members", {"username": "bea", "role": "operator"})
    assert added.status_code == 201 and added.json()["role"] == "operator"
    pk = added.json()["id"]
    assert boss.patch(f"/members/{pk}", {"role": "admin"}).json()["role"] == "admin"
    assert {m["username"] for m in boss.get("/members").json()} == {"ada", "bea"}
    assert boss.delete(f"/members/{pk}").status_code == 200
    assert list(Membership.objects.values_list("user__username", flat=True)) == ["ada"]
    last = boss.patch(f"/members/{Membership.objects.get().pk}", {"role": "viewer"})
    assert last.status_code == 409 and "last admin" in error_of(last)
    ghost = boss.post("/members", {"username": "nobody", "role": "viewer"})
    assert ghost.status_code == 400 and "No active user" in error_of(ghost)
    assert Event.objects.filter(type="member.lookup_failed", actor="token:boss").exists()


@pytest.mark.parametrize("body", ["null", "{}"])
def test_a_change_that_sends_nothing_is_refused_not_answered_as_done(project, boss, body):
    target = StorageTarget.objects.create(project=project, name="s", bucket="b")
    response = boss.client.patch(
        f"/api/v1/settings/storage-targets/{target.pk}",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {boss.secret}",
    )
    assert response.status_code == 400 and "at least one field" in error_of(response)
    assert not Event.objects.exists()
