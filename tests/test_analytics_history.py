"""Analytics that know what they do not know: no MTBF, and so no recommended interval,
from fewer than ANALYTICS_MTBF_MIN_FAILURES failures or ANALYTICS_MTBF_MIN_HOURS of
history; ?mtbf_hours= or the deployment's default stands in, and the page says so."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.dashboard import as_user
from tests.support.people import member
from webapp.domain.health import analytics

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


def send(api, token, type_: str, seconds_ago: float, **fields) -> None:
    time = (timezone.now() - timedelta(seconds=seconds_ago)).isoformat()
    body = {"id": str(uuid.uuid4()), "type": type_, "run": "quick", "time": time, **fields}
    assert api.post_events(token, body).status_code == 202


@pytest.fixture
def one_failure_in_seconds(api, token, project):
    """A run that saved two checkpoints in 0.05 s each and failed, all within 10 s: the
    project's only failure. Its "MTBF" would be 10 s, and Young's interval one second."""
    send(api, token, "run.started", 10)
    for step, ago in ((1, 8), (2, 5)):
        files = [{"path": "m.pt", "size": 10, "sha256": "ab" * 32}]
        send(api, token, "checkpoint.saved", ago, step=step, location=f"/data/q/{step}",
             files=files, save_seconds=0.05)  # fmt: skip
    send(api, token, "run.failed", 1, exit_code=1, error="boom")
    return project


def test_one_failure_in_seconds_gives_no_mtbf_and_no_interval(api, token, one_failure_in_seconds):
    answer = api.get(token, "/runs/quick/analytics").json()
    assert answer["mtbf_seconds"] is None and answer["mtbf_basis"] == "none"
    assert answer["young_interval_seconds"] is None and answer["daly_interval_seconds"] is None
    assert answer["waste_daly"] is None and answer["failures_seen"] == 1
    source = answer["mtbf_source"]
    assert "1 failed run over 0.0 h" in source
    assert "at least 3 failed runs and 24 h" in source and "?mtbf_hours=" in source
    assert any("no interval is recommended" in note for note in answer["notes"])
    # An assumed MTBF still gives the figures.
    given = api.get(token, "/runs/quick/analytics", mtbf_hours=24).json()
    assert given["mtbf_basis"] == "given"
    assert given["young_interval_seconds"] == pytest.approx((2 * 0.05 * 86400) ** 0.5)


def test_the_run_page_says_so_in_words(one_failure_in_seconds):
    viewer = member(one_failure_in_seconds, "vera", "viewer")
    response = as_user(viewer).get("/p/alpha/runs/quick/", {"analytics": 1}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200
    assert "recommended</" not in html and "<strong>" not in html.split("Daly")[1].split("</dd>")[0]
    assert "none yet: it needs an MTBF" in html
    assert "not known yet: too little history for an MTBF" in html
    assert "at least 3 failed runs and 24 h" in html


def test_the_deployment_default_stands_in_until_the_history_is_enough(
    api, token, one_failure_in_seconds, settings
):
    settings.ANALYTICS_DEFAULT_MTBF_HOURS = 12
    answer = api.get(token, "/runs/quick/analytics").json()
    assert answer["mtbf_basis"] == "default" and answer["mtbf_seconds"] == 12 * 3600
    assert "ANALYTICS_DEFAULT_MTBF_HOURS" in answer["mtbf_source"]
    assert answer["daly_interval_seconds"] == pytest.approx(analytics.daly_interval(0.05, 43200))


def test_the_minimums_are_settings(one_failure_in_seconds, settings):
    assert analytics.project_mtbf(one_failure_in_seconds)[0] is None
    settings.ANALYTICS_MTBF_MIN_FAILURES = 1
    settings.ANALYTICS_MTBF_MIN_HOURS = 0
    mtbf, failures, _ = analytics.project_mtbf(one_failure_in_seconds)
    assert failures == 1 and 0 < mtbf < 60
