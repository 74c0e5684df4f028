"""Goodput as the tests describe it: attempts of a run at times after BASE, their
checkpoints and heartbeats, posted as events, and the goodput the server then computes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from webapp.domain.models import Checkpoint

BASE = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=6)


HEARTBEAT_S = 300


def ev(type_: str, run: str, t: float, **fields) -> dict:
    when = (BASE + timedelta(seconds=t)).isoformat().replace("+00:00", "Z")
    return {"id": str(uuid.uuid4()), "type": type_, "run": run, "time": when, **fields}


def saved(run: str, t: float, step: int, save_seconds: float = 60) -> dict:
    files = [{"path": "model.pt", "size": 1000, "sha256": "ab" * 32}]
    return ev(
        "checkpoint.saved", run, t, step=step, location=f"/data/{run}/step-{step}",
        files=files, save_seconds=save_seconds,
    )  # fmt: skip


def attempt(
    run: str, start: float, first_step: float, end: float, ending: str,
    saves: list[float], resumed_from: int | None = None, silent: tuple = (),
) -> list[dict]:  # fmt: skip
    """A run's events: started at `start`, a heartbeat every 5 minutes from `first_step`
    (a step gained each time, none inside `silent` = (from, to)), checkpoints saved at
    `saves`, and `ending` (run.finished, run.failed, run.preempted) at `end`."""
    extra = {"resumed_from": resumed_from} if resumed_from is not None else {}
    events = [ev("run.started", run, start, world_size=2, **extra)]
    step, t = 10, first_step
    while t < end:
        if not (silent and silent[0] < t < silent[1]):
            events.append(ev("run.heartbeat", run, t, step=step))
            step += 10 if not (silent and t == silent[0]) else 0
        t += HEARTBEAT_S
    for when in saves:
        events.append(saved(run, when, step=int(when)))
    events.append(ev(ending, run, end))
    return events


def post(api, token, events: list[dict]) -> None:
    answer = api.post_events(token, {"events": events})
    assert answer.status_code == 202, answer.content


def checkpoint_of(run: str, step: int) -> int:
    return Checkpoint.objects.get(run__key=run, step=step).pk


def goodput(api, token, run: str) -> dict:
    answer = api.get(token, f"/runs/{run}/goodput")
    assert answer.status_code == 200, answer.content
    return answer.json()


ONE_FAILURE = {
    "wall_seconds": 10800,
    "productive_seconds": 2940 + 3840,
    "badput": {
        "checkpoint_save": 120,
        "lost_work": 2400,
        "restart": 600,
        "restore": 300,
        "idle": 0,
        "other": 600,
    },  # fmt: skip
}
