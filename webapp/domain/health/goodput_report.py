"""A project's goodput: how much of its GPU time became kept progress, where the rest went,
by training, tag or host, and how often each host fails (docs/analytics.md, "A project's
goodput"). Read from the rows goodput_store.py keeps, summed in the database, so the
answer's cost grows with the groups asked for, not with the events behind them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

from django.conf import settings
from django.db.models import Aggregate, Count, F, FloatField, Q, Sum, Value, Window
from django.db.models.functions import TruncDate

from webapp.domain.health.goodput import CAUSES
from webapp.domain.health.goodput_store import as_of
from webapp.domain.models import RunGoodput

GROUPS = ("run", "tag", "host")
CONFIDENCE = 0.90
WILSON_HILFERTY_DOF = 200
_SECONDS = ("wall_seconds", "running_seconds", "productive_seconds", *CAUSES, "overlap_seconds")


def _sums() -> dict:
    """The aggregates, named `s_<figure>`: an aggregate may not take a field's own name
    when another aggregate reads that field."""
    sums: dict[str, Aggregate] = {name: Sum(name, default=0.0) for name in _SECONDS}
    sums["gpu_seconds"] = Sum("gpu_seconds", default=0.0)
    sums["productive_gpu_seconds"] = Sum("productive_gpu_seconds", default=0.0)
    # GPU time while attempts ran: the exposure failures are counted against.
    sums["running_gpu_seconds"] = Sum(
        F("running_seconds") * F("gpus"), output_field=FloatField(), default=0.0
    )
    sums["after_failure_gpu_seconds"] = Sum(
        (F("lost_work") + F("restart") + F("restore")) * F("gpus"),
        output_field=FloatField(),
        default=0.0,
    )
    sums["failures"] = Sum("failures", default=0)
    sums["preemptions"] = Sum("preemptions", default=0)
    sums["runs"] = Count("run_id")
    return {f"s_{name}": expression for name, expression in sums.items()}


def _unprefixed(row: dict) -> dict:
    return {name.removeprefix("s_"): value for name, value in row.items()}


def rows(project, since=None):
    """The project's rows; with `since`, those of runs that ran after it (counted whole)."""
    found = RunGoodput.objects.filter(project=project)
    if since is not None:
        found = found.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since))
    return found


def figures(sums: dict, price: float | None) -> dict:
    """What one group's sums read as: seconds, goodput, GPU-hours, money, MTBF."""
    wall, gpu = sums["wall_seconds"], sums["gpu_seconds"]
    interruptions = sums["failures"] + sums["preemptions"]
    lost_gpu_hours = (gpu - sums["productive_gpu_seconds"]) / 3600
    per_failure = None
    if interruptions:
        per_failure = sums["after_failure_gpu_seconds"] / 3600 / interruptions
    return {
        "runs": sums["runs"],
        "wall_seconds": round(wall, 3),
        "productive_seconds": round(sums["productive_seconds"], 3),
        "goodput": sums["productive_seconds"] / wall if wall > 0 else None,
        "badput": {cause: round(sums[cause], 3) for cause in CAUSES},
        "overlap_seconds": round(sums["overlap_seconds"], 3),
        "gpu_hours": round(gpu / 3600, 6),
        "productive_gpu_hours": round(sums["productive_gpu_seconds"] / 3600, 6),
        "gpu_goodput": sums["productive_gpu_seconds"] / gpu if gpu > 0 else None,
        "lost_gpu_hours": round(lost_gpu_hours, 6),
        "cost": round(gpu / 3600 * price, 2) if price is not None else None,
        "lost_cost": round(lost_gpu_hours * price, 2) if price is not None else None,
        "failures": sums["failures"],
        "preemptions": sums["preemptions"],
        "lost_per_failure_gpu_hours": round(per_failure, 6) if per_failure is not None else None,
        "lost_per_failure_cost": (
            round(per_failure * price, 2) if per_failure is not None and price is not None else None
        ),
        "mtbf": mtbf(sums["running_gpu_seconds"] / 3600, sums["failures"]).as_dict(),
    }


def report(project, since=None, group_by: str = "run", limit: int = 20) -> dict:
    """The project's ledger, and its `limit` groups that lost most GPU-hours."""
    price = project.gpu_hour_price
    found = rows(project, since)
    total = figures(_unprefixed(found.aggregate(**_sums())), price)
    groups_total, top = groups(project, since, group_by, limit)
    return {
        "since": since,
        "group_by": group_by,
        "as_of": as_of(project),
        "gpu_hour_price": price,
        **total,
        "groups_total": groups_total,
        "groups": top,
    }


def groups(project, since=None, group_by: str = "run", limit: int = 20, order: str = "lost"):
    """(how many groups there are, the first `limit` of them as figures), those that lost
    most GPU time first, or with `order="failures"` those that failed most. Only the groups
    shown are read as figures: a project has thousands."""
    if group_by not in GROUPS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPS)}")
    price = project.gpu_hour_price
    found = rows(project, since)
    if group_by == "tag":
        by_tag = _by_tag(found, order)
        return len(by_tag), [{"key": key, **figures(sums, price)} for key, sums in by_tag[:limit]]
    key = {"run": "family__key", "host": "run__host"}[group_by]
    extra = {"name": F("family__name")} if group_by == "run" else {}
    summed = (
        found.values(key)
        .annotate(**_sums(), **extra)
        .annotate(
            s_lost=F("s_gpu_seconds") - F("s_productive_gpu_seconds"),
            # The number of groups, counted by the same query: COUNT(*) OVER () runs after
            # the GROUP BY and before the LIMIT.
            n_groups=Window(Count(Value(1))),
        )
    )
    first = ("-s_failures", "-s_lost") if order == "failures" else ("-s_lost",)
    shown, groups_total = [], 0
    for row in summed.order_by(*first, key)[:limit]:
        groups_total = row.pop("n_groups")
        sums = _unprefixed(row)
        group = {"key": sums[key], **figures(sums, price)}
        if group_by == "run":
            group["name"] = sums["name"]
        shown.append(group)
    return groups_total, shown  # no row shown: no group (the API takes limit >= 1)


def _by_tag(found, order: str = "lost") -> list[tuple]:
    """(tag, sums), those that lost most GPU time (or failed most) first. A run counts in
    each of its tags; runs without a tag in the group whose key is null. Tags are a JSON
    list, so the database sums the rows of each distinct list (a project has few), and
    each list's sums go to each of its tags here."""
    by_tag: dict = {}
    for row in found.values("run__tags").annotate(**_sums()).order_by():
        sums = _unprefixed(row)
        tags = sums.pop("run__tags")
        keys = {str(t) for t in tags} if isinstance(tags, list) and tags else {None}
        for key in keys:
            group = by_tag.setdefault(key, dict.fromkeys(sums, 0))
            for name, value in sums.items():
                group[name] += value

    def rank(item):
        lost = item[1]["productive_gpu_seconds"] - item[1]["gpu_seconds"]
        first = (-item[1]["failures"], lost) if order == "failures" else (lost,)
        return (*first, str(item[0]))

    return sorted(by_tag.items(), key=rank)


def daily(project, since=None) -> list[dict]:
    """Per day (UTC) the runs started: their goodput and badput by cause."""
    days = (
        rows(project, since)
        .annotate(day=TruncDate("started_at"))
        .values("day")
        .annotate(**_sums())
        .order_by("day")
    )
    return [{"day": d["day"], **figures(_unprefixed(d), project.gpu_hour_price)} for d in days]


# --------------------------------------------------------------------------- MTBF


@dataclass
class Mtbf:
    """Failures per GPU-hour of exposure, as GPU-hours between failures, with a two-sided
    90 % interval (failures as a Poisson process over the exposure: the chi-square bounds
    of reliability engineering, exact for any count)."""

    failures: int
    exposure_gpu_hours: float
    gpu_hours_per_failure: float | None
    low: float | None
    high: float | None  # None: unbounded (no failure seen yet)
    note: str

    def for_gpus(self, gpus: int) -> float | None:
        """The MTBF in hours of a job on `gpus` GPUs: any of them failing stops it."""
        if self.gpu_hours_per_failure is None or gpus < 1:
            return None
        return self.gpu_hours_per_failure / gpus

    def as_dict(self) -> dict:
        return {
            "failures": self.failures,
            "exposure_gpu_hours": round(self.exposure_gpu_hours, 6),
            "gpu_hours_per_failure": _round(self.gpu_hours_per_failure),
            "low": _round(self.low),
            "high": _round(self.high),
            "confidence": CONFIDENCE,
            "note": self.note,
        }


def _h(value: float) -> str:
    """GPU-hours as people write them: 1,223 and 12.9, not 1.22e+03."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _round(value):
    return None if value is None else round(value, 6)


def mtbf(exposure_gpu_hours: float, failures: int) -> Mtbf:
    tail = (1 - CONFIDENCE) / 2
    if exposure_gpu_hours <= 0:
        return Mtbf(failures, 0.0, None, None, None, "no GPU time seen yet")
    low = 2 * exposure_gpu_hours / chi2_quantile(1 - tail, 2 * failures + 2)
    if failures == 0:
        note = (
            f"no failure in {_h(exposure_gpu_hours)} GPU-hours: at least {_h(low)} GPU-hours "
            f"between failures ({CONFIDENCE:.0%} confidence)"
        )
        return Mtbf(0, exposure_gpu_hours, None, low, None, note)
    point = exposure_gpu_hours / failures
    high = 2 * exposure_gpu_hours / chi2_quantile(tail, 2 * failures)
    note = (
        f"{failures} failure{'s' if failures != 1 else ''} in {_h(exposure_gpu_hours)} "
        f"GPU-hours: {_h(point)} GPU-hours between failures, between {_h(low)} and "
        f"{_h(high)} ({CONFIDENCE:.0%} confidence)"
    )
    if failures < settings.ANALYTICS_MTBF_MIN_FAILURES:
        note += f"; rough: fewer than {settings.ANALYTICS_MTBF_MIN_FAILURES} failures"
    return Mtbf(failures, exposure_gpu_hours, point, low, high, note)


@functools.lru_cache(maxsize=4096)
def chi2_quantile(p: float, dof: int) -> float:
    """The p-quantile of the chi-square distribution with an even number of degrees of
    freedom, by bisection on its closed form (a Poisson tail): no SciPy needed. Cached: a
    project's thousands of groups share a few failure counts. Past WILSON_HILFERTY_DOF
    degrees, the Wilson-Hilferty approximation (relative error under 1e-4 there) instead
    of a sum of dof/2 terms per step."""
    if dof > WILSON_HILFERTY_DOF:
        z, c = NormalDist().inv_cdf(p), 2 / (9 * dof)
        return dof * (1 - c + z * math.sqrt(c)) ** 3
    k = dof // 2

    def cdf(x: float) -> float:  # 1 - P(Poisson(x/2) < k), each term in logs: no overflow
        half = x / 2
        if half == 0:
            return 0.0
        log_half = math.log(half)
        return 1 - sum(math.exp(i * log_half - half - math.lgamma(i + 1)) for i in range(k))

    lo, hi = 0.0, max(1.0, 4.0 * dof)
    while cdf(hi) < p:
        hi *= 2
    for _ in range(100):  # far past a float's precision
        mid = (lo + hi) / 2
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
