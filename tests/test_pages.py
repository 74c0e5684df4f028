"""The minimal pages: a project's runs and a run's checkpoints, for members only."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tests.support.events import event, saved
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


def test_the_checkpoint_page_shows_checks_findings_and_progress(api, token, client, member):
    from django.utils import timezone

    from webapp.domain.models import Checkpoint, Validation

    api.post_events(token, saved(run="r", step=9))
    checkpoint = Checkpoint.objects.get()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        status="corrupt", status_message="model.pt does not match its sha256"
    )
    Validation.objects.create(
        checkpoint=checkpoint,
        kind="integrity",
        status="failed",
        message="model.pt does not match its sha256",
        findings=[{"severity": "corrupt", "code": "checksum_mismatch", "message": "bytes differ"}],
        timings={"hash_s": 0.5},
        bytes_total=1500,
        bytes_done=1500,
        started_at=timezone.now(),
        finished_at=timezone.now(),
    )
    running = Validation.objects.create(
        checkpoint=checkpoint,
        kind="integrity",
        status="running",
        bytes_total=4 * 1024**3,
        bytes_done=1024**3,
        started_at=timezone.now() - timezone.timedelta(seconds=2),
    )
    client.force_login(member)
    html = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert "model.pt does not match its sha256" in html
    assert "bytes differ" in html
    assert "1.0 GiB of 4.0 GiB" in html
    assert "MiB/s" in html and "left" in html  # rate and ETA while it runs
    assert 'hx-trigger="every 1000ms"' in html  # the first poll; later ones back off
    # Polling stops (286) once nothing is running any more.
    running.status = "passed"
    running.save()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    fragment = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/", HTTP_HX_REQUEST="true")
    assert fragment.status_code == 286
    assert "<html" not in fragment.content.decode()


def test_a_finished_checks_rate_is_over_its_own_duration():
    from datetime import timedelta

    from django.utils import timezone

    from webapp.domain.models import Validation

    start = timezone.now() - timedelta(hours=1)
    validation = Validation(
        status="passed",
        bytes_total=1000,
        bytes_done=1000,
        started_at=start,
        finished_at=start + timedelta(seconds=2),
    )
    assert validation.progress()["rate"] == 500
    assert validation.progress()["eta_s"] is None
