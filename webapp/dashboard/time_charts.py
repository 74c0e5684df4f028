"""Charts of a value against time (the storage ledger's stored bytes), in the same Chart
as charts.py draws against step: an SVG path that shows without JavaScript, and the data
static/js/charts.js draws with uPlot on a time axis (x_kind "date", Unix seconds)."""

from __future__ import annotations

from webapp.dashboard.charts import KINDS, Chart, _figures


def over_time(title: str, points: list[tuple], fmt) -> Chart:
    """points: [(datetime, value)], oldest first. One point shows as a short tick."""
    chart = Chart(title=title, points=len(points))
    chart.x_label = "time"
    points = [(at, value) for at, value in points if value is not None]
    if not points:
        return chart
    xs = [at.timestamp() for at, _ in points]
    values = [value for _, value in points]
    lo, hi = min(xs), max(xs)
    y_lo, y_hi = 0.0, max(max(values), 1) * 1.05  # stored bytes: from zero up
    plot_w = chart.plot_right - chart.plot_left
    plot_h = chart.plot_bottom - chart.plot_top

    def x_of(x: float) -> float:
        return chart.plot_left + ((x - lo) / (hi - lo) if hi > lo else 0.5) * plot_w

    def y_of(value: float) -> float:
        return chart.plot_bottom - (value - y_lo) / (y_hi - y_lo) * plot_h

    parts = [f"{'M' if i == 0 else 'L'}{x_of(x):.1f} {y_of(v):.1f}" for i, (x, v) in
             enumerate(zip(xs, values, strict=True))]  # fmt: skip
    if len(points) == 1:
        parts.append(f"L{x_of(xs[0]) + 2:.1f} {y_of(values[0]):.1f}")
    chart.path = " ".join(parts)
    chart.y_ticks = [(y_of(v), fmt(v)) for v in (y_lo, y_hi / 2, y_hi)]
    first, last = points[0][0], points[-1][0]
    chart.x_ticks = [(x_of(lo), f"{first:%Y-%m-%d}"), (x_of(hi), f"{last:%Y-%m-%d}")]
    if hi == lo:
        chart.x_ticks = chart.x_ticks[:1]
    chart.data = {
        "x": xs,
        "series": [{"label": title.lower(), "values": [_figures(v) for v in values]}],
        "kind": KINDS.get(fmt, "number"),
        "x_kind": "date",
        "markers": [],
    }
    chart.summary = (
        f"{title}: {fmt(values[0])} on {first:%Y-%m-%d %H:%M}, {fmt(values[-1])} on "
        f"{last:%Y-%m-%d %H:%M} UTC, at most {fmt(max(values))}"
    )
    return chart
