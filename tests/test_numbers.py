"""Numbers for people: the formatters (lifeboat/units.py, one for client and server), the
template filters built into every template, the run and checkpoint pages that use them,
the charts' data and a resumed run's lineage, the 404, 500 and favicon, and the API docs
page served without a CDN."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import timedelta

import pytest
from django.template import Context, Template, engines
from django.test import override_settings
from django.utils import timezone

from lifeboat.units import format_number, format_seconds, human_size
from tests.support.dashboard import as_user, make_checkpoint, make_run
from tests.support.servers import ROOT
from webapp.domain.models import Event, MetricPoint

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]
RAW_FLOAT = re.compile(r"\d\.\d{6,}")


def render(text: str, **context) -> str:
    return Template(text).render(Context(context))


# --- The formatters ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.05664975196123123, "0.0566"),
        (76564, "76,564"),
        (76564.0, "76,564"),
        (1234.567, "1,235"),
        (12.3456, "12.3"),
        (-0.5, "-0.5"),
        (1.234e-5, "1.23e-05"),
        (None, ""),
        ("nan", "nan"),
    ],
)
def test_numbers_keep_three_significant_figures_and_separate_thousands(value, text):
    assert format_number(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.004394145000333083, "4.4 ms"),
        (0.0004, "400 µs"),
        (0.75, "750 ms"),
        (0.4, "400 ms"),
        (12.5, "12.5 s"),
        (59.4, "59.4 s"),
        (90, "1 min 30 s"),
        (600, "10 min"),
        (5400, "1 h 30 min"),
        (200_000, "2 d 7 h"),
        (0, "0 s"),
        (None, ""),
    ],
)
def test_durations_scale_from_microseconds_to_days(seconds, text):
    assert format_seconds(seconds) == text


def test_sizes_read_in_binary_units():
    assert [human_size(n) for n in (0, 1536, 2 << 30, 1000 * 1024)] == [
        "0 B",
        "1.5 KiB",
        "2.0 GiB",
        "1000.0 KiB",
    ]


def test_the_code_base_has_one_size_formatter():
    """Every "KiB" in code outside lifeboat/units.py is in a comment, docstring or help
    text: a second formatter would show sizes two ways (there were five)."""
    found = subprocess.run(
        ["git", "grep", "-n", "-E", r"\(\"B\", \"KiB\"|\"KiB\", 1 << 10|/ 1024\b", "--"]
        + ["lifeboat", "webapp", "workers", "scripts", "static/js", "templates"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    code = [line for line in found if line.split(":", 1)[0].endswith((".py", ".js", ".html"))]
    assert [line.split(":", 1)[0] for line in code] == ["lifeboat/units.py"]


def test_the_client_package_formats_sizes_without_django():
    """lifeboat/ runs on training nodes without Django: units.py imports the stdlib only."""
    probe = (
        "import sys, lifeboat.units, lifeboat.progress, lifeboat.ops_format; "
        "print(any(m.startswith('django') for m in sys.modules))"
    )
    result = subprocess.run(
        ["python3", "-S", "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert result.stdout.strip() == "False", result.stderr


def test_the_filters_are_in_every_template_without_a_load():
    now = timezone.now()
    text = render(
        "{{ x|num }}|{{ n|count }}|{{ s|seconds }}|{{ t|ago }}|{{ b|bytes }}|{{ f|percent }}"
        "|{{ soon|ago }}|{{ r|rate }}",
        x=0.05664975196123123,
        n=76564,
        s=0.004394145000333083,
        t=now - timedelta(seconds=12),
        b=1536,
        f=0.0123,
        soon=now + timedelta(minutes=5, seconds=20),
        r=512 * 2**20,
    )
    assert text == "0.0566|76,564|4.4 ms|12 s ago|1.5 KiB|1.23 %|in 5 min 20 s|512.0 MiB/s"
    # The older {% load humanize_bytes %} gives the same filters.
    assert render("{% load humanize_bytes %}{{ b|bytes }}", b=1536) == "1.5 KiB"


# --- The pages --------------------------------------------------------------------------


def test_the_checkpoint_page_prints_no_raw_floats(project, viewer):
    run = make_run(project, "digits", name="digits CNN", expected_interval_s=0.4)
    checkpoint = make_checkpoint(
        run,
        92,
        save_seconds=0.004394145000333083,
        total_size=306_000,
        metrics={"loss": 0.05664975196123123, "accuracy": 0.9812345678},
        content={"format": "torch", "tensors": 8, "parameters": 76564, "dtypes": {"float32": 8}},
    )
    html = as_user(viewer).get(f"/p/alpha/checkpoints/{checkpoint.pk}/").content.decode()
    assert "4.4 ms" in html and "loss = 0.0566" in html and "76,564 parameters" in html
    visible = re.sub(r"<script.*?</script>|<[^>]+>", " ", html, flags=re.S)
    assert not RAW_FLOAT.findall(visible)


def test_the_run_page_says_how_long_ago_in_seconds_and_never_every_0_s(project, viewer):
    run = make_run(project, "digits", expected_interval_s=0.4, last_metrics={"loss": 0.0566497519})
    make_checkpoint(
        run, 92, save_seconds=0.004394145000333083, saved_at=timezone.now() - timedelta(seconds=12)
    )
    Event.objects.create(
        project=project, run=run, type="checkpoint.saved", time=timezone.now(),
        step=92, data={"save_seconds": 0.004394145000333083},
    )  # fmt: skip
    client = as_user(viewer)
    html = client.get("/p/alpha/runs/digits/").content.decode()
    assert re.search(r"\b1[2-5] s ago", html) and "expected every 400 ms" in html
    assert "saved in 4.4 ms" in html and "every 0 s" not in html and "0 minutes" not in html
    html += client.get("/p/alpha/runs/digits/", {"charts": 1, "analytics": 1}).content.decode()
    visible = re.sub(r"<script.*?</script>|<[^>]+>", " ", html, flags=re.S)
    assert not RAW_FLOAT.findall(visible)
    # The runs list says it the same way.
    listing = client.get("/p/alpha/").content.decode()
    assert re.search(r"\b1[2-5] s ago", listing) and "every 400 ms" in listing


def test_a_resumed_runs_charts_continue_the_parents_with_a_marker(project, viewer):
    """The parent's points up to the resume step, then the run's own; the parent's work
    after that step (lost when it failed) is left out."""
    from webapp.dashboard import charts

    parent = make_run(project, "digits", name="digits CNN")
    for step in range(0, 120, 10):
        MetricPoint.objects.create(
            run=parent, step=step, values={"loss": 1.0 - step / 1000}, time=timezone.now()
        )
        make_checkpoint(parent, step, save_seconds=0.01)
    origin = parent.checkpoints.get(step=90)
    child = make_run(project, "digits-2", resumed_from=origin, last_metrics={"loss": 0.5})
    for step in range(100, 200, 10):
        MetricPoint.objects.create(run=child, step=step, values={"loss": 0.5}, time=timezone.now())
        make_checkpoint(child, step, save_seconds=0.02)
    drawn = {c.title: c for c in charts.run_charts(child, ["loss"])}
    loss = drawn["loss"]
    assert loss.data["x"][0] == 0 and loss.data["x"][-1] == 190
    assert 100 not in loss.data["x"][:10] or loss.data["series"][0]["values"][10] == 0.5
    # Steps 100 and 110 of the parent (loss 0.9, 0.89) are not drawn: only the child's 0.5.
    at = dict(zip(loss.data["x"], loss.data["series"][0]["values"], strict=True))
    assert at[90] == pytest.approx(0.91) and at[100] == 0.5 and at[110] == 0.5
    assert loss.data["markers"] == [[90, "resumed at step 90"]]
    assert [m[1] for m in loss.markers] == ["resumed at 90"]
    assert drawn["Save time"].data["x"][0] == 0 and drawn["Save time"].data["markers"]
    # The page's chart fragment carries the data for uPlot, and the hover/zoom script.
    client = as_user(viewer)
    fragment = client.get(
        "/p/alpha/runs/digits-2/", {"charts": 1}, HTTP_HX_REQUEST="true"
    ).content.decode()
    blobs = re.findall(r'<script id="(chart-data-[^"]+)" type="application/json">(.*?)</script>',
                       fragment, flags=re.S)  # fmt: skip
    assert {name for name, _ in blobs} == {
        "chart-data-checkpoint-size", "chart-data-save-time", "chart-data-loss"
    }  # fmt: skip
    assert json.loads(dict(blobs)["chart-data-save-time"])["kind"] == "seconds"
    page = client.get("/p/alpha/runs/digits-2/").content.decode()
    assert "/static/vendor/uplot/uPlot.iife.min.js" in page and "/static/js/charts.js" in page


def test_a_run_that_is_no_resume_charts_its_own_points_alone(project):
    from webapp.dashboard import charts

    run = make_run(project, "alone")
    make_checkpoint(run, 5, save_seconds=0.5)
    (size, save) = charts.run_charts(run, [])
    assert save.data["x"] == [5] and save.data["markers"] == [] and size.data["kind"] == "bytes"


@override_settings(DEBUG=False)
def test_a_missing_run_is_the_apps_own_404_with_a_way_back(project, viewer):
    response = as_user(viewer).get("/p/alpha/runs/no-such-run/")
    html = response.content.decode()
    assert response.status_code == 404
    assert '<header class="top">' in html and "Not found" in html
    assert 'href="/">← Back to your projects' in html
    assert "URLconf" not in html and "Page not found at" not in html


def test_the_500_page_needs_no_request_and_no_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        html = engines["django"].get_template("500.html").render()
    assert '<header class="top">' in html and 'href="/"' in html
    assert "Something went wrong" in html


def test_the_favicon_is_linked_and_answered(client):
    assert (ROOT / "static" / "favicon.svg").read_text().startswith("<svg")
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/favicon.svg"
    assert (
        'rel="icon" href="/static/favicon.svg"' in client.get("/accounts/login/").content.decode()
    )


def test_the_api_docs_page_loads_swagger_ui_from_the_app(client):
    html = client.get("/api/v1/docs").content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html and "/static/ninja/swagger-ui.css" in html
    assert not re.findall(r"(?:src|href)=\"https?://", html)
