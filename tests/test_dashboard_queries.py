"""The dashboard's pages make the same number of queries whatever the number of rows they
show (runs, checkpoints, files and checks, analytics points, tokens).
(tests/test_dashboard.py: what the pages show and do.)"""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from tests.support.dashboard import as_user, make_checkpoint, make_run
from tests.support.events import SHA
from webapp.domain.models import (
    Checkpoint,
    CheckpointFile,
    Event,
    LaunchProfile,
    MetricPoint,
    Resume,
    Run,
    StorageTarget,
    Validation,
)

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


# --- The number of queries does not grow with the rows -----------------------------------


def fill(project, runs: int, checkpoints: int) -> Run:
    now = timezone.now()
    first = None
    for i in range(runs):
        run = make_run(project, f"run-{i}", expected_interval_s=60, tags=["t"])
        first = first or run
        Checkpoint.objects.bulk_create(
            [
                Checkpoint(project=project, run=run, step=s, status="verified", saved_at=now,
                           total_size=100, save_seconds=1.0)
                for s in range(checkpoints)
            ]
        )  # fmt: skip
    Event.objects.bulk_create(
        [Event(project=project, run=first, type="checkpoint.saved", step=s, time=now)
         for s in range(checkpoints)]
    )  # fmt: skip
    return first


# session + user + project with role, then the page's own queries
PROJECT_PAGE_QUERIES = 3 + 2 + 2  # count + one page of runs with every figure annotated,
# the families (links, resumes on their way); the problems summary comes on its own
RUN_PAGE_QUERIES = 3 + 1 + 1 + 1 + 2 + 1 + 1  # run (with its checkpoint count, from
# RunStats), table page, timeline, the family (links, resumes on their way), the run's
# resumes, time to recover; the charts come in a request of their own:
CHARTS_QUERIES = 3 + 1 + 2 + 1 + 2  # run, checkpoint bounds + buckets, which metrics, metric
# bounds + buckets for every metric at once
CHECKPOINT_PAGE_QUERIES = 3 + 1 + 1 + 1 + 1 + 1 + 1 + 1  # checkpoint, checks (restore
# tests too), replicas, resumes, can it be resumed from, files, launch profiles (tensors
# are in the row)
# The analytics: run, checkpoints, the project's running time and failures for the MTBF
# (one aggregate; none when an MTBF is assumed), the latest restore test; the goodput of
# its training: the runs resumed from it (one a generation), its events
ANALYTICS_QUERIES = 3 + 1 + 1 + 1 + 1 + 1 + 1
TOKENS_PAGE_QUERIES = 3 + 1  # the tokens with their creators


@pytest.mark.parametrize("runs", [3, 30])
def test_the_project_page_makes_the_same_queries_for_3_or_30_runs(
    project, viewer, django_assert_num_queries, runs
):
    fill(project, runs, 5)
    client = as_user(viewer)
    with django_assert_num_queries(PROJECT_PAGE_QUERIES):
        response = client.get("/p/alpha/", {"status": "up", "tag": "t", "sort": "storage"})
    assert response.content.decode().count("/runs/run-") == runs


@pytest.mark.parametrize("checkpoints", [3, 60])
def test_the_run_page_makes_the_same_queries_for_3_or_60_checkpoints(
    project, viewer, django_assert_num_queries, checkpoints
):
    fill(project, 1, checkpoints)
    client = as_user(viewer)
    with django_assert_num_queries(RUN_PAGE_QUERIES):
        response = client.get("/p/alpha/runs/run-0/")
    assert response.status_code == 200
    with django_assert_num_queries(3 + 1 + 1):  # the live table alone: run, page
        client.get("/p/alpha/runs/run-0/", HTTP_HX_REQUEST="true")
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(run_id=response.context["run"].pk, step=s, values={"loss": 1.0, "n": "x"},
                        time=timezone.now())
            for s in range(checkpoints)
        ]
    )  # fmt: skip
    with django_assert_num_queries(CHARTS_QUERIES):
        charts = client.get("/p/alpha/runs/run-0/", {"charts": 1}, HTTP_HX_REQUEST="true")
    assert charts.content.decode().count("<svg") == 3  # size, save time, loss (not "n")


@pytest.mark.parametrize("n", [1, 20])
def test_the_checkpoint_page_makes_the_same_queries_for_1_or_20_files_and_checks(
    project, viewer, django_assert_num_queries, n
):
    from webapp.domain.models import Replica

    run = make_run(project, "r")
    checkpoint = make_checkpoint(run, 1)
    for i in range(n):
        CheckpointFile.objects.create(checkpoint=checkpoint, path=f"f{i}", size=1, sha256=SHA)
        Validation.objects.create(checkpoint=checkpoint, kind="integrity", status="passed")
        target = StorageTarget.objects.create(project=project, name=f"t{i}", bucket="b")
        Replica.objects.create(checkpoint=checkpoint, target=target, status="verified")
        Validation.objects.create(
            checkpoint=checkpoint, kind="restore", status="passed", timings={"total_s": 1.0}
        )
        Resume.objects.create(project=project, run=run, checkpoint=checkpoint, command="x")
        LaunchProfile.objects.create(project=project, name=f"p{i}", command_template="x")
    client = as_user(viewer)
    with django_assert_num_queries(CHECKPOINT_PAGE_QUERIES):
        response = client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/")
    html = response.content.decode()
    assert html.count("badge-passed") == min(2 * n, 20)  # the newest 20 checks
    assert len(re.findall(r'id="resume-\d+"', html)) == n
    with django_assert_num_queries(CHECKPOINT_PAGE_QUERIES - 2):  # the live part: no files,
        # no profiles
        client.get(f"/p/alpha/checkpoints/{checkpoint.pk}/", HTTP_HX_REQUEST="true")


@pytest.mark.parametrize("checkpoints", [3, 60])
def test_the_analytics_make_the_same_queries_for_3_or_60_checkpoints(
    project, viewer, django_assert_num_queries, checkpoints
):
    run = fill(project, 3, checkpoints)
    checkpoint = run.checkpoints.first()
    Validation.objects.create(
        checkpoint=checkpoint, kind="restore", status="passed", timings={"total_s": 9.0},
        finished_at=timezone.now(),
    )  # fmt: skip
    client = as_user(viewer)
    with django_assert_num_queries(ANALYTICS_QUERIES):
        response = client.get("/p/alpha/runs/run-0/", {"analytics": 1}, HTTP_HX_REQUEST="true")
    assert 'id="analytics"' in response.content.decode()
    with django_assert_num_queries(ANALYTICS_QUERIES - 1):
        response = client.get(
            "/p/alpha/runs/run-0/", {"analytics": 1, "mtbf_hours": 3}, HTTP_HX_REQUEST="true"
        )
    assert "<svg" in response.content.decode()  # waste against the interval


@pytest.mark.parametrize("n", [1, 20])
def test_the_tokens_page_makes_the_same_queries_for_1_or_20_tokens(
    project, admin, django_assert_num_queries, n
):
    for i in range(n):
        project.issue_token(f"t{i}", ["read"], created_by=admin)
    client = as_user(admin)
    with django_assert_num_queries(TOKENS_PAGE_QUERIES):
        client.get("/p/alpha/settings/tokens/")
