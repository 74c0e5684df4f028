"""Sizes, numbers and durations as a person reads them: the one set of formatters of
the code base.

The client prints them (progress bars, `lifeboat` commands) and the server shows them
(the dashboard's `bytes`, `num` and `seconds` filters, alerts, validation and restore-test
messages): the server depends on this package, so both say "1.5 KiB", "0.0566" and
"4.4 ms" the same way. Standard library only, Python 3.9."""

from __future__ import annotations

import math

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_size(count: float) -> str:
    """1536 -> '1.5 KiB'; binary units, as file systems and `du -h` report."""
    size = float(count)
    for unit in UNITS:
        if abs(size) < 1024 or unit == UNITS[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # the loop returns at the last unit


def finite(value) -> float | None:
    """value as a finite float, or None (None, text, NaN, infinities, booleans)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def format_number(value, digits: int = 3) -> str:
    """0.05664975 -> '0.0566'; 76564 -> '76,564'; 1234.5 -> '1,234'; 12.345 -> '12.3'.

    Whole numbers keep every digit; others keep `digits` significant ones, and past a
    thousand the digits before the point (a loss of 1,234.5 reads as 1,234)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    number = finite(value)
    if number is None:
        return "" if value is None else str(value)
    if number == int(number) and abs(number) < 1e15:
        return f"{int(number):,}"
    if abs(number) >= 10 ** (digits - 1):
        return f"{round(number):,}"
    return f"{number:.{digits}g}"  # 1.23e-05 below 1e-4: leading zeros would hide it


def format_seconds(value) -> str:
    """0.004394 -> '4.4 ms'; 12.34 -> '12.3 s'; 600 -> '10 min'; 5400 -> '1 h 30 min';
    200000 -> '2 d 7 h'. Never '0 s' for something that took time."""
    number = finite(value)
    if number is None:
        return ""
    sign, number = ("-" if number < 0 else ""), abs(number)
    if number == 0:
        return "0 s"
    if number < 1e-3:
        return f"{sign}{_two_figures(number * 1e6)} µs"
    if number < 1:
        return f"{sign}{_two_figures(number * 1e3)} ms"
    if number < 59.5:
        return f"{sign}{_two_figures(number)} s"
    return sign + coarse_duration(round(number))


def coarse_duration(seconds: int) -> str:
    """Two units at most: '1 min 30 s', '2 h 5 min', '3 d 4 h'."""
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min" + (f" {s} s" if s else "")
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h" + (f" {m} min" if m else "")
    days, h = divmod(hours, 24)
    return f"{days} d" + (f" {h} h" if h else "")


def _two_figures(value: float) -> str:
    """4.394 -> '4.4', 43.94 -> '43.9', 439.4 -> '439': one decimal at most, two figures
    below ten."""
    if value < 9.95:
        return f"{value:.2g}"
    return f"{value:.3g}" if value < 99.5 else f"{value:.0f}"
