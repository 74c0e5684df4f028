"""Status badges: SVG and JSON for a run, a tag and a project, at URLs with the
project's badge key, no token needed; they follow the run's state as events arrive."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.support.dashboard import as_user
from tests.support.people import member
from webapp.domain.health import badges
from webapp.domain.models import Event, Project

pytestmark = pytest.mark.django_db


def send(api, token, type_: str, run: str, seconds_ago: float, **fields) -> None:
    time = (timezone.now() - timedelta(seconds=seconds_ago)).isoformat()
    body = {"id": str(uuid.uuid4()), "type": type_, "run": run, "time": time, **fields}
    response = api.post_events(token, body)
    assert response.status_code == 202, response.json()


def saved(api, token, run: str, seconds_ago: float, step: int) -> None:
    files = [{"path": "m.pt", "size": 10, "sha256": "ab" * 32}]
    send(api, token, "checkpoint.saved", run, seconds_ago, step=step,
         location=f"/data/{run}/{step}", files=files)  # fmt: skip


def badge(path: str):
    """GET as a stranger: no session, no token."""
    return Client().get(path)


def url(project, kind: str | None = None, name: str = "") -> str:
    """A badge's URL path as the badges page hands it out (a run's and a tag's carry the
    name's key)."""
    return badges.path(project, kind, name)


def state(project, kind: str | None = None, name: str = "") -> str:
    response = badge(url(project, kind, name) + ".json")
    assert response.status_code == 200, response.content
    return response.json()["status"]


def test_a_run_s_badge_follows_its_state(api, token, project):
    project.refresh_from_db()
    send(api, token, "run.started", "exp/a", 1000, expected_interval_s=100, tags=["llama"])
    saved(api, token, "exp/a", 500, 10)
    svg = badge(url(project, "run", "exp/a") + ".svg")
    assert svg.status_code == 200 and svg["Content-Type"].startswith("image/svg+xml")
    body = svg.content.decode()
    assert ">overdue<" in body and "#e05d44" in body and ">exp/a<" in body
    assert "http" not in body.replace("http://www.w3.org/2000/svg", "")  # nothing fetched
    assert "max-age=30" in svg["Cache-Control"]
    assert badge(url(project, "run", "exp/a") + ".json")["Access-Control-Allow-Origin"] == "*"
    assert badge(url(project, "run", "exp/a") + ".json").json() == {
        "label": "exp/a",
        "status": "overdue",
        "total": 1,
        "counts": {"overdue": 1},
    }

    saved(api, token, "exp/a", 120, 20)  # late: past 100 s, within 150 s
    assert state(project, "run", "exp/a") == "late"
    assert ">late<" in badge(url(project, "run", "exp/a") + ".svg").content.decode()
    saved(api, token, "exp/a", 5, 30)
    assert state(project, "run", "exp/a") == "up"
    body = badge(url(project, "run", "exp/a") + ".svg").content.decode()
    assert ">up<" in body and "#44cc11" in body
    send(api, token, "run.failed", "exp/a", 1, exit_code=1, error="OOM")
    assert state(project, "run", "exp/a") == "failed"


def test_a_tag_s_and_the_project_s_badge_show_the_worst_run(api, token, project):
    project.refresh_from_db()
    assert state(project) == "none"
    for key, age in (("good", 10), ("slow", 400)):
        send(api, token, "run.started", key, 1000, expected_interval_s=100, tags=["llama"])
        saved(api, token, key, age, 10)
    send(api, token, "run.started", "other", 1000, expected_interval_s=100, tags=["bert"])
    saved(api, token, "other", 10, 10)
    assert state(project, "tag", "llama") == "overdue"
    assert state(project, "tag", "bert") == "up"
    assert state(project, "tag", "nothing") == "none"
    whole = badge(f"/badge/{project.badge_key}.json").json()
    assert whole["status"] == "overdue" and whole["total"] == 3
    assert whole["counts"] == {"up": 2, "overdue": 1} and whole["label"] == "Alpha"
    send(api, token, "run.failed", "other", 1, exit_code=1)
    assert state(project) == "failed" and state(project, "tag", "bert") == "failed"


def test_a_wrong_or_another_project_s_key_shows_nothing_of_this_project(
    api, token, project, other_project
):
    send(api, token, "run.started", "secret-run", 10, expected_interval_s=100, tags=["t"])
    project.refresh_from_db()
    assert project.badge_key != other_project.badge_key and len(project.badge_key) >= 22
    for path in (
        "/badge/not-the-key.svg",
        "/badge/not-the-key/run/secret-run.json",
        f"/badge/{project.badge_key[:-1]}.json",
        url(other_project, "run", "secret-run") + ".svg",
        url(other_project, "run", "secret-run") + ".json",
        # This project's run, under the other project's key (made with its own):
        f"/badge/{other_project.badge_key}/run/"
        + badges.name_key(project.badge_key, "run", "secret-run")
        + "/secret-run.json",
    ):
        assert badge(path).status_code == 404, path
    theirs = badge(url(other_project, "tag", "t") + ".json").json()
    assert theirs["status"] == "none" and theirs["total"] == 0
    assert badge(f"/badge/{other_project.badge_key}.json").json()["label"] == "Beta"


def test_a_label_is_escaped_in_the_svg(api, token, project):
    project.refresh_from_db()
    send(api, token, "run.started", 'x"><script>alert(1)</script>', 10)
    body = badge(url(project, "run", 'x"><script>alert(1)</script>') + ".svg")
    assert body.status_code == 200
    assert "<script>" not in body.content.decode() and "&lt;script&gt;" in body.content.decode()
    assert body["Content-Security-Policy"].startswith("default-src 'none'")


def test_members_see_the_urls_and_only_admins_regenerate_them(project):
    viewer = member(project, "vera", "viewer")
    admin = member(project, "ada", "admin")
    old = Project.objects.get(pk=project.pk).badge_key
    page = as_user(viewer).get("/p/alpha/badges/").content.decode()
    assert f"/badge/{old}.svg" in page and f"/badge/{old}.json" in page
    assert as_user(viewer).post("/p/alpha/badges/regenerate/").status_code == 403
    assert badge(f"/badge/{old}.svg").status_code == 200
    assert Client().get("/p/alpha/badges/").status_code == 302  # the page itself: sign in

    assert as_user(admin).post("/p/alpha/badges/regenerate/").status_code == 302
    new = Project.objects.get(pk=project.pk).badge_key
    assert new != old
    assert badge(f"/badge/{old}.svg").status_code == 404
    assert badge(f"/badge/{new}.svg").status_code == 200
    assert Event.objects.filter(type="badges.key_regenerated", actor="user:ada").exists()


def test_a_failed_run_that_was_resumed_no_longer_reds_the_project(api, token, project):
    from webapp.domain.models import Checkpoint

    project.refresh_from_db()
    send(api, token, "run.started", "first", 1000, expected_interval_s=100)
    saved(api, token, "first", 100, 10)
    send(api, token, "run.failed", "first", 50, exit_code=1)
    assert state(project) == "failed"
    checkpoint = Checkpoint.objects.get(run__key="first", step=10)
    send(api, token, "run.started", "second", 5, expected_interval_s=100,
         resumed_from=str(checkpoint.pk))  # fmt: skip
    assert state(project) == "up"
    assert state(project, "run", "first") == "failed"  # the run itself still failed


def test_one_public_badge_url_is_no_oracle_for_other_run_or_tag_names(api, token, project):
    """Whoever has one run's badge URL learns nothing of other names: without the
    name's key every name answers the same 404, those the project has included."""
    project.refresh_from_db()
    send(api, token, "run.started", "public-run", 10, expected_interval_s=100, tags=["open"])
    send(api, token, "run.started", "hidden-run", 10, expected_interval_s=100, tags=["secret"])
    public = url(project, "run", "public-run")
    assert badge(public + ".json").status_code == 200
    name_key = public.split("/")[-2]
    for name in ("hidden-run", "no-such-run"):
        guessed = f"/badge/{project.badge_key}/run/{name_key}/{name}.json"
        assert badge(guessed).status_code == 404
    for tag in ("secret", "no-such-tag"):
        assert badge(f"/badge/{project.badge_key}/tag/{name_key}/{tag}.json").status_code == 404
    # The old unsigned form answers nothing either.
    assert badge(f"/badge/{project.badge_key}/run/hidden-run.json").status_code == 404
    assert state(project, "tag", "secret") == "up"  # with its own key it answers
