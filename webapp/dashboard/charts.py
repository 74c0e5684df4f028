"""Server-drawn SVG charts of a value against step, readable at any number of points.

The database does the downsampling: the step range is cut into one bucket per pixel
column and each bucket gives its min and max, so a run with 100,000 checkpoints sends a
few hundred rows to Python, and the drawn envelope shows the spikes a plain average or
every-nth sample would hide. On PostgreSQL each bucket reads at most SAMPLE_PER_BUCKET
rows, so that the page's time does not grow with the run (bench/pages.py): exact up to
that many rows per pixel column, an envelope of the rows read beyond (Chart.sampled).

Each chart carries its buckets as data too (Chart.data, a json_script in _chart.html):
static/js/charts.js draws them with uPlot (static/vendor/uplot/), with readable axes,
the values under the cursor and drag-to-zoom; the SVG is what shows without JavaScript.
A resumed run's charts continue its parent's: the lineage's points up to each resume
step, then the run's own, with a marker at each resume (lineage_points())."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from django.db import connection
from django.db.models import (
    BigIntegerField,
    ExpressionWrapper,
    F,
    FloatField,
    Func,
    Max,
    Min,
    Q,
    Value,
)
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast
from django.utils.text import slugify

from lifeboat.units import format_number, format_seconds, human_size
from webapp.domain.health.analytics import waste_fraction
from webapp.domain.models import Checkpoint
from webapp.domain.models.checkpoints import NOT_SAVED, CheckpointStatus

WIDTH = 640  # viewBox units; the SVG scales to its box
HEIGHT = 160
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 64, 12, 10, 22
BUCKETS = WIDTH - PAD_LEFT - PAD_RIGHT  # one per pixel column of the plot area


@dataclass
class Chart:
    title: str
    unit: str = ""
    points: int = 0  # how many rows the chart stands for
    path: str = ""  # SVG path data of the min/max envelope
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    width: int = WIDTH
    height: int = HEIGHT
    plot_left: int = PAD_LEFT
    plot_right: int = WIDTH - PAD_RIGHT
    plot_top: int = PAD_TOP
    plot_bottom: int = HEIGHT - PAD_BOTTOM
    summary: str = ""  # for screen readers: range of the values
    # Vertical lines at chosen x values: (x, label, css class).
    markers: list[tuple[float, str, str]] = field(default_factory=list)
    x_label: str = "step"
    # What static/js/charts.js draws: {"x": [...], "series": [{"label", "values"}], "kind",
    # "x_kind", "markers": [[x, label]]}; kind says how values read (bytes, seconds, ...).
    data: dict = field(default_factory=dict)

    @property
    def dom_id(self) -> str:
        return f"chart-data-{slugify(self.title) or 'values'}"

    # Some pixel column had more rows than were read (SAMPLE_PER_BUCKET).
    sampled: bool = False
    sample_limit: int = 0

    @property
    def empty(self) -> bool:
        return not self.path


def bucket_expression(lo: int, hi: int, buckets: int = BUCKETS):
    """(step - lo) * buckets / (hi - lo + 1): integer division in PostgreSQL and SQLite."""
    span = max(hi - lo + 1, 1)
    return ExpressionWrapper(
        (F("step") - Value(lo)) * Value(buckets) / Value(span), output_field=BigIntegerField()
    )


# At most this many rows are read for each bucket (pixel column) on PostgreSQL: a chart
# then costs at most BUCKETS * SAMPLE_PER_BUCKET rows, whatever the run's length. Runs
# with fewer rows per pixel column than this (under about 4,500 points) are drawn exactly.
SAMPLE_PER_BUCKET = 8


def bucket_bounds(lo: int, hi: int, buckets: int = BUCKETS) -> list[tuple[int, int, int]]:
    """(bucket, first step, step after the last) of each bucket that can hold a step: the
    same cut as bucket_expression(), for the bucket-by-bucket reads on PostgreSQL."""
    span = max(hi - lo + 1, 1)
    bounds = []
    for bucket in range(buckets):
        start = lo + -(-bucket * span // buckets)  # ceil
        stop = lo + -(-(bucket + 1) * span // buckets)
        if start < stop:
            bounds.append((bucket, start, stop))
    return bounds


def min_max_buckets(queryset, value_names: dict[str, object], lo: int, hi: int) -> list[dict]:
    """Rows {bucket, step_at, <name>_lo, <name>_hi} for each value expression, in order;
    one query for all the values.

    PostgreSQL: bucket by bucket, each an index range scan of at most SAMPLE_PER_BUCKET
    rows (the first ones of the bucket): the time is bounded whatever the number of rows
    (100,000 metric points cost 45-95 ms read whole, bench/pages.py). A bucket with more
    rows than that shows the range of the rows read, not of all (`sampled` in the rows).
    Elsewhere (SQLite: development and tests) every row, grouped."""
    columns = {
        f"v_{name}": F(expression) if isinstance(expression, str) else expression
        for name, expression in value_names.items()
    }
    aggregates = ", ".join(
        f"MIN(v_{name}) AS {name}_lo, MAX(v_{name}) AS {name}_hi" for name in value_names
    )
    if connection.vendor == "postgresql":
        return _sampled_buckets(queryset, columns, aggregates, lo, hi)
    inner = (
        queryset.order_by()
        .annotate(bucket=bucket_expression(lo, hi), **columns)
        .values("bucket", "step", *columns)
    )
    sql, params = inner.query.sql_with_params()
    # Only the ORM's own SQL and our identifiers are formatted in; values are params.
    outer = (
        f"SELECT bucket, MIN(step) AS step_at, {aggregates} "  # noqa: S608
        f"FROM ({sql}) AS points GROUP BY bucket ORDER BY bucket"
    )
    return _fetch(outer, params)


def _sampled_buckets(queryset, columns, aggregates, lo, hi) -> list[dict]:
    """The values are computed once per row in the inner query, then aggregated: written
    as MIN(expr), MAX(expr), PostgreSQL would evaluate expr twice, and reading a number
    out of JSON is most of the cost."""

    bounds = bucket_bounds(lo, hi)
    inner = (
        queryset.filter(step__gte=RawSQL("b.start", ()), step__lt=RawSQL("b.stop", ()))
        .annotate(**columns)
        .order_by("step")
        .values("step", *columns)[:SAMPLE_PER_BUCKET]
    )
    sql, params = inner.query.sql_with_params()
    outer = (
        f"SELECT b.bucket, s.* FROM unnest(%s::int[], %s::bigint[], %s::bigint[]) "  # noqa: S608
        f"AS b(bucket, start, stop) CROSS JOIN LATERAL ("
        f"SELECT MIN(step) AS step_at, COUNT(*) AS n, {aggregates} FROM ({sql}) AS points"
        f") AS s WHERE s.n > 0 ORDER BY b.bucket"
    )
    rows = _fetch(outer, ([b for b, _, _ in bounds], [s for _, s, _ in bounds],
                          [e for _, _, e in bounds], *params))  # fmt: skip
    for row in rows:
        row["sampled"] = row.pop("n") >= SAMPLE_PER_BUCKET
    return rows


def _fetch(sql: str, params) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


class JsonNumber(Func):
    """A number read from a JSON value, NULL when it is not a number (a client may send
    "nan" as a string): PostgreSQL would fail the whole query on one bad cast."""

    output_field = FloatField()
    arity = 1

    def as_sql(self, compiler, connection, **extra):
        return compiler.compile(Cast(self.source_expressions[0], FloatField()))

    def as_postgresql(self, compiler, connection, **extra):
        # jsonb -> float directly, without a detour through text.
        sql, params = compiler.compile(self.source_expressions[0])
        return (
            f"(CASE WHEN jsonb_typeof({sql}) = 'number' THEN ({sql})::double precision END)",
            (*params, *params),
        )


def metric_value(key: str):
    return JsonNumber(KeyTransform(key, "values"))


def _figures(value: float | None) -> float | None:
    """Six significant figures: what a chart can show, at a third of the JSON."""
    return None if value is None else float(f"{value:.6g}")


def draw(
    title: str, rows: list[dict], name: str, lo: int, hi: int, fmt, unit: str = "", count: int = 0
) -> Chart:
    """A Chart from bucket rows: x is the step, y spans the min and max of the values."""
    chart = Chart(title=title, unit=unit, points=count)
    chart.sampled = any(r.get("sampled") for r in rows)
    chart.sample_limit = SAMPLE_PER_BUCKET
    rows = [r for r in rows if r[f"{name}_lo"] is not None and r[f"{name}_hi"] is not None]
    if not rows:
        return chart
    chart.data = {
        "x": [r["step_at"] for r in rows],
        "series": [
            {"label": "max", "values": [_figures(r[f"{name}_hi"]) for r in rows]},
            {"label": "min", "values": [_figures(r[f"{name}_lo"]) for r in rows]},
        ],
        "kind": KINDS.get(fmt, "number"),
        "x_kind": "step",
        "markers": [],
    }
    y_lo = min(r[f"{name}_lo"] for r in rows)
    y_hi = max(r[f"{name}_hi"] for r in rows)
    if y_hi == y_lo:  # a flat line: give it room, 10 % either side
        pad = abs(y_lo) * 0.1 or 1
        y_lo, y_hi = (y_lo - pad if y_lo - pad >= 0 or y_lo < 0 else 0), y_hi + pad
    x_span = max(hi - lo, 1)
    plot_w = chart.plot_right - chart.plot_left
    plot_h = chart.plot_bottom - chart.plot_top

    def x_of(step: float) -> float:
        return chart.plot_left + (step - lo) / x_span * plot_w

    def y_of(value: float) -> float:
        return chart.plot_bottom - (value - y_lo) / (y_hi - y_lo) * plot_h

    parts = []
    for i, row in enumerate(rows):
        x = x_of(row["step_at"])
        top, bottom = y_of(row[f"{name}_hi"]), y_of(row[f"{name}_lo"])
        parts.append(f"{'M' if i == 0 else 'L'}{x:.1f} {top:.1f}")
        if abs(top - bottom) >= 0.1:
            parts.append(f"L{x:.1f} {bottom:.1f}")
    if len(rows) == 1:  # a single point: a short tick so it shows
        parts.append(f"L{x_of(rows[0]['step_at']) + 2:.1f} {y_of(rows[0][f'{name}_hi']):.1f}")
    chart.path = " ".join(parts)
    chart.y_ticks = [(y_of(v), fmt(v)) for v in (y_lo, (y_lo + y_hi) / 2, y_hi)]
    chart.x_ticks = [(x_of(s), f"{int(s):,}") for s in sorted({lo, (lo + hi) // 2, hi})]
    chart.summary = f"{title}: from {fmt(y_lo)} to {fmt(y_hi)} over steps {lo:,} to {hi:,}"
    if chart.sampled:
        chart.summary += f" (at most {SAMPLE_PER_BUCKET} points read per pixel column)"
    return chart


def short_number(value: float) -> str:
    """An axis label: 12.5k, 3.4M; three figures below a hundred."""
    if value is None:
        return ""
    magnitude = abs(value)
    if magnitude >= 1e9:
        return f"{value / 1e9:.1f}G"
    if magnitude >= 1e6:
        return f"{value / 1e6:.1f}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.1f}k"
    return format_number(value)


def seconds(value: float) -> str:
    return format_seconds(value)


def size(value: float) -> str:
    return human_size(value)


# How static/js/charts.js formats a chart's values, by the formatter its SVG uses.
KINDS = {short_number: "number", seconds: "seconds", size: "bytes"}

MAX_LINEAGE = 20  # ancestors followed back: one query each


def lineage_points(run, related: str):
    """The rows of `related` ("checkpoints", "metric_points") that tell the run's story:
    each ancestor's up to the step its child resumed from, then the run's own; and the
    resume steps. A run that is no resume gets its own rows alone, as before."""

    own = getattr(run, related).all()
    condition, resumes, child, seen = Q(run=run), [], run, {run.pk}
    while child.resumed_from_id and len(seen) <= MAX_LINEAGE:
        origin = (
            Checkpoint.objects.filter(pk=child.resumed_from_id, project_id=run.project_id)
            .values("run_id", "step")
            .first()
        )
        if origin is None or origin["run_id"] in seen:
            break  # deleted, another project's, or a loop
        condition |= Q(run_id=origin["run_id"], step__lte=origin["step"])
        resumes.append(origin["step"])
        seen.add(origin["run_id"])
        child = type(run).objects.only("pk", "resumed_from_id").get(pk=origin["run_id"])
    if not resumes:
        return own, []
    return own.model.objects.filter(condition), sorted(resumes)


def mark_resumes(chart: Chart, resumes: list[int], lo: int, hi: int) -> None:
    """A marker at each resume step within the chart's range."""
    if chart.empty or hi <= lo:
        return
    plot_w = chart.plot_right - chart.plot_left
    for step in resumes:
        if lo <= step <= hi:
            x = chart.plot_left + (step - lo) / (hi - lo) * plot_w
            chart.markers.append((x, f"resumed at {step:,}", "marker-resume"))
            chart.data["markers"].append([step, f"resumed at step {step:,}"])


def run_charts(run, metric_keys: list[str]) -> list[Chart]:
    """Checkpoint size and save time, then each metric, against step: 4 queries,
    whatever the number of rows and metrics."""

    charts = []
    checkpoints, resumes = lineage_points(run, "checkpoints")
    saved = checkpoints.exclude(status__in=(*NOT_SAVED, CheckpointStatus.DELETED))
    bounds = saved.order_by().aggregate(lo=Min("step"), hi=Max("step"))
    if bounds["lo"] is not None:
        lo, hi = bounds["lo"], bounds["hi"]
        rows = min_max_buckets(saved, {"size": "total_size", "save": "save_seconds"}, lo, hi)
        count = len(rows)
        charts.append(draw("Checkpoint size", rows, "size", lo, hi, size, count=count))
        charts.append(draw("Save time", rows, "save", lo, hi, seconds, unit="s", count=count))
        for chart in charts:
            mark_resumes(chart, resumes, lo, hi)
    if metric_keys:
        points, resumes = lineage_points(run, "metric_points")
        bounds = points.order_by().aggregate(lo=Min("step"), hi=Max("step"))
        if bounds["lo"] is not None:
            lo, hi = bounds["lo"], bounds["hi"]
            # Every metric from one read of the rows: the JSON is the cost.
            names = {f"m{i}": metric_value(key) for i, key in enumerate(metric_keys)}
            rows = min_max_buckets(points, names, lo, hi)
            for name, key in zip(names, metric_keys, strict=True):
                chart = draw(key, rows, name, lo, hi, short_number, count=len(rows))
                mark_resumes(chart, resumes, lo, hi)
                charts.append(chart)
    return charts


# --- How often to checkpoint: waste against the interval ---------------------------------


def duration_label(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def interval_chart(figures, samples: int = 120) -> Chart | None:
    """The expected share of wall time wasted (saves, lost work, restarts: Daly 2006,
    eq. 20) against the checkpoint interval τ, on a log scale from a quarter of the
    smaller to four times the larger of the interval used and Daly's; marked at both.
    None when the figures lack δ, M or Daly's interval."""

    delta = figures.save_seconds_median
    mtbf = figures.mtbf_seconds
    daly = figures.daly_interval_seconds
    actual = figures.interval_seconds_actual
    restore = figures.restore_seconds or 0.0
    if delta is None or not mtbf or not daly or daly <= 0:
        return None
    known = [t for t in (daly, actual) if t and t > 0]
    lo, hi = min(known) / 4, max(known) * 4
    log_lo, log_hi = math.log(lo), math.log(hi)
    taus = [math.exp(log_lo + (log_hi - log_lo) * i / (samples - 1)) for i in range(samples)]
    wastes = []
    for tau in taus:
        try:
            wastes.append(min(waste_fraction(tau, delta, mtbf, restore), 1.0))
        except (OverflowError, ValueError):
            wastes.append(1.0)
    chart = Chart(title="Time wasted against the checkpoint interval", unit="%", points=samples)
    chart.x_label = "interval"
    y_lo, y_hi = 0.0, max(min(max(wastes) * 1.05, 1.0), 1e-6)
    plot_w = chart.plot_right - chart.plot_left
    plot_h = chart.plot_bottom - chart.plot_top

    def x_of(tau: float) -> float:
        return chart.plot_left + (math.log(tau) - log_lo) / (log_hi - log_lo) * plot_w

    def y_of(value: float) -> float:
        return chart.plot_bottom - (value - y_lo) / (y_hi - y_lo) * plot_h

    chart.path = " ".join(
        f"{'M' if i == 0 else 'L'}{x_of(t):.1f} {y_of(w):.1f}"
        for i, (t, w) in enumerate(zip(taus, wastes, strict=True))
    )
    chart.y_ticks = [(y_of(v), f"{v * 100:.3g} %") for v in (y_lo, y_hi / 2, y_hi)]
    chart.x_ticks = [(x_of(t), duration_label(t)) for t in (lo, math.sqrt(lo * hi), hi)]
    chart.markers = [(x_of(daly), f"Daly {duration_label(daly)}", "marker-daly")]
    if actual and actual > 0:
        chart.markers.append((x_of(actual), f"used {duration_label(actual)}", "marker-actual"))
    chart.data = {
        "x": [_figures(t) for t in taus],
        "series": [{"label": "wasted", "values": [_figures(w) for w in wastes]}],
        "kind": "percent",
        "x_kind": "seconds",
        "x_log": True,
        "markers": [[daly, f"Daly {duration_label(daly)}"]]
        + ([[actual, f"used {duration_label(actual)}"]] if actual and actual > 0 else []),
    }
    best = min(wastes)
    chart.summary = (
        f"Waste from {best * 100:.2g} % (near Daly's interval, {duration_label(daly)}) to "
        f"{max(wastes) * 100:.2g} % over intervals from {duration_label(lo)} to "
        f"{duration_label(hi)}" + (f"; the run uses {duration_label(actual)}" if actual else "")
    )
    return chart
