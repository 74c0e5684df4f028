"""What the operator commands print for people: aligned tables, sizes in KiB/MiB/GiB,
times as "3m ago", durations as "1m 20s".

Every value shown comes from the server, and much of it from training jobs (run keys,
hosts, error messages): control characters are replaced before anything reaches the
terminal, so a run key cannot move the cursor, retitle the window or hide a line."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from lifeboat.units import human_size

# timezone.utc, not datetime.UTC (3.11+): the client also runs on training nodes' older Pythons.
UTC = timezone.utc  # noqa: UP017

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def clean(value) -> str:
    """`value` as one line of text that is safe to print: control characters (escape
    sequences, newlines, bidirectional overrides) become '?'."""
    if value is None:
        return "-"
    return _CONTROL.sub("?", str(value))


def size(count) -> str:
    return "-" if count is None else human_size(float(count))


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def duration(seconds: float | None) -> str:
    """0.42 -> '0.4s', 12 -> '12s', 80 -> '1m 20s', 7300 -> '2h 1m', 200000 -> '2d 7h'."""
    if seconds is None:
        return "-"
    if seconds < 9.95:
        return f"{max(seconds, 0):.1f}s"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s" if seconds else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def share(fraction: float | None) -> str:
    """A share as people read one: 0.628 -> '62.8 %', 0.0123 -> '1.23 %', 0.00000643 ->
    '< 0.01 %', 0 -> '0 %'."""
    if fraction is None:
        return "-"
    percent = fraction * 100
    if percent == 0:
        return "0 %"
    if percent < 0.01:
        return "< 0.01 %"
    return f"{percent:.2f} %" if percent < 10 else f"{percent:.1f} %"


def took(start: str | None, end: str | None) -> str:
    """How long from one API time to another ('-' when either is unknown)."""
    began, ended = parse_time(start), parse_time(end)
    if began is None or ended is None:
        return "-"
    return duration((ended - began).total_seconds())


def ago(value: str | None, now: datetime | None = None) -> str:
    """An API time as '5s ago', '3h 2m ago' (or 'in 5m' for a time ahead)."""
    moment = parse_time(value)
    if moment is None:
        return "-" if not value else clean(value)
    delta = ((now or datetime.now(UTC)) - moment).total_seconds()
    return f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"


def when(value: str | None) -> str:
    """An API time in this machine's zone, with how long ago it was."""
    moment = parse_time(value)
    if moment is None:
        return "-" if not value else clean(value)
    local = moment.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"{local} ({ago(value)})"


def table(headers: list[str], rows: list[list], right: tuple[str, ...] = ()) -> str:
    """Aligned columns, two spaces apart; the columns named in `right` (numbers) are
    right-aligned. Cells are clean()ed."""
    cells = [[clean(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if h in right else v.ljust(w)
            for h, v, w in zip(headers, values, widths, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def fields(pairs: list[tuple[str, object]]) -> str:
    """'name  value' lines, the names aligned; pairs whose value is None are left out."""
    shown = [(name, clean(value)) for name, value in pairs if value is not None]
    width = max((len(name) for name, _ in shown), default=0)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in shown)


def metrics(values: dict | None) -> str | None:
    if not values:
        return None
    return ", ".join(f"{name}={_number(value)}" for name, value in values.items())


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
