"""The storage ledger on a real SeaweedFS: three checkpoints sharing a tokenizer, copied
for real; shared content counted once and shown as saved; money at the target's price;
what retention would free, then what it freed; the page, the API and the gauges
(webapp/domain/replication/ledger.py; docs/replication.md, "The storage ledger")."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.celery_workers import queued_tasks
from tests.support.cli import cli_env, lifeboat
from tests.support.dashboard import as_user
from tests.support.metrics import sample  # the value as Prometheus reads it (1.6e+06)
from tests.support.replication import MiB, make_checkpoint, make_target, replicate_now
from webapp.domain.models import RetentionPolicy, StorageSnapshot
from webapp.domain.replication import ledger
from webapp.domain.retention import policy as retention
from workers.analytics import measure_project

pytestmark = pytest.mark.django_db(transaction=True)

TOKENIZER = 1 * MiB
MODELS = {1: 100_000, 2: 200_000, 3: 300_000}
PRICE = 0.023  # a GB-month, as S3 Standard


@pytest.fixture
def three(project, root, s3):
    target = make_target(project, s3, "main", gb_month_price=PRICE)
    tokenizer = os.urandom(TOKENIZER)
    for step, size in MODELS.items():
        checkpoint = make_checkpoint(
            project, root, step, {"model.pt": os.urandom(size), "tokenizer.json": tokenizer}
        )
        replicate_now(checkpoint)
    return target


def test_shared_content_counts_once_and_shows_as_saved(project, three):
    figures = ledger.latest(project)  # the first pass is taken at once
    (main,) = figures["targets"]
    stored = TOKENIZER + sum(MODELS.values())
    assert main["stored_bytes"] == stored
    assert main["stored_objects"] == 4 + 3  # four distinct files, three manifests
    assert main["logical_bytes"] == 3 * TOKENIZER + sum(MODELS.values())
    assert main["saved_bytes"] == 2 * TOKENIZER
    assert main["monthly_cost"] == round(stored / 1024**3 * PRICE, 2)
    assert figures["replicas"]["stored_bytes"] == stored
    assert figures["runs"] == [{"run": "run-1", "stored_bytes": stored}]
    # No policy: nothing would be freed, nothing was.
    assert (main["would_free_bytes"], main["freed_bytes"]) == (0, 0)
    # Each checkpoint's added bytes: the first holds the tokenizer.
    added = {row["step"]: row["added_bytes"] for row in
             ledger.run_checkpoints(project, project.runs.get(key="run-1"))}  # fmt: skip
    assert added == {1: TOKENIZER + MODELS[1], 2: MODELS[2], 3: MODELS[3]}
    # The local copies, where the jobs wrote them: every file whole.
    assert figures["local"]["stored_bytes"] == 3 * TOKENIZER + sum(MODELS.values())


def test_what_retention_would_free_is_what_it_frees(project, three):
    RetentionPolicy.objects.create(project=project, applies_to="replicas", keep_last=1)
    ledger.snapshot(project)
    before = ledger.latest(project)["targets"][0]
    # Steps 1 and 2 go; the tokenizer stays, named by step 3.
    assert before["would_free_bytes"] == MODELS[1] + MODELS[2]
    assert sorted(d.step for d in retention.apply(project)) == [1, 2]
    # The freed bytes are read at once; the rest at the worker's next pass.
    assert ledger.latest(project)["targets"][0]["freed_bytes_30d"] == MODELS[1] + MODELS[2]
    ledger.snapshot(project)
    after = ledger.latest(project)["targets"][0]
    assert after["freed_bytes"] == after["freed_bytes_30d"] == MODELS[1] + MODELS[2]
    assert after["stored_bytes"] == TOKENIZER + MODELS[3]
    assert after["would_free_bytes"] == 0 and after["saved_bytes"] == 0
    # The tokenizer, first named by step 1, is now what step 3 added.
    (kept,) = ledger.run_checkpoints(project, project.runs.get(key="run-1"))
    assert (kept["step"], kept["added_bytes"]) == (3, TOKENIZER + MODELS[3])


def test_a_runs_breakdown_reads_what_the_last_pass_recorded(project, root, three):
    """The per-checkpoint figures are written by the pass, so a request reads its run's
    rows only; a copy made since the pass is shown as not yet counted."""
    ledger.snapshot(project)
    run = project.runs.get(key="run-1")
    replicate_now(make_checkpoint(project, root, 4, {"model.pt": os.urandom(50_000)}))
    added = {row["step"]: row["added_bytes"] for row in ledger.run_checkpoints(project, run)}
    assert added == {1: TOKENIZER + MODELS[1], 2: MODELS[2], 3: MODELS[3], 4: None}
    ledger.snapshot(project)
    assert ledger.run_checkpoints(project, run)[-1]["added_bytes"] == 50_000


def test_the_page_the_api_and_the_gauges(project, three, viewer, api, read_token, client, settings):
    assert measure_project(project.pk) == 2  # the target, and the local copies
    assert StorageSnapshot.objects.filter(project=project, target__isnull=True).count() == 1
    stored = TOKENIZER + sum(MODELS.values())

    page = as_user(viewer).get(f"/p/{project.slug}/storage/").content.decode()
    assert "deduplication saves 2.0 MiB" in page
    assert 'id="chart-data-stored-on-storage-targets"' in page  # one point, drawn
    assert "run-1" in page.split('id="storage-runs"')[1]
    assert 'href="/p/alpha/storage/"' in as_user(viewer).get("/p/alpha/").content.decode()

    answer = api.get(read_token, "/storage").json()
    assert answer["replicas"]["stored_bytes"] == stored
    assert answer["targets"][0]["monthly_cost"] == round(stored / 1024**3 * PRICE, 2)
    steps = api.get(read_token, "/storage", run="run-1").json()["checkpoints"]
    assert [c["step"] for c in steps] == [1, 2, 3]
    assert api.get(read_token, "/storage", run="nope").status_code == 404

    settings.METRICS_TOKEN = "scrape-token"
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").content.decode()

    main = {"project": "alpha", "target": "main", "where": "target"}
    assert sample(text, "lifeboat_storage_stored_bytes", **main) == stored
    assert 'lifeboat_storage_stored_bytes{project="alpha",target="",where="local"}' in text
    assert 'lifeboat_storage_monthly_cost{project="alpha",target="main",where="target"}' in text


def test_a_hostile_price_is_refused(project, admin, s3):
    target = make_target(project, s3, "priced")
    client = as_user(admin)
    for price in ("-1", "1e300", "nan"):
        response = client.post(
            f"/p/alpha/settings/storage/{target.pk}/",
            {"name": "priced", "bucket": target.bucket, "prefix": target.prefix,
             "endpoint_url": target.endpoint_url, "region": "us-east-1", "enabled": "on",
             "gb_month_price": price},
        )  # fmt: skip
        assert response.status_code == 200, price  # the form again, with the error
        target.refresh_from_db()
        assert target.gb_month_price is None


def test_the_cli_prints_the_ledger_and_asks_for_an_audit(three, server, token, tmp_path, queues):
    env = cli_env(server.url, token, tmp_path)
    done = lifeboat(env, "storage")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("on storage targets: 1.6 MiB in 7 objects, 3 copies")
    assert "deduplication saves 2.0 MiB" in lines[0]
    assert any(line.startswith("main ") and "not audited" in line for line in lines)
    assert any(line.startswith("run-1 ") for line in lines)
    assert json.loads(lifeboat(env, "storage", "--json").stdout)["ledger"]["runs_total"] == 1

    asked = lifeboat(env, "storage", "--audit", "main")
    assert asked.returncode == 0 and "being audited" in asked.stdout
    assert [t["task"] for t in queued_tasks(queues, "replicate")] == [
        "workers.replicate.audit_target"
    ]
    refused = lifeboat(env, "storage", "--clean", "999")
    assert refused.returncode != 0 and "no storage audit 999" in refused.stderr
