"""Settings through the API, continued: recovery and the badge key, and one audit path:
the same change made on a dashboard settings page and through /api/v1/settings/ writes
the same audit row (type, message, data), only the actor differs."""

from __future__ import annotations

import pytest

from tests.support.api_settings import Admin, audit_lines, error_of
from tests.support.dashboard import as_user
from tests.support.people import member
from webapp.domain.models import ApiToken, Event, LaunchProfile, Project

pytestmark = pytest.mark.django_db


@pytest.fixture
def boss(project) -> Admin:
    return Admin(project)


# --- One audit path ---------------------------------------------------------------------------


def _same_audit(api_project, page_project) -> None:
    def rows(project):
        return [
            (e.type, e.message, sorted(e.data))
            for e in Event.objects.filter(project=project).order_by("pk")
        ]

    assert rows(api_project) and rows(api_project) == rows(page_project)


@pytest.mark.parametrize(
    ("api_call", "page_post"),
    [
        (
            ("/storage-targets", {"name": "s", "bucket": "b", "prefix": "p", "region": "r1"}),
            ("storage/", {"name": "s", "bucket": "b", "prefix": "p", "region": "r1"}),
        ),
        (
            ("/alert-channels", {"name": "c", "kind": "email", "target": "a@example.com"}),
            ("alerts/", {"name": "c", "kind": "email", "target": "a@example.com"}),
        ),
        (
            ("/launch-profiles", {"name": "p", "kind": "local", "command_template": "true"}),
            ("launch-profiles/", {"name": "p", "kind": "local", "command_template": "true"}),
        ),
        (
            ("/members", {"username": "cy", "role": "operator"}),
            ("members/", {"username": "cy", "role": "operator"}),
        ),
    ],
)
def test_the_dashboard_and_the_api_write_the_same_audit_row(api_call, page_post):
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("cy", password="pw")
    via_api = Project.objects.create(name="A", slug="via-api")
    response = Admin(via_api).post(*api_call)
    assert response.status_code == 201, response.content
    via_page = Project.objects.create(name="P", slug="via-page")
    page = as_user(member(via_page, "ada", "admin")).post(
        f"/p/via-page/settings/{page_post[0]}", page_post[1]
    )
    assert page.status_code == 302, page.content.decode()[-2000:]
    _same_audit(via_api, via_page)
    assert Event.objects.get(project=via_api).actor == "token:boss"
    assert Event.objects.get(project=via_page).actor == "user:ada"


def test_a_token_made_on_the_page_and_through_the_api_audits_alike():
    via_api = Project.objects.create(name="A", slug="via-api")
    made = Admin(via_api).post("/tokens", {"name": "t", "scopes": ["read"]}).json()
    via_page = Project.objects.create(name="P", slug="via-page")
    as_user(member(via_page, "ada", "admin")).post(
        "/p/via-page/settings/tokens/", {"name": "t", "scopes": ["read"]}
    )
    page_token = ApiToken.objects.get(project=via_page)
    api_event = Event.objects.get(project=via_api)
    page_event = Event.objects.get(project=via_page)
    assert api_event.type == page_event.type == "token.created"
    assert api_event.message.replace(made["prefix"], "<p>") == page_event.message.replace(
        page_token.prefix, "<p>"
    )
    assert sorted(api_event.data) == sorted(page_event.data) == ["token"]


# --- Recovery and the badge key -------------------------------------------------------------


def test_an_admin_token_changes_recovery_and_each_change_is_audited(project, boss):
    profile = LaunchProfile.objects.create(project=project, name="local", command_template="true")
    checks = {"forward": "examples.digits_checks:forward", "reshard": [2, 4]}
    changed = boss.patch(
        "/recovery",
        {"auto_resume_profile": "local", "max_restarts": 2, "restore_checks": checks},
    )
    assert changed.status_code == 200, changed.content
    assert changed.json()["auto_resume_profile"] == "local"
    assert changed.json()["restore_checks"] == checks
    project.refresh_from_db()
    assert project.auto_resume_profile == profile and project.max_restarts == 2
    assert [(t, a) for t, a, _ in audit_lines(project)] == [
        ("project.auto_resume_profile_changed", "token:boss"),
        ("project.max_restarts_changed", "token:boss"),
        ("project.restore_checks_changed", "token:boss"),
    ]
    again = boss.patch("/recovery", {"max_restarts": 2})
    assert again.status_code == 200 and Event.objects.count() == 3
    assert boss.get("/recovery").json()["max_restarts"] == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"restore_checks": {"file": "../../etc/passwd"}}, "restore_checks"),
        ({"restore_checks": {"forward": "os.system('x')"}}, "restore_checks"),
        ({"restore_checks": {"nope": 1}}, "restore_checks"),
        ({"auto_resume_profile": "not-ours"}, "auto_resume_profile"),
        ({"max_restarts": 101}, "max_restarts"),
    ],
)
def test_hostile_recovery_values_are_refused(project, boss, body, field):
    refused = boss.patch("/recovery", body)
    assert refused.status_code == 400 and error_of(refused).startswith(f"body.{field}"), (
        refused.json()
    )
    assert not Event.objects.exists()


def test_the_badge_key_is_regenerated_as_on_the_badges_page(project, boss):
    old = project.badge_key
    answer = boss.post("/badge-key", None)
    project.refresh_from_db()
    assert answer.status_code == 200 and answer.json()["badge_key"] == project.badge_key != old
    assert audit_lines(project) == [
        ("badges.key_regenerated", "token:boss", "Badge URLs regenerated; the old ones answer 404.")
    ]


def test_a_recovery_change_audits_alike_on_the_page_and_through_the_api():
    rows = {}
    for slug in ("via-api", "via-page"):
        project = Project.objects.create(name=slug, slug=slug)
        LaunchProfile.objects.create(project=project, name="local", command_template="true")
        rows[slug] = project
    Admin(rows["via-api"]).patch("/recovery", {"auto_resume_profile": "local", "max_restarts": 2})
    profile = LaunchProfile.objects.get(project=rows["via-page"])
    as_user(member(rows["via-page"], "ada", "admin")).post(
        "/p/via-page/settings/recovery/", {"auto_resume_profile": profile.pk, "max_restarts": 2}
    )
    _same_audit(rows["via-api"], rows["via-page"])
    api_data = [e.data for e in Event.objects.filter(project=rows["via-api"]).order_by("pk")]
    page_data = [e.data for e in Event.objects.filter(project=rows["via-page"]).order_by("pk")]
    assert api_data == page_data
