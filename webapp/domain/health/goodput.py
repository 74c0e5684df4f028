"""Goodput: how much of a training's time became progress it kept, and where the rest went
(docs/analytics.md, "Goodput"). Measured from the events the jobs sent, not modelled.

A training is a family: a run and the runs resumed from its checkpoints, and theirs. Each
attempt's time, from its start to its end (or now), is split:

- `restore` — a resumed attempt's time from its start to its first step (loading the
  checkpoint, rebuilding state); a first attempt's is its startup, counted in `other`;
- `checkpoint_save` — the blocking time of each save (`save_seconds`);
- `idle` — a silence longer than GOODPUT_IDLE_AFTER_S across which no step was gained;
- `lost_work` — for an attempt that failed or was preempted, the time after the checkpoint
  the training went on from (the one its resume started from, else its last), redone;
- `productive` — the rest: steps that were kept.

Between attempts, the time from a failure to the resumed attempt's start is `restart`.
`other` is the family's elapsed time that none of these hold: startup of the first
attempt, and gaps between attempts that are not restarts. The parts add up to the elapsed
time exactly when the attempts do not overlap; when they do, `overlap_seconds` says by how
much the attempts' time exceeds it.

Times are the events' own, unless impossible (webapp/domain/ingest/clock.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from webapp.domain.ingest.clock import believable_times
from webapp.domain.models import Checkpoint, Event, Run
from webapp.domain.recovery.auto_resume import lineage

CAUSES = ("checkpoint_save", "lost_work", "restart", "restore", "idle", "other")
ENDED_BADLY = ("failed", "preempted")
# A run's share of its family's ledger (Ledger.runs), in seconds.
SHARE_FIGURES = (
    "wall_seconds", "running_seconds", "productive_seconds", *CAUSES, "overlap_seconds",
    "gpu_seconds", "productive_gpu_seconds",
)  # fmt: skip
_TYPES = (
    "run.started", "run.heartbeat", "metrics", "checkpoint.saved",
    "run.finished", "run.failed", "run.preempted",
)  # fmt: skip


@dataclass
class Attempt:
    """One run of the family, as its events tell it."""

    run_id: int
    key: str
    status: str
    gpus: int
    start: datetime  # its run.started event, or the first event when none came before
    index: int = 0  # its place among the attempts of its run key (a requeue starts another)
    parent: tuple[int, int] | None = None  # (run_id, index) of the attempt it went on from
    from_step: int | None = None  # the parent's checkpoint step it was resumed from
    end: datetime | None = None  # its finished/failed/preempted event
    signs: list[tuple[datetime, int | None]] = field(default_factory=list)  # (time, step)
    # step -> (time, save_seconds): one per step, however many reports (parts, repeats)
    saved: dict[int, tuple[datetime, float]] = field(default_factory=dict)

    @property
    def saves(self) -> list[tuple[datetime, int, float]]:
        return sorted((t, step, s) for step, (t, s) in self.saved.items())


@dataclass
class Ledger:
    wall_seconds: float = 0.0
    productive_seconds: float = 0.0
    badput: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    gpu_seconds: float = 0.0
    productive_gpu_seconds: float = 0.0
    overlap_seconds: float = 0.0
    failures: int = 0
    preemptions: int = 0
    attempts: list[dict] = field(default_factory=list)
    # Each run's share, summing to the family's figures: its attempts' split, the restart
    # before each of them, and for the first run the family's `other` and overlap
    # (goodput_store.py keeps these for the project's view).
    runs: dict[int, dict] = field(default_factory=dict)

    @property
    def goodput(self) -> float | None:
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else None

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    @property
    def productive_gpu_hours(self) -> float:
        return self.productive_gpu_seconds / 3600

    def as_dict(self, price: float | None = None) -> dict:
        """The API's answer (docs/analytics.md, "Goodput"); money when `price` (per
        GPU-hour) is known."""
        lost_gpu_hours = self.gpu_hours - self.productive_gpu_hours
        return {
            "wall_seconds": round(self.wall_seconds, 3),
            "productive_seconds": round(self.productive_seconds, 3),
            "goodput": self.goodput,
            "badput": {cause: round(s, 3) for cause, s in self.badput.items()},
            "overlap_seconds": round(self.overlap_seconds, 3),
            "gpu_hours": round(self.gpu_hours, 6),
            "productive_gpu_hours": round(self.productive_gpu_hours, 6),
            "cost": round(self.gpu_hours * price, 2) if price is not None else None,
            "lost_cost": round(lost_gpu_hours * price, 2) if price is not None else None,
            "failures": self.failures,
            "preemptions": self.preemptions,
            "attempts": [
                {
                    **{k: row[k] for k in ("run", "attempt", "status", "start", "end", "gpus")},
                    **{
                        k: round(row[k], 3)
                        for k in (
                            "seconds",
                            "productive",
                            "checkpoint_save",
                            "lost_work",
                            "restore",
                            "startup",
                            "idle",
                        )
                    },  # fmt: skip
                }
                for row in self.attempts
            ],
        }


# --------------------------------------------------------------------------- the ledger


def _seconds(a: datetime, b: datetime) -> float:
    return max(0.0, (b - a).total_seconds())


def _idle_spans(
    attempt: Attempt, begin: datetime, end: datetime
) -> list[tuple[datetime, datetime]]:
    """Silences longer than GOODPUT_IDLE_AFTER_S, between `begin` and `end`, across which
    no step was gained."""
    limit = settings.GOODPUT_IDLE_AFTER_S
    points = sorted((t, s) for t, s in attempt.signs if begin <= t <= end)
    spans: list[tuple[datetime, datetime]] = []
    last_time = begin
    best: int | None = None
    for when, step in [*points, (end, None)]:
        gained = step is not None and (best is None or step > best)
        if _seconds(last_time, when) > limit and not gained:
            spans.append((last_time, when))
        if step is not None:
            best = step if best is None else max(best, step)
        last_time = max(last_time, when)
    return spans


def _within(spans: list[tuple[datetime, datetime]], begin: datetime) -> float:
    return sum(_seconds(max(a, begin), b) for a, b in spans if b > begin)


def attempt_ledger(attempt: Attempt, kept_step: int | None, now: datetime) -> dict:
    """The split of one attempt's time (its own keys: CAUSES less restart and other, plus
    startup); `kept_step` is the step the training went on from, for one that ended badly."""
    start = attempt.start
    end = attempt.end or now
    total = _seconds(start, end)
    stepped = sorted(t for t, s in attempt.signs if s is not None and start <= t <= end)
    first = stepped[0] if stepped else end
    lead = _seconds(start, first)
    saves = [(t, s, min(sec, total)) for t, s, sec in attempt.saves if start <= t <= end]
    save_total = min(sum(sec for _, _, sec in saves), max(0.0, total - lead))
    idle_spans = _idle_spans(attempt, first, end)
    idle = _within(idle_spans, first)
    lost = 0.0
    if attempt.status in ENDED_BADLY and attempt.end is not None:
        kept_times = [t for t, s, _ in saves if kept_step is not None and s == kept_step]
        kept_at = max(kept_times) if kept_times else first
        lost = _seconds(kept_at, end) - _within(idle_spans, kept_at)
        lost -= sum(sec for t, _, sec in saves if t > kept_at)
        lost = max(0.0, lost)
    resumed = attempt.parent is not None
    productive = max(0.0, total - lead - save_total - idle - lost)
    return {
        "run": attempt.key,
        "attempt": attempt.index + 1,
        "status": attempt.status,
        "start": start,
        "end": attempt.end,
        "seconds": total,
        "gpus": attempt.gpus,
        "productive": productive,
        "checkpoint_save": save_total,
        "lost_work": lost,
        "restore": lead if resumed else 0.0,
        "startup": 0.0 if resumed else lead,
        "idle": idle,
    }


def _kept_step(attempt: Attempt, children: list[Attempt]) -> int | None:
    """The step the training went on from after `attempt`: the newest of its checkpoints
    a resume started from, else its last checkpoint."""
    resumed = [c.from_step for c in children if c.from_step is not None]
    if resumed:
        return max(resumed)
    return max((s for _, s, _ in attempt.saves), default=None)


def ledger(attempts: list[Attempt], now: datetime | None = None) -> Ledger:
    """The family's ledger."""
    now = now or timezone.now()
    attempts = sorted(attempts, key=lambda a: a.start)
    out = Ledger()
    if not attempts:
        return out
    by_parent: dict[tuple[int, int], list[Attempt]] = {}
    for attempt in attempts:
        if attempt.parent is not None:
            by_parent.setdefault(attempt.parent, []).append(attempt)
    ends: dict[tuple[int, int], datetime] = {}
    for attempt in attempts:
        me = (attempt.run_id, attempt.index)
        row = attempt_ledger(attempt, _kept_step(attempt, by_parent.get(me, [])), now)
        ends[me] = attempt.end or now
        out.attempts.append(row)
        share = _share(out, attempt)
        share["running_seconds"] += row["seconds"]
        share["gpu_seconds"] += row["seconds"] * attempt.gpus
        share["productive_seconds"] += row["productive"]
        share["productive_gpu_seconds"] += row["productive"] * attempt.gpus
        for cause in ("checkpoint_save", "lost_work", "restore", "idle"):
            share[cause] += row[cause]
        share["other"] += row["startup"]
        share["failures"] += attempt.status == "failed"
        share["preemptions"] += attempt.status == "preempted"
        out.productive_seconds += row["productive"]
        out.productive_gpu_seconds += row["productive"] * attempt.gpus
        out.gpu_seconds += row["seconds"] * attempt.gpus
        for cause in ("checkpoint_save", "lost_work", "restore", "idle"):
            out.badput[cause] += row[cause]
        out.badput["other"] += row["startup"]
        out.failures += attempt.status == "failed"
        out.preemptions += attempt.status == "preempted"
    for attempt in attempts:
        parent_end = ends.get(attempt.parent) if attempt.parent is not None else None
        if parent_end is not None and attempt.start > parent_end:
            gap = _seconds(parent_end, attempt.start)
            out.badput["restart"] += gap
            out.gpu_seconds += gap * attempt.gpus
            share = out.runs[attempt.run_id]
            share["restart"] += gap
            share["gpu_seconds"] += gap * attempt.gpus
    out.wall_seconds = _seconds(attempts[0].start, max(ends.values()))
    accounted = out.productive_seconds + sum(out.badput.values())
    first = out.runs[attempts[0].run_id]
    # Event times are whole microseconds, so a difference below one is the float sums'
    # rounding, not an overlap (CI once saw 8.9e-16 s reported as one).
    excess = accounted - out.wall_seconds
    if excess >= 1e-6:
        out.overlap_seconds = first["overlap_seconds"] = excess
    elif excess < 0:
        out.badput["other"] -= excess
        first["other"] -= excess
    for share in out.runs.values():
        share["wall_seconds"] = share["productive_seconds"] - share["overlap_seconds"]
        share["wall_seconds"] += sum(share[cause] for cause in CAUSES)
    return out


def _share(out: Ledger, attempt: Attempt) -> dict:
    if attempt.run_id not in out.runs:
        out.runs[attempt.run_id] = {
            "start": attempt.start,
            "end": attempt.end,
            "gpus": attempt.gpus,
            **dict.fromkeys(SHARE_FIGURES, 0.0),
            "failures": 0,
            "preemptions": 0,
        }
    share = out.runs[attempt.run_id]
    share["start"] = min(share["start"], attempt.start)
    share["end"] = attempt.end  # the run's last attempt's end (None: still running)
    return share


# --------------------------------------------------------------------------- from the database


def family_of(run) -> list:
    """The run's training: the first run of its lineage and every run resumed from it,
    at any depth."""

    root = lineage(run)[-1]
    family, frontier = {root.pk: root}, [root.pk]
    while frontier:
        children = Run.objects.filter(
            project_id=run.project_id, resumed_from__run_id__in=frontier
        ).exclude(pk__in=list(family))
        frontier = []
        for child in children:
            family[child.pk] = child
            frontier.append(child.pk)
    return list(family.values())


def gpus_of(run) -> int:
    """GPUs a run holds: its world size times `gpus_per_rank` of its config (default 1)."""
    per_rank = (run.config or {}).get("gpus_per_rank", 1)
    if isinstance(per_rank, bool) or not isinstance(per_rank, int) or not 0 <= per_rank <= 64:
        per_rank = 1
    return (run.world_size or 1) * per_rank


def attempts_of(runs: list) -> list[Attempt]:
    """The attempts of the runs, read from their events (at the times clock.py believes):
    each run.started begins one, so a run key started again (a requeue, a resume under
    the same key) has several."""

    by_id = {r.pk: r for r in runs}
    rows = list(
        Event.objects.filter(run_id__in=list(by_id), type__in=_TYPES).values_list(
            "run_id", "type", "step", "time", "received_at", "data"
        )
    )
    times = believable_times([(r[0], r[1], r[3], r[4]) for r in rows])
    # In time order; at the same instant a start comes before what it starts.
    ordered = sorted(zip(times, rows, strict=True), key=lambda x: (x[0], x[1][1] != "run.started"))
    refs = {d.get("resumed_from") for _, (_, t, _, _, _, d) in ordered if t == "run.started" and d}
    resumed = {
        pk: (run_id, step)
        for pk, run_id, step in Checkpoint.objects.filter(
            pk__in=[r for r in refs if isinstance(r, int) and not isinstance(r, bool)],
            run_id__in=list(by_id),
        ).values_list("pk", "run_id", "step")
    }
    attempts: dict[int, list[Attempt]] = {pk: [] for pk in by_id}
    for when, (run_id, type_, step, _, _, data) in ordered:
        run, mine = by_id[run_id], attempts[run_id]
        current = mine[-1] if mine else None
        if type_ == "run.started":
            if current is not None and current.end is None and not current.signs:
                continue  # the same start again: the first counts
            attempt = Attempt(run_id, run.key, "running", gpus_of(run), index=len(mine), start=when)
            ref = (data or {}).get("resumed_from")
            # An id, as the refs above are read (true is not checkpoint 1).
            found = resumed.get(ref) if isinstance(ref, int) and not isinstance(ref, bool) else None
            if found is not None:
                attempt.from_step = found[1]
                parents = [a for a in attempts[found[0]] if a.start <= when]
                attempt.parent = (found[0], parents[-1].index) if parents else None
            if attempt.parent is None and current is not None:
                attempt.parent = (run_id, current.index)
            _close(current, when)
            mine.append(attempt)
            continue
        if current is None:  # events before any start: the first of them stands in
            current = Attempt(run_id, run.key, "running", gpus_of(run), start=when)
            mine.append(current)
        _fold(current, type_, step, when, data or {})
    for run in runs:
        last = attempts[run.pk][-1] if attempts[run.pk] else None
        if last is not None and last.end is None and run.status != "running" and run.ended_at:
            last.end, last.status = max(run.ended_at, last.start), run.status  # found silent
    return [a for mine in attempts.values() for a in mine]


def _close(attempt: Attempt | None, restarted_at: datetime) -> None:
    """An attempt its run key was started again after, without an end of its own: it
    stopped (killed, lost) at its last sign of life."""
    if attempt is None or attempt.end is not None:
        return
    attempt.end = max([attempt.start, *(t for t, _ in attempt.signs)])
    attempt.end = min(attempt.end, restarted_at)
    attempt.status = "failed"


def _fold(attempt: Attempt, type_: str, step, when: datetime, data: dict) -> None:
    if type_ in ("run.finished", "run.failed", "run.preempted"):
        if attempt.end is None or when >= attempt.end:
            attempt.end, attempt.status = when, type_.removeprefix("run.")
        attempt.signs.append((when, None))
        return
    if type_ == "metrics":
        steps = [p.get("step") for p in data.get("points") or () if isinstance(p, dict)]
        step = max((s for s in steps if isinstance(s, int)), default=None)
    if type_ == "checkpoint.saved" and isinstance(step, int):
        seconds = data.get("save_seconds")
        seconds = float(seconds) if isinstance(seconds, int | float) and seconds > 0 else 0.0
        # Ranks' parts and repeats of one save: saved when the last part was, blocking
        # as long as the slowest rank.
        earlier = attempt.saved.get(step)
        if earlier is not None:
            when, seconds = max(when, earlier[0]), max(seconds, earlier[1])
        attempt.saved[step] = (when, seconds)
    attempt.signs.append((when, step if isinstance(step, int) else None))


def for_run(run, now=None) -> Ledger:
    return ledger(attempts_of(family_of(run)), now)
