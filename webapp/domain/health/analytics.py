"""What checkpointing costs a run, and the interval that costs least (docs/analytics.md).

The formulas are the classic ones for periodic checkpointing of a job that fails at
random (exponentially distributed failures with mean time between failures M):

* Young (1974), "A first order approximation to the optimum checkpoint interval":
  τ = sqrt(2·δ·M), with δ the time one checkpoint takes.
* Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart
  dumps", FGCS 22(3): τ = sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M,
  and τ = M otherwise. Daly's own example: δ = 5 min, M = 24 h gives about 117 min.
* Daly's expected wall time for T_s of solve time with interval τ, dump time δ and
  restart time R: T_w = M·e^(R/M)·(e^((τ+δ)/M) − 1)·T_s/τ. Its excess over T_s is the
  share of the machine that checkpointing and failures waste.

τ here is the compute time between the end of one checkpoint and the start of the next.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from django.conf import settings
from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    FloatField,
    Q,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from webapp.domain.health import goodput, goodput_report
from webapp.domain.models import Checkpoint, Run, Validation

RECENT = 1000


def young_interval(delta: float, mtbf: float) -> float:
    """Young's first-order optimum: sqrt(2·δ·M). Same unit as the inputs."""
    _check(delta, mtbf)
    return math.sqrt(2 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's higher-order optimum (FGCS 2006, eq. 37)."""
    _check(delta, mtbf)
    if delta >= 2 * mtbf:
        return mtbf
    ratio = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - delta


def expected_wall_time(solve: float, tau: float, delta: float, mtbf: float, restart: float = 0.0):
    """Daly's expected wall-clock time to finish `solve` seconds of work; inf when
    failures come so much more often than segments end that the job never finishes
    (the exponentials overflow a float)."""
    _check(delta, mtbf)
    if tau <= 0:
        raise ValueError("the interval must be positive")
    try:
        return mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf) * solve / tau
    except OverflowError:
        return math.inf


def waste_fraction(tau: float, delta: float, mtbf: float, restart: float = 0.0) -> float:
    """The share of wall time not spent on useful work: checkpoints, lost work, restarts."""
    wall = expected_wall_time(1.0, tau, delta, mtbf, restart)
    return 1 - 1 / wall


def expected_loss_per_failure(tau: float, delta: float, restart: float = 0.0) -> float:
    """Work lost by one failure, on average: half a segment (compute plus its dump), plus
    the restart. First order; good while τ + δ is small against M."""
    return (tau + delta) / 2 + restart


def _check(delta: float, mtbf: float) -> None:
    if delta < 0 or mtbf <= 0:
        raise ValueError("the checkpoint time must be >= 0 and the MTBF > 0")


@dataclass
class RunAnalytics:
    checkpoints: int
    save_seconds_median: float | None
    save_bandwidth_bytes_s: float | None
    size_bytes_last: int | None
    size_growth_bytes_per_checkpoint: float | None
    wall_seconds: float | None
    checkpoint_overhead: float | None  # share of the run's wall time spent saving
    interval_seconds_actual: float | None  # compute between checkpoints, median
    mtbf_seconds: float | None
    mtbf_source: str
    mtbf_basis: str  # given (?mtbf_hours=), history, default (the setting), or none
    failures_seen: int
    restore_seconds: float | None
    young_interval_seconds: float | None
    daly_interval_seconds: float | None
    loss_per_failure_actual_seconds: float | None
    loss_per_failure_daly_seconds: float | None
    waste_actual: float | None
    waste_daly: float | None
    notes: list[str]
    # (step, size bytes, save seconds) per checkpoint, oldest first, for the charts.
    series: list[tuple[int, int, float | None]]

    def as_dict(self) -> dict:
        return asdict(self)


def project_mtbf(project, now=None) -> tuple[float | None, int, str]:
    """Mean time between failures from the project's own history: the runs' total running
    time divided by the number of runs that failed, once that history holds at least
    ANALYTICS_MTBF_MIN_FAILURES failures and ANALYTICS_MTBF_MIN_HOURS of running time
    (one failure after a few seconds says nothing about the next one). Before that,
    (None, failures, a sentence saying what it needs)."""

    now = now or timezone.now()
    running_time = ExpressionWrapper(
        Coalesce(F("ended_at"), Value(now)) - F("started_at"), output_field=DurationField()
    )
    totals = Run.objects.filter(project=project, started_at__isnull=False).aggregate(
        time=Sum(running_time),
        failures=Count("pk", filter=Q(status="failed")),
        # Kept apart: a scheduler's preemption says nothing of how often jobs fail.
        preempted=Count("pk", filter=Q(status="preempted")),
    )
    total = totals["time"].total_seconds() if totals["time"] else 0.0
    failures = totals["failures"]
    seen = f"{failures} failed run{'' if failures == 1 else 's'} over {total / 3600:.1f} h"
    if totals["preempted"]:
        seen += f" ({totals['preempted']} preempted, not counted as failures)"
    need_failures, need_hours = mtbf_minimums()
    if not failures:
        return (
            None,
            0,
            (
                f"no failure seen in this project yet ({total / 3600:.1f} h of runs): an MTBF "
                f"needs at least {need_failures} failed runs and {need_hours:g} h; "
                "pass ?mtbf_hours= to assume one"
            ),
        )
    if failures < need_failures or total < need_hours * 3600:
        return (
            None,
            failures,
            (
                f"too little history for an MTBF: {seen}; it needs at least {need_failures} "
                f"failed runs and {need_hours:g} h; pass ?mtbf_hours= to assume one"
            ),
        )
    return total / failures, failures, seen


def mtbf_minimums() -> tuple[int, float]:
    """(failed runs, hours of running time) the project's history needs for an MTBF."""
    return settings.ANALYTICS_MTBF_MIN_FAILURES, float(settings.ANALYTICS_MTBF_MIN_HOURS)


def host_mtbf(run) -> tuple[float, int, str, str] | None:
    """M for `run` from the failures measured on its host (the goodput ledger's rows), once
    the host has ANALYTICS_MTBF_MIN_FAILURES failures over ANALYTICS_MTBF_MIN_HOURS of
    running time: the host's GPU-hours between failures over the run's GPUs, since any of
    them failing stops the job. None when the host's history is too short."""
    if not run.host:
        return None
    found = goodput_report.rows(run.project).filter(run__host=run.host)
    sums = found.aggregate(
        hours=Sum("running_seconds", default=0.0),
        gpu_hours=Sum(F("running_seconds") * F("gpus"), output_field=FloatField(), default=0.0),
        n_failures=Sum("failures", default=0),
    )
    need_failures, need_hours = mtbf_minimums()
    if sums["n_failures"] < need_failures or sums["hours"] < need_hours * 3600:
        return None
    measured = goodput_report.mtbf(sums["gpu_hours"] / 3600, sums["n_failures"])
    gpus = goodput.gpus_of(run)
    hours = measured.for_gpus(gpus)
    if hours is None:
        # A run that holds no GPU (`gpus_per_rank: 0`), or a host whose runs held none:
        # GPU-hours between failures say nothing about it.
        return None
    source = f"measured on host {run.host}: {measured.note}; for this run's {gpus} GPU"
    source += "s" if gpus != 1 else ""
    return hours * 3600, sums["n_failures"], source, "host"


def _mtbf(run, mtbf_seconds: float | None, now) -> tuple[float | None, int, str, str]:
    """(M, failures seen, source in words, basis): given by the caller, else from the
    project's history when it is long enough, else the deployment's default, else none."""
    if mtbf_seconds is not None:
        return mtbf_seconds, 0, "given", "given"
    measured = host_mtbf(run)
    if measured is not None:
        return measured
    mtbf, failures, source = project_mtbf(run.project, now)
    if mtbf is not None:
        return mtbf, failures, source, "history"
    default_hours = settings.ANALYTICS_DEFAULT_MTBF_HOURS
    if default_hours:
        return (
            default_hours * 3600.0,
            failures,
            (
                f"the deployment's default of {default_hours} h (ANALYTICS_DEFAULT_MTBF_HOURS), "
                f"until the project's own history is long enough: {source}"
            ),
            "default",
        )
    return None, failures, source, "none"


def for_run(run, mtbf_seconds: float | None = None, now=None) -> RunAnalytics:
    """The figures of `run` from its checkpoints, and the intervals for its checkpoint
    cost. `mtbf_seconds` overrides the project's history."""

    now = now or timezone.now()
    notes: list[str] = []
    # The newest RECENT checkpoints: the figures describe how the run checkpoints now,
    # and the work stays bounded for a run with 100,000 of them.
    rows = list(
        Checkpoint.objects.filter(run=run)
        .exclude(status="failed")
        .order_by("-saved_at", "-step")
        .values_list("step", "total_size", "save_seconds", "saved_at")[:RECENT]
    )[::-1]
    saves = [r[2] for r in rows if r[2] is not None]
    delta = statistics.median(saves) if saves else None
    bandwidth = None
    pairs = [(r[1], r[2]) for r in rows if r[2]]
    if pairs:
        bandwidth = sum(size for size, _ in pairs) / sum(seconds for _, seconds in pairs)
    growth = None
    if len(rows) >= 2:
        growth = (rows[-1][1] - rows[0][1]) / (len(rows) - 1)
    wall = None
    if run.started_at:
        wall = max(0.0, ((run.ended_at or now) - run.started_at).total_seconds())
    overhead = sum(saves) / wall if wall and saves else None
    interval = None
    times = [r[3] for r in rows if r[3] is not None]
    if len(times) >= 2:
        gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
        interval = max(statistics.median(gaps) - (delta or 0.0), 0.0)
    mtbf, failures, source, basis = _mtbf(run, mtbf_seconds, now)
    restore = _restore_seconds(run)
    figures = dict.fromkeys(
        ("young", "daly", "loss_actual", "loss_daly", "waste_actual", "waste_daly")
    )
    if delta is None:
        notes.append("no checkpoint reported its save time yet")
    if mtbf is None:
        notes.append(f"no interval is recommended: {source}")
    if mtbf and delta is not None:
        daly = daly_interval(delta, mtbf)
        figures["young"] = young_interval(delta, mtbf)
        figures["daly"] = daly
        figures["loss_daly"] = expected_loss_per_failure(daly, delta, restore or 0.0)
        figures["waste_daly"] = waste_fraction(daly, delta, mtbf, restore or 0.0)
        if interval:
            figures["loss_actual"] = expected_loss_per_failure(interval, delta, restore or 0.0)
            figures["waste_actual"] = waste_fraction(interval, delta, mtbf, restore or 0.0)
    return RunAnalytics(
        checkpoints=len(rows),
        save_seconds_median=delta,
        save_bandwidth_bytes_s=bandwidth,
        size_bytes_last=rows[-1][1] if rows else None,
        size_growth_bytes_per_checkpoint=growth,
        wall_seconds=wall,
        checkpoint_overhead=overhead,
        interval_seconds_actual=interval,
        mtbf_seconds=mtbf,
        mtbf_source=source,
        mtbf_basis=basis,
        failures_seen=failures,
        restore_seconds=restore,
        young_interval_seconds=figures["young"],
        daly_interval_seconds=figures["daly"],
        loss_per_failure_actual_seconds=figures["loss_actual"],
        loss_per_failure_daly_seconds=figures["loss_daly"],
        waste_actual=figures["waste_actual"],
        waste_daly=figures["waste_daly"],
        notes=notes,
        series=[(r[0], r[1], r[2]) for r in rows],
    )


def _restore_seconds(run) -> float | None:
    """The measured time to recover: the latest passed restore test's total, if any."""

    latest = (
        Validation.objects.filter(checkpoint__run=run, kind="restore", status="passed")
        .order_by("-finished_at")
        .values_list("timings", flat=True)
        .first()
    )
    if not latest:
        return None
    total = latest.get("total_s")
    if total is None:
        # Older records without a total: the sum of the phases (the *_s keys only).
        phases = [v for k, v in latest.items() if k.endswith("_s") and isinstance(v, int | float)]
        total = sum(phases) or None
    return total


def what_if(
    run, wall_seconds: float, mtbf_seconds: float | None = None, figures: RunAnalytics | None = None
) -> dict:
    """Beside the goodput measured over `wall_seconds` of the run's training (goodput.py),
    what Daly's model expects at the interval the run uses and at Daly's interval, with
    the same save time, MTBF and restart time: what changing the interval would buy. The
    model counts saves, lost work and restarts only, so compare the difference, not the
    levels."""

    figures = figures or for_run(run, mtbf_seconds=mtbf_seconds)
    now_waste, daly_waste = figures.waste_actual, figures.waste_daly
    gain = None
    if now_waste is not None and daly_waste is not None:
        gain = (now_waste - daly_waste) * wall_seconds
    return {
        "mtbf_seconds": figures.mtbf_seconds,
        "mtbf_basis": figures.mtbf_basis,
        "mtbf_source": figures.mtbf_source,
        "save_seconds": figures.save_seconds_median,
        "restart_seconds": figures.restore_seconds,
        "interval_seconds": figures.interval_seconds_actual,
        "modelled_goodput": 1 - now_waste if now_waste is not None else None,
        "daly_interval_seconds": figures.daly_interval_seconds,
        "modelled_goodput_at_daly": 1 - daly_waste if daly_waste is not None else None,
        "gain_seconds": gain,
        "notes": figures.notes,
    }
