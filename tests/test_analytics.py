"""The checkpoint-interval formulas against hand-computed values, and a run's figures."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from tests.support.events import T0, saved
from webapp.domain.health import analytics


def test_daly_s_own_example_five_minute_dumps_and_a_day_between_failures():
    # Daly 2006: δ = 5 min, M = 24 h -> about 117 min (Young: exactly 120 min).
    assert analytics.young_interval(5, 24 * 60) == pytest.approx(120.0)
    assert analytics.daly_interval(5, 24 * 60) == pytest.approx(116.69, abs=0.01)


def test_daly_s_interval_by_hand_for_a_costly_checkpoint():
    # δ = 30 min, M = 5 h = 300 min: sqrt(2·30·300) = 134.16; δ/2M = 0.05;
    # 134.16 · (1 + sqrt(0.05)/3 + 0.05/9) - 30 = 134.16 · 1.080091 - 30 = 114.91.
    assert analytics.daly_interval(30, 300) == pytest.approx(114.91, abs=0.01)


def test_a_checkpoint_longer_than_two_mtbfs_means_checkpoint_every_mtbf():
    assert analytics.daly_interval(10, 4) == 4


def test_waste_is_least_near_daly_s_interval():
    delta, mtbf = 5.0, 1440.0
    best = analytics.daly_interval(delta, mtbf)
    at_best = analytics.waste_fraction(best, delta, mtbf)
    assert at_best < analytics.waste_fraction(best / 3, delta, mtbf)
    assert at_best < analytics.waste_fraction(best * 3, delta, mtbf)
    # Daly's T_w with no failures possible (huge M) tends to T_s·(τ+δ)/τ.
    assert analytics.expected_wall_time(100, 10, 1, 1e12) == pytest.approx(110, rel=1e-6)
    assert analytics.expected_loss_per_failure(100, 10, restart=5) == 60


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        analytics.young_interval(5, 0)
    with pytest.raises(ValueError):
        analytics.waste_fraction(0, 5, 100)


@pytest.mark.django_db
def test_a_run_s_figures_from_its_checkpoints(api, token, project):
    events = [
        {
            **saved(step=100 * i, t=600 * i, save_seconds=30.0),
            "files": [{"path": "m.pt", "size": 1_000_000 * i, "sha256": "ab" * 32}],
        }
        for i in range(1, 5)
    ]
    started = {
        "id": "00000000-0000-4000-8000-000000000001",
        "type": "run.started",
        "run": "run-1",
        "time": T0.isoformat(),
    }
    finished = {
        "id": "00000000-0000-4000-8000-000000000002",
        "type": "run.finished",
        "run": "run-1",
        "time": (T0 + timedelta(seconds=3000)).isoformat(),
    }
    assert api.post_events(token, {"events": [started, *events, finished]}).status_code == 202

    answer = api.get(token, "/runs/run-1/analytics", mtbf_hours=24).json()
    assert answer["checkpoints"] == 4
    assert answer["save_seconds_median"] == 30.0
    assert answer["checkpoint_overhead"] == pytest.approx(120 / 3000)
    assert answer["interval_seconds_actual"] == pytest.approx(570.0)
    assert answer["size_growth_bytes_per_checkpoint"] == pytest.approx(1_000_000)
    assert answer["save_bandwidth_bytes_s"] == pytest.approx(10_000_000 / 120)
    assert answer["young_interval_seconds"] == pytest.approx(math.sqrt(2 * 30 * 86400))
    assert answer["daly_interval_seconds"] == pytest.approx(analytics.daly_interval(30, 86400))
    assert answer["waste_actual"] > answer["waste_daly"]
    assert [row[0] for row in answer["series"]] == [100, 200, 300, 400]

    # Without a failure in the project's history there is no MTBF to work from.
    plain = api.get(token, "/runs/run-1/analytics").json()
    assert plain["mtbf_seconds"] is None and "no failure seen" in plain["mtbf_source"]
    assert api.get(token, "/runs/run-1/analytics", mtbf_hours=-1).status_code == 400


@pytest.mark.django_db
def test_the_mtbf_comes_from_the_project_s_own_failures(project):
    from webapp.domain.models import Run

    start = T0
    for key, hours in (("a", 2), ("b", 3), ("c", 10)):
        Run.objects.create(
            project=project, key=key, status="failed", started_at=start,
            ended_at=start + timedelta(hours=hours),
        )  # fmt: skip
    Run.objects.create(
        project=project,
        key="d",
        status="finished",
        started_at=start,
        ended_at=start + timedelta(hours=9),
    )
    mtbf, failures, source = analytics.project_mtbf(project, now=start + timedelta(hours=12))
    assert failures == 3 and mtbf == pytest.approx(8 * 3600)  # 24 h of running, 3 failures
    assert source == "3 failed runs over 24.0 h"
