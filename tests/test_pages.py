"""The minimal pages: a project's runs and a run's checkpoints, for members only."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tests.conftest import event, saved
from webapp.domain.models import Membership

pytestmark = pytest.mark.django_db


@pytest.fixture
def member(project):
    user = get_user_model().objects.create_user("ada", password="pw")
    Membership.objects.create(project=project, user=user, role="viewer")
    return user


def test_pages_need_a_sign_in(client, project):
    response = client.get("/p/alpha/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_a_checkpoint_posted_through_the_api_shows_on_the_run_page(api, token, client, member):
    api.post_events(token, event("run.started", run="exp/7", name="Seven"))
    api.post_events(token, saved(run="exp/7", step=1234))
    client.force_login(member)
    runs = client.get("/p/alpha/")
    assert runs.status_code == 200
    assert b"Seven" in runs.content
    page = client.get("/p/alpha/runs/exp/7/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "1234" in html
    assert "/data/exp/7/step-1234" in html
    assert "1.5 KiB" in html
    assert "Reported" in html


def test_the_checkpoint_table_alone_for_htmx(api, token, client, member):
    api.post_events(token, saved(run="r", step=9))
    client.force_login(member)
    html = client.get("/p/alpha/runs/r/", HTTP_HX_REQUEST="true").content.decode()
    assert html.lstrip().startswith('<div id="checkpoints"')
    assert "<html" not in html


def test_a_non_member_cannot_see_the_project(client, project, other_project):
    outsider = get_user_model().objects.create_user("eve", password="pw")
    Membership.objects.create(project=other_project, user=outsider, role="admin")
    client.force_login(outsider)
    assert client.get("/p/alpha/").status_code == 404
    assert b"Alpha" not in client.get("/").content


def test_login_page_renders(client):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b"Sign in" in response.content
