"""The goodput ledger (docs/analytics.md, "Goodput") from scripted timelines with known
answers, sent through the real events API: one failure, two failures in a family, a
preemption, a silent stretch, events out of order and repeated, a clock far off. Each
ledger is checked to the second, and its parts add up to the training's elapsed time."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

import pytest

from lifeboat import ops_format
from tests.support.cli import cli_env, lifeboat
from tests.support.dashboard import as_user
from tests.support.goodput import ONE_FAILURE, attempt, checkpoint_of, goodput, post, saved
from webapp.dashboard.templatetags.numbers import percent
from webapp.domain.health import analytics
from webapp.domain.models import Run

pytestmark = pytest.mark.django_db


def assert_adds_up(ledger: dict) -> None:
    parts = ledger["productive_seconds"] + sum(ledger["badput"].values())
    assert parts == pytest.approx(ledger["wall_seconds"], abs=1e-6)
    assert ledger["overlap_seconds"] == 0


def one_failure(ending: str = "run.failed") -> tuple[list[dict], callable]:
    first = attempt("a", 0, 600, 6000, ending, saves=[3600])
    return first, lambda: attempt(
        "b", 6600, 6900, 10800, "run.finished", saves=[9600],
        resumed_from=checkpoint_of("a", 3600),
    )  # fmt: skip


def check(ledger: dict, expected: dict) -> None:
    for key, value in expected.items():
        if key == "badput":
            assert ledger["badput"] == pytest.approx(value, abs=1e-6), ledger["badput"]
        else:
            assert ledger[key] == pytest.approx(value, abs=1e-6), (key, ledger[key])
    assert_adds_up(ledger)


def test_one_failure_and_its_resume(api, token, project):
    first, second = one_failure()
    post(api, token, first)
    post(api, token, second())

    ledger = goodput(api, token, "b")

    check(ledger, ONE_FAILURE)
    assert ledger == goodput(api, token, "a")  # the training, from either of its runs
    assert ledger["goodput"] == pytest.approx(6780 / 10800)
    assert (ledger["failures"], ledger["preemptions"]) == (1, 0)
    # 2 ranks a run: GPU-hours are twice the hours the attempts and the restart took.
    assert ledger["gpu_hours"] == pytest.approx(2 * (6000 + 600 + 4200) / 3600)
    assert ledger["cost"] is None
    a, b = ledger["attempts"]
    assert (a["run"], a["lost_work"], a["startup"], a["productive"]) == ("a", 2400, 600, 2940)
    assert (b["run"], b["restore"], b["productive"]) == ("b", 300, 3840)


def test_two_failures_in_a_family(api, token, project):
    project.gpu_hour_price = 2.5
    project.save()
    post(api, token, attempt("a", 0, 600, 6000, "run.failed", saves=[3600]))
    post(api, token, attempt("b", 6600, 6900, 9000, "run.failed", saves=[8400],
                             resumed_from=checkpoint_of("a", 3600)))  # fmt: skip
    post(api, token, attempt("c", 9300, 9600, 12000, "run.finished", saves=[11400],
                             resumed_from=checkpoint_of("b", 8400)))  # fmt: skip

    ledger = goodput(api, token, "a")

    check(ledger, {
        "wall_seconds": 12000,
        "productive_seconds": 2940 + 1440 + 2340,
        "badput": {"checkpoint_save": 180, "lost_work": 2400 + 600, "restart": 600 + 300,
                   "restore": 600, "idle": 0, "other": 600},
    })  # fmt: skip
    assert ledger["failures"] == 2
    gpu_hours = 2 * (12000 - 0) / 3600  # attempts and restarts cover the whole time
    assert ledger["gpu_hours"] == pytest.approx(gpu_hours)
    assert ledger["cost"] == pytest.approx(round(gpu_hours * 2.5, 2))
    lost_hours = gpu_hours - 2 * 6720 / 3600
    assert ledger["lost_cost"] == pytest.approx(round(lost_hours * 2.5, 2))


def test_a_preemption_is_counted_apart_from_failures(api, token, project):
    first, second = one_failure("run.preempted")
    post(api, token, first)
    post(api, token, second())

    ledger = goodput(api, token, "a")

    check(ledger, ONE_FAILURE)
    assert (ledger["failures"], ledger["preemptions"]) == (0, 1)


def test_a_silent_stretch_is_idle(api, token, project):
    """Heartbeats stop from 2400 s to 4800 s and the step has not moved when they come
    back: 2400 s idle. A quiet stretch across which the step moved is not."""
    post(api, token, attempt("quiet", 0, 600, 7200, "run.finished", saves=[6000],
                             silent=(2400, 4800)))  # fmt: skip

    ledger = goodput(api, token, "quiet")

    check(ledger, {
        "wall_seconds": 7200,
        "productive_seconds": 7200 - 600 - 2400 - 60,
        "badput": {"checkpoint_save": 60, "lost_work": 0, "restart": 0, "restore": 0,
                   "idle": 2400, "other": 600},
    })  # fmt: skip


def test_events_out_of_order_and_repeated_give_the_same_ledger(api, token, project):
    first, second = one_failure()
    post(api, token, first)
    events = second()
    repeated = [*first, *events, *events[:5]]  # the same ids again: accepted, no effect
    repeated.append(saved("b", 9600, step=9600, save_seconds=30))  # a second report
    random.Random(7).shuffle(repeated)
    for i in range(0, len(repeated), 7):
        post(api, token, repeated[i : i + 7])

    check(goodput(api, token, "b"), ONE_FAILURE)


def test_a_clock_far_off_does_not_stretch_the_training(api, token, project):
    """A run.started claiming the year 2000: its receipt time stands in, and the run starts
    at its first sign of life, not 26 years ago (nor now)."""
    first, second = one_failure()
    first[0]["time"] = "2000-01-01T00:00:00Z"
    post(api, token, first)
    post(api, token, second())

    ledger = goodput(api, token, "b")

    check(ledger, {**ONE_FAILURE, "wall_seconds": 10200,
                   "badput": {**ONE_FAILURE["badput"], "other": 0}})  # fmt: skip
    assert Run.objects.get(key="a").started_at.year == datetime.now(UTC).year


def test_an_unknown_run_is_404(api, token, project):
    assert api.get(token, "/runs/nope/goodput").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_the_cli_prints_the_ledger_people_read(server, api, token, project, tmp_path):
    first, second = one_failure()
    post(api, token, first)
    post(api, token, second())
    env = cli_env(server.url, token, tmp_path)

    done = lifeboat(env, "goodput", "b")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "training of b: 2 attempts, 1 failed, 0 preempted"
    assert lines[1] == (
        "goodput 62.8 % of 3h: 1h 53m became kept progress (3.77 of 6.00 GPU-hours)"
    )
    assert "lost work (redone after a failure)    40m  22.2 %" in lines
    assert "restart (failure to the next start)   10m  5.56 %" in lines
    assert "idle (silent, no step gained)        0.0s     0 %" in lines
    as_json = lifeboat(env, "goodput", "b", "--json")
    assert json.loads(as_json.stdout) == goodput(api, token, "b")


def test_the_run_page_shows_the_training_s_goodput(api, token, project, viewer):
    project.gpu_hour_price = 3
    project.save()
    first, second = one_failure()
    post(api, token, first)
    post(api, token, second())

    page = as_user(viewer).get("/p/alpha/runs/a/", {"analytics": "1"}).content.decode()

    strip = page.split('id="goodput">')[1].split("</dd>")[0]
    assert "<strong>62.8 %</strong> of 3 h became kept progress (3.77 of 6.00 GPU-hours, " in strip
    assert "cost 18.00) over 2 attempts, 1 failed" in strip
    assert "The rest: lost work 40 min · restarts 10 min · restores 5 min · saves 2 min" in strip
    assert "lost 6.70" in strip  # (6.00 - 3.77 GPU-hours) x 3


def test_a_tiny_share_reads_as_less_than_a_hundredth_of_a_percent():
    assert percent(0.00000643) == ops_format.share(0.00000643) == "< 0.01 %"
    assert percent(0.628) == "62.8 %" and ops_format.share(0.628) == "62.8 %"


@pytest.mark.parametrize("ended", [True, False], ids=["failed", "killed-without-a-word"])
def test_a_run_key_started_again_is_a_second_attempt(api, token, project, ended):
    """A resume under the same run key (a Slurm requeue, `train_digits.py --resume`): the
    second run.started begins a second attempt. One killed without an end event stopped
    at its last sign of life (a heartbeat at 5700 s)."""
    first = attempt("a", 0, 600, 6000, "run.failed", saves=[3600])
    if not ended:
        first = first[:-1]
    post(api, token, first)
    post(api, token, attempt("a", 6600, 6900, 10800, "run.finished", saves=[9600],
                             resumed_from=checkpoint_of("a", 3600)))  # fmt: skip

    ledger = goodput(api, token, "a")

    lost, restart = (2400, 600) if ended else (2100, 900)
    badput = {**ONE_FAILURE["badput"], "lost_work": lost, "restart": restart}
    check(ledger, {**ONE_FAILURE, "badput": badput})
    assert [(a["run"], a["attempt"], a["status"]) for a in ledger["attempts"]] == [
        ("a", 1, "failed"), ("a", 2, "finished"),
    ]  # fmt: skip


def test_what_daly_s_interval_would_change(api, token, project):
    """Beside the measured ledger: Daly's model at the interval the run uses (a checkpoint
    every 20 minutes, 60 s each) and at Daly's interval, for an assumed MTBF of 1 h."""
    post(api, token, attempt("r", 0, 600, 9000, "run.finished", saves=[1800, 3000, 4200, 5400]))

    answer = api.get(token, "/runs/r/goodput", mtbf_hours=1).json()["what_if"]

    assert (answer["mtbf_seconds"], answer["mtbf_basis"]) == (3600, "given")
    assert (answer["save_seconds"], answer["interval_seconds"]) == (60, 1140)
    daly = analytics.daly_interval(60, 3600)
    assert answer["daly_interval_seconds"] == pytest.approx(daly)
    now = 1 - analytics.waste_fraction(1140, 60, 3600)
    at_daly = 1 - analytics.waste_fraction(daly, 60, 3600)
    assert answer["modelled_goodput"] == pytest.approx(now)
    assert answer["modelled_goodput_at_daly"] == pytest.approx(at_daly) and at_daly > now
    assert answer["gain_seconds"] == pytest.approx((at_daly - now) * 9000)
    # Without an MTBF, the model says what it lacks instead of guessing.
    unknown = api.get(token, "/runs/r/goodput").json()["what_if"]
    assert unknown["modelled_goodput"] is None and unknown["mtbf_basis"] == "none"
    assert unknown["notes"] == [f"no interval is recommended: {unknown['mtbf_source']}"]


def test_the_run_page_says_what_daly_s_interval_would_buy(api, token, project, viewer):
    post(api, token, attempt("r", 0, 600, 9000, "run.finished", saves=[1800, 3000, 4200, 5400]))

    page = as_user(viewer).get("/p/alpha/runs/r/", {"analytics": "1", "mtbf_hours": "1"})

    line = page.content.decode().split('id="goodput-what-if">')[1].split("</span>")[0]
    assert line.startswith("At Daly's interval (10 min 18 s) instead of 19 min, the model expects")
    assert "82.8 % goodput instead of 80 %: 4 min 11 s more kept progress" in line
