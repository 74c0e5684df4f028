"""GET /metrics keeps its series: every family's name, TYPE and label names, recorded
from the hand-written exposition before /metrics moved to prometheus_client (issue #34),
since dashboards and alerts are written against them. HELP texts may change."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.events import event, saved

pytestmark = pytest.mark.django_db(transaction=True)

# name: (TYPE, label names). Histogram samples add `le` to their buckets; counters are
# written with their `_total` name. Label order means nothing to Prometheus (the library
# writes them sorted), so only the names are compared.
FAMILIES = {
    "lifeboat_checkpoints": ("gauge", ("status",)),
    "lifeboat_queue_depth": ("gauge", ("queue",)),
    "lifeboat_broker_up": ("gauge", ()),
    "lifeboat_validation_lag_seconds": ("gauge", ()),
    "lifeboat_replication_lag_seconds": ("gauge", ()),
    "lifeboat_run_last_checkpoint_age_seconds": ("gauge", ("project", "run")),
    "lifeboat_restore_seconds": ("gauge", ("project", "run")),
    "lifeboat_goodput_ratio": ("gauge", ("project",)),
    "lifeboat_gpu_hours": ("gauge", ("project",)),
    "lifeboat_productive_gpu_hours": ("gauge", ("project",)),
    "lifeboat_badput_seconds": ("gauge", ("cause", "project")),
    "lifeboat_storage_stored_bytes": ("gauge", ("project", "target", "where")),
    "lifeboat_storage_logical_bytes": ("gauge", ("project", "target", "where")),
    "lifeboat_storage_objects": ("gauge", ("project", "target", "where")),
    "lifeboat_storage_would_free_bytes": ("gauge", ("project", "target", "where")),
    "lifeboat_storage_monthly_cost": ("gauge", ("project", "target", "where")),
    "lifeboat_repairs_total": ("counter", ("stage",)),
    "lifeboat_http_request_duration_seconds": ("histogram", ("method", "route")),
}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")


def populated(api, token, project, queues) -> None:
    """At least one sample of every family: a running run with reported checkpoints, a
    replica waiting, a passed restore test, goodput and ledger rows, a repair, API calls."""
    from webapp.domain import repair
    from webapp.domain.models import (
        Checkpoint,
        Replica,
        RunGoodput,
        StorageSnapshot,
        StorageTarget,
        Validation,
    )

    body = {"events": [event("run.started", run="r1"), saved(run="r1", step=1)]}
    assert api.post_events(token, body).status_code == 202
    assert api.get(token, "/runs").status_code == 200
    checkpoint = Checkpoint.objects.get()
    target = StorageTarget.objects.create(
        project=project, name="main", bucket="b", gb_month_price=0.02
    )
    Replica.objects.create(checkpoint=checkpoint, target=target, status="pending")
    now = timezone.now()
    Validation.objects.create(
        checkpoint=checkpoint, kind="restore", status="passed", finished_at=now,
        timings={"total_s": 12.5},
    )  # fmt: skip
    run = checkpoint.run
    RunGoodput.objects.create(
        run=run, project=project, family=run, started_at=now - timedelta(hours=1),
        wall_seconds=3600, productive_seconds=3000, lost_work=600, gpu_seconds=7200,
        productive_gpu_seconds=6000,
    )  # fmt: skip
    for where in (target, None):
        StorageSnapshot.objects.create(
            project=project, target=where, taken_at=now, stored_bytes=10**12 + 1,
            stored_objects=3, logical_bytes=2 * 10**12, would_free_bytes=5,
        )  # fmt: skip
    repair._redis().hincrby(repair.COUNTS, "validate", 2)


def families_of(text: str) -> dict[str, tuple[str, set[tuple[str, ...]]]]:
    """{family: (TYPE, the label-name tuples its samples carry)} from an exposition."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    labels: dict[str, set[tuple[str, ...]]] = {name: set() for name in types}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = SAMPLE.match(line)
        assert found, line
        name, inside = found.group(1), found.group(2) or ""
        names = tuple(sorted(re.findall(r'(\w+)="(?:[^"\\]|\\.)*"', inside)))
        family = next(f for f in (name, re.sub(r"_(bucket|sum|count)$", "", name)) if f in types)
        labels[family].add(names)
    return {name: (kind, labels[name]) for name, kind in types.items()}


def scrape(client, settings) -> str:
    settings.METRICS_TOKEN = "scrape-token"
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token")
    assert response.status_code == 200
    return response.content.decode()


def test_every_family_keeps_its_name_type_and_labels(client, api, token, project, queues, settings):
    populated(api, token, project, queues)
    found = families_of(scrape(client, settings))

    assert set(found) == set(FAMILIES)
    for name, (kind, labels) in FAMILIES.items():
        assert found[name][0] == kind, name
        expected = {tuple(sorted(labels))}
        if kind == "histogram":
            expected.add(tuple(sorted((*labels, "le"))))
        assert found[name][1] == expected, name


def test_the_exposition_parses_as_prometheus_reads_it(
    client, api, token, project, queues, settings
):
    from prometheus_client.parser import text_string_to_metric_families

    populated(api, token, project, queues)
    text = scrape(client, settings)
    families = list(text_string_to_metric_families(text))
    parsed = {family.name: family for family in families}

    # Each family's samples together, once (the hand-written exposition interleaved the
    # goodput and storage families, which a strict parser reads as repeated families).
    assert len(families) == len(parsed)
    # The parser names a counter without its _total, as OpenMetrics does.
    assert set(parsed) == {n.removesuffix("_total") for n in FAMILIES}
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in parsed.values()
        for s in f.samples
    }
    assert values["lifeboat_repairs_total", (("stage", "validate"),)] == 2
    assert values["lifeboat_restore_seconds", (("project", "alpha"), ("run", "r1"))] == 12.5
    assert values["lifeboat_goodput_ratio", (("project", "alpha"),)] == pytest.approx(3000 / 3600)
    local = (("project", "alpha"), ("target", ""), ("where", "local"))
    assert values["lifeboat_storage_stored_bytes", local] == 10**12 + 1  # exact, past 2**32
    assert values["lifeboat_replication_lag_seconds", ()] >= 0
