"""Numbers and pages as people see them, in Chromium against gunicorn with DEBUG off (as
`make run` serves): no raw floats on the run and checkpoint pages, a chart shows the value
under the cursor and zooms, the app's own 404 page, and the API docs page drawn with
nothing from outside 127.0.0.1.

Screenshots go to var/screenshots/<test name>/ (tests/support/browser.py's `shots`)."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.browser import person, sign_in
from tests.support.servers import ROOT, WebServer
from webapp.domain.models import Checkpoint, MetricPoint, Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
# The page and screenshots are tests/support/browser.py's; the browser is conftest.py's.
RAW_FLOAT = re.compile(r"\d\.\d{6,}")


@pytest.fixture(scope="module")
def web(worker_env, tmp_path_factory):
    """gunicorn as production runs it: DEBUG off, static files collected and served by
    WhiteNoise, the secret key and (plain http) cookies as `make run` sets them."""
    production = {
        "DEBUG": "0",
        "SECRET_KEY": "browser-numbers-" + "k" * 40,
        "SECURE_COOKIES": "0",
        "STATIC_ROOT": str(tmp_path_factory.mktemp("static")),
    }
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=ROOT,
        env={**worker_env, **production},
        check=True,
        capture_output=True,
    )
    server = WebServer(worker_env, **production)
    yield server
    server.stop()


@pytest.fixture
def digits(project):
    """digits CNN, failed at step 110, resumed from its checkpoint at step 90 as
    digits-2; values as a training job sends them (long floats)."""
    now = timezone.now()
    parent = Run.objects.create(
        project=project, key="digits", name="digits CNN", status="failed",
        started_at=now - timedelta(hours=1), last_seen_at=now - timedelta(minutes=30),
        expected_interval_s=0.4,
    )  # fmt: skip
    for i, step in enumerate(range(0, 120, 10)):
        Checkpoint.objects.create(
            project=project, run=parent, step=step, status="verified",
            saved_at=now - timedelta(minutes=50 - i), location=f"/data/digits/{step}",
            total_size=306_000 + step, file_count=1, save_seconds=0.004394145000333083 + i / 1e4,
            metrics={"loss": 1 / (step + 3.3)},
        )  # fmt: skip
        MetricPoint.objects.create(
            run=parent, step=step, values={"loss": 1 / (step + 3.3)}, time=now
        )
    origin = Checkpoint.objects.get(run=parent, step=90)
    origin.content = {"format": "torch", "tensors": 8, "parameters": 76564,
                      "dtypes": {"float32": 8}}  # fmt: skip
    origin.save()
    child = Run.objects.create(
        project=project, key="digits-2", name="digits CNN", resumed_from=origin,
        started_at=now - timedelta(minutes=20), last_seen_at=now - timedelta(seconds=12),
        expected_interval_s=0.4, last_metrics={"loss": 0.05664975196123123},
    )  # fmt: skip
    for i, step in enumerate(range(100, 200, 10)):
        Checkpoint.objects.create(
            project=project, run=child, step=step, status="verified",
            saved_at=now - timedelta(seconds=12 + 60 * (9 - i)), location=f"/data/d2/{step}",
            total_size=306_000, file_count=1, save_seconds=0.0061234567891,
            metrics={"loss": 0.05664975196123123},
        )  # fmt: skip
        MetricPoint.objects.create(
            run=child, step=step, values={"loss": 0.05664975196123123 + i / 1e5}, time=now
        )
    return origin


def visible_raw_floats(page) -> list[str]:
    return RAW_FLOAT.findall(page.locator("body").inner_text())


def test_numbers_read_for_people_and_the_chart_hovers_and_zooms(page, web, project, digits, shots):
    from playwright.sync_api import expect

    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    person(project, "vera", "viewer")
    sign_in(page, web, "vera")
    page.goto(f"{web.url}/p/alpha/runs/digits-2/")
    loss = page.locator("figure.chart", has_text="loss")
    expect(loss.locator(".chart-plot canvas")).to_be_visible()  # uPlot drew it
    expect(loss.locator("svg.chart-svg")).to_be_hidden()
    shots("run", page)
    assert visible_raw_floats(page) == []
    body = page.locator("body").inner_text()
    assert "expected every 400 ms" in body and "every 0 s" not in body
    assert re.search(r"\b\d+ s ago|just now", body) and "0 minutes" not in body

    # Hover: the legend shows the value under the cursor, formatted.
    over = loss.locator(".u-over")
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.8, box["y"] + box["height"] / 2)
    value = loss.locator(".u-legend .u-series").nth(1).locator(".u-value")
    expect(value).to_have_text(re.compile(r"^0\.05\d{1,2}$"))
    shots("run-hover", page)
    # The resumed run's curve starts at the parent's step 0, with the resume marked.
    x_min = loss.evaluate("f => f.uplot.data[0][0]")
    assert x_min == 0
    # Drag across to zoom in on the second half; double-click zooms out again.
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    zoomed = loss.evaluate("f => [f.uplot.scales.x.min, f.uplot.scales.x.max]")
    assert zoomed[0] > 60 and zoomed[1] < 190, zoomed
    shots("run-zoomed", page)
    over.dblclick()
    assert loss.evaluate("f => f.uplot.scales.x.min") <= 0
    # Axis labels people can read: 11 px or more, and ticks in units (ms for save time).
    save = page.locator("figure.chart", has_text="Save time")
    expect(save.locator(".chart-plot canvas")).to_be_visible()
    assert save.evaluate("f => parseFloat(f.uplot.axes[1].font[0])") >= 11
    ticks = save.evaluate("f => f.uplot.axes[1]._values")
    assert ticks and all(t.endswith(" ms") or t == "0" for t in ticks), ticks
    assert len(set(ticks)) == len(ticks), ticks  # never "0.01 s / 0.01 s / 0.00 s"

    # The waste-against-interval chart: a log axis of durations, the share in percent.
    page.goto(f"{web.url}/p/alpha/runs/digits-2/?analytics=1&mtbf_hours=2")
    waste = page.locator("figure.chart", has_text="Time wasted")
    expect(waste.locator(".chart-plot canvas")).to_be_visible()
    assert all(t.endswith(" %") or t == "0" for t in waste.evaluate("f => f.uplot.axes[1]._values"))
    shots("run-analytics", page)
    assert errors == []

    page.goto(f"{web.url}/p/alpha/checkpoints/{digits.pk}/")
    expect(page.get_by_role("heading", name="Step 90")).to_be_visible()
    shots("checkpoint", page)
    text = page.locator("body").inner_text()
    assert "76,564 parameters" in text and re.search(r"loss = 0\.0\d{3}\b", text)
    assert "4.4 ms" in text or "5.3 ms" in text
    assert visible_raw_floats(page) == []


def test_a_missing_page_is_the_apps_own_404_with_a_way_back(page, web, project, shots):
    from playwright.sync_api import expect

    person(project, "vera", "viewer")
    sign_in(page, web, "vera")
    response = page.goto(f"{web.url}/p/alpha/runs/no-such-run/")
    assert response.status == 404
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    expect(page.locator("header.top .brand")).to_be_visible()
    assert "URLconf" not in page.content()
    shots("404", page)
    page.get_by_role("link", name="Back to your projects").click()
    page.wait_for_url(f"{web.url}/")
    # The favicon: linked from every page, and /favicon.ico answered.
    icon = page.request.get(f"{web.url}/favicon.ico")
    assert icon.ok and icon.headers["content-type"].startswith("image/svg+xml")


def test_the_api_docs_render_with_nothing_from_outside(page, web, shots):
    from playwright.sync_api import expect

    outside: list[str] = []

    def only_local(route):
        url = route.request.url
        if url.startswith(("http://127.0.0.1", "data:", "blob:")):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(f"{web.url}/api/v1/docs")
    expect(page.locator("#swagger-ui .swagger-ui")).to_be_visible()
    expect(page.locator(".opblock").first).to_be_visible()
    shots("api-docs", page)
    assert outside == []
