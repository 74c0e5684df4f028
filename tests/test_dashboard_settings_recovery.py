"""The dashboard's Alerts and Recovery settings: who may change them, channels checked
by kind, each change audited, and the alerts page's flips with every attempt.
(tests/test_dashboard_recovery.py: restore tests, resumes and the run page.)"""

from __future__ import annotations

import json

import pytest

from tests.support.dashboard import as_user, make_run, profile
from webapp.domain.models import AlertChannel, Event
from webapp.domain.models.alerts import Flip, Notification

pytestmark = pytest.mark.django_db


# --- Settings: alerts -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["alerts", "recovery"])
def test_alert_and_recovery_settings_are_for_admins_only(project, viewer, operator, admin, path):
    url = f"/p/alpha/settings/{path}/"
    assert as_user(viewer).get(url).status_code == 403
    assert as_user(operator).get(url).status_code == 403
    assert as_user(admin).get(url).status_code == 200
    assert as_user(operator).post(url, {"name": "x", "max_restarts": 1}).status_code == 403
    assert not AlertChannel.objects.exists() and not Event.objects.exists()


def test_an_admin_adds_a_webhook_and_an_email_channel(project, admin):
    client = as_user(admin)
    response = client.post(
        "/p/alpha/settings/alerts/",
        {"name": "ops", "kind": "webhook", "target": "https://hooks.example.com/x",
         "kinds": ["run.overdue", "run.failed"]},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()
    response = client.post(
        "/p/alpha/settings/alerts/",
        {"name": "mail", "kind": "email", "target": " a@example.com ,b@example.org"},
    )
    assert response.status_code == 302, response.content.decode()
    ops, mail = AlertChannel.objects.order_by("name").reverse()
    assert ops.kinds == ["run.overdue", "run.failed"] and ops.enabled
    assert mail.target == "a@example.com, b@example.org" and mail.kinds == []
    audit = Event.objects.filter(type="alert_channel.created").order_by("id")
    assert [e.actor for e in audit] == ["user:ada", "user:ada"]
    page = client.get("/p/alpha/settings/alerts/").content.decode()
    assert "https://hooks.example.com/x" in page and "every kind" in page


@pytest.mark.parametrize(
    ("kind", "target", "error"),
    [
        ("webhook", "ftp://example.com/hook", "http:// or https:// URL"),
        ("webhook", "javascript:alert(1)", "http:// or https:// URL"),
        ("webhook", "https:///no-host", "http:// or https:// URL"),
        ("email", "a@example.com, not-an-address", "Not an e-mail address: not-an-address"),
        ("email", " , ", "Give at least one e-mail address"),
    ],
)
def test_a_channel_target_must_fit_its_kind(project, admin, kind, target, error):
    response = as_user(admin).post(
        "/p/alpha/settings/alerts/", {"name": "x", "kind": kind, "target": target}
    )
    assert response.status_code == 200 and error in response.content.decode()
    assert not AlertChannel.objects.exists() and not Event.objects.exists()


def test_a_second_channel_with_the_same_name_is_refused_with_a_message(project, admin):
    AlertChannel.objects.create(project=project, name="ops", kind="webhook", target="https://a/")
    response = as_user(admin).post(
        "/p/alpha/settings/alerts/", {"name": "ops", "kind": "webhook", "target": "https://b/"}
    )
    assert response.status_code == 200 and "already has this name" in response.content.decode()


def test_an_admin_disables_and_enables_a_channel_with_an_audit_entry_each(
    project, other_project, admin, operator
):
    channel = AlertChannel.objects.create(
        project=project, name="ops", kind="webhook", target="https://a/"
    )
    client = as_user(admin)
    url = f"/p/alpha/settings/alerts/{channel.pk}/enabled/"
    assert as_user(operator).post(url, {"enabled": "0"}).status_code == 403
    assert client.get(url).status_code == 405
    assert client.post(url, {"enabled": "0"}).status_code == 302
    channel.refresh_from_db()
    assert not channel.enabled
    client.post(url, {"enabled": "0"})  # again: no change, no second entry
    client.post(url, {"enabled": "1"})
    channel.refresh_from_db()
    assert channel.enabled
    types = list(Event.objects.order_by("id").values_list("type", "actor"))
    assert types == [("alert_channel.disabled", "user:ada"), ("alert_channel.enabled", "user:ada")]
    foreign = AlertChannel.objects.create(
        project=other_project, name="x", kind="webhook", target="https://a/"
    )
    assert client.post(f"/p/alpha/settings/alerts/{foreign.pk}/enabled/").status_code == 404


def test_the_alerts_page_shows_each_flip_with_every_attempt(project, admin):
    run = make_run(project, "r", name="Llama")
    ops = AlertChannel.objects.create(
        project=project, name="ops", kind="webhook", target="https://a/"
    )
    mail = AlertChannel.objects.create(project=project, name="mail", kind="email", target="a@b.c")
    flip = Flip.objects.create(
        project=project, run=run, kind="run.overdue", key="k1",
        message="Run Llama is overdue: no checkpoint for 2 h",
    )  # fmt: skip
    Notification.objects.create(
        flip=flip, channel=ops, status="sent",
        attempts=[{"at": "2026-11-30T06:00:00Z", "ok": False, "status": 503, "error": "HTTP 503"},
                  {"at": "2026-11-30T06:00:30Z", "ok": True, "status": 200, "error": ""}],
    )  # fmt: skip
    Notification.objects.create(
        flip=flip, channel=mail, status="failed",
        attempts=[{"at": "2026-11-30T06:00:01Z", "ok": False, "status": None,
                   "error": "EMAIL_HOST is not set"}],
    )  # fmt: skip
    html = as_user(admin).get("/p/alpha/settings/alerts/").content.decode()
    row = html.split(f'id="flip-{flip.pk}"')[1].split("</tr>\n")[0]
    assert "run.overdue" in row and "Run Llama is overdue" in row
    assert "HTTP 503" in row and "HTTP 200" in row and "EMAIL_HOST is not set" in row
    assert row.count('class="badge badge-verified">ok') == 1
    assert row.count('class="badge badge-failed">failed') == 2
    assert "badge-sent" in row and "badge-failed" in row


@pytest.mark.parametrize("n", [1, 15])
def test_the_alerts_page_makes_the_same_queries_for_1_or_15_flips(
    project, admin, django_assert_num_queries, n
):
    channel = AlertChannel.objects.create(
        project=project, name="ops", kind="webhook", target="https://a/"
    )
    run = make_run(project, "r")
    for i in range(n):
        flip = Flip.objects.create(
            project=project, run=run, kind="run.failed", key=f"k{i}", message="m"
        )
        Notification.objects.create(flip=flip, channel=channel, attempts=[{"at": "t", "ok": True}])
    client = as_user(admin)
    # session, user, project; channels, flips with their runs, notifications with channels
    with django_assert_num_queries(3 + 1 + 1 + 1):
        response = client.get("/p/alpha/settings/alerts/")
    assert response.content.decode().count('id="flip-') == n


# --- Settings: recovery -----------------------------------------------------------------


def test_an_admin_sets_quota_auto_resume_and_restore_checks_each_audited(project, admin):
    chosen = profile(project)
    client = as_user(admin)
    checks = {
        "forward": "examples.digits_checks:forward",
        "replay": "examples.digits_checks:replay",
        "replay_steps": 5,
        "replay_rtol": 1e-4,
    }
    response = client.post(
        "/p/alpha/settings/recovery/",
        {"storage_quota_gib": "1.5", "auto_resume_profile": chosen.pk, "max_restarts": 2,
         "quarantine_after": 3, "loop_after": 3, "restore_checks": json.dumps(checks)},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()
    project.refresh_from_db()
    assert project.storage_quota_bytes == int(1.5 * 1024**3)
    assert project.auto_resume_profile == chosen and project.max_restarts == 2
    assert project.restore_checks == checks
    audit = dict(Event.objects.values_list("type", "actor"))
    assert audit == {
        "project.storage_quota_bytes_changed": "user:ada",
        "project.auto_resume_profile_changed": "user:ada",
        "project.max_restarts_changed": "user:ada",
        "project.quarantine_after_changed": "user:ada",
        "project.restore_checks_changed": "user:ada",
    }
    assert (project.quarantine_after, project.loop_after) == (3, 3)  # loop_after unchanged
    change = Event.objects.get(type="project.max_restarts_changed")
    assert (change.data["old"], change.data["new"]) == (3, 2)
    # The form shows what is set; saving it unchanged writes nothing.
    page = client.get("/p/alpha/settings/recovery/").content.decode()
    assert "examples.digits_checks:forward" in page and 'value="1.5"' in page
    response = client.post(
        "/p/alpha/settings/recovery/",
        {"storage_quota_gib": "1.5", "auto_resume_profile": chosen.pk, "max_restarts": 2,
         "restore_checks": json.dumps(checks)},
    )  # fmt: skip
    assert response.status_code == 302 and Event.objects.count() == 5
    # Cleared: no quota, no automatic resume, no deeper checks.
    client.post("/p/alpha/settings/recovery/", {"max_restarts": 2, "restore_checks": ""})
    project.refresh_from_db()
    assert project.storage_quota_bytes is None and project.auto_resume_profile is None
    assert project.restore_checks == {}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[1, 2]", "must be a JSON object"),
        ("{not json", "Not JSON"),
        ('{"forward": "m:f", "shell": "rm -rf /"}', "Unknown key &#x27;shell&#x27;"),
        ('{"forward": "no colon"}', "forward must name a function"),
        ('{"replay_steps": 0}', "replay_steps must be a whole number"),
        ('{"replay_steps": true}', "replay_steps must be a whole number"),
        ('{"replay_rtol": "small"}', "replay_rtol must be a number"),
        ('{"file": ""}', "file must be a non-empty string"),
        ('{"reshard": 4}', "reshard must list one to four world sizes from 1 to 64"),
        ('{"reshard": [2, 0]}', "reshard must list one to four world sizes"),
        ('{"reshard": [2, 65]}', "reshard must list one to four world sizes"),
        ('{"reshard": [true]}', "reshard must list one to four world sizes"),
        ('{"reshard": [1, 2, 3, 4, 5]}', "reshard must list one to four world sizes"),
    ],
)
def test_restore_checks_must_be_an_object_with_known_keys(project, admin, text, error):
    response = as_user(admin).post(
        "/p/alpha/settings/recovery/", {"max_restarts": 3, "restore_checks": text}
    )
    assert response.status_code == 200
    assert error in response.content.decode()
    project.refresh_from_db()
    assert project.restore_checks == {} and not Event.objects.exists()


def test_only_this_projects_profiles_can_resume_automatically(project, other_project, admin):
    foreign = profile(other_project, name="theirs")
    response = as_user(admin).post(
        "/p/alpha/settings/recovery/", {"max_restarts": 3, "auto_resume_profile": foreign.pk}
    )
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    project.refresh_from_db()
    assert project.auto_resume_profile is None
