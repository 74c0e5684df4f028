"""Numbers for people, in every template (a builtin library: settings.TEMPLATES).

    {{ 0.05664975196123123|num }}     0.0566      three significant digits
    {{ 76564|count }}                 76,564      thousands separators
    {{ 0.004394|seconds }}            4.4 ms      ms, s, min, h, d as the size asks
    {{ moment|ago }}                  12 s ago    also under a minute ("0 minutes" never)
    {{ 1536|bytes }}                  1.5 KiB     lifeboat.units.human_size, as the client

The plain functions live in lifeboat/units.py, shared with the client and the alerts."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone

from lifeboat.units import coarse_duration, finite, format_number, format_seconds, human_size

register = template.Library()


def format_ago(moment: datetime | None, now: datetime | None = None) -> str:
    """How long ago, in the units of format_seconds but whole: '12 s ago', '5 min ago',
    '3 h 2 min ago'; a moment ahead reads 'in 5 s'."""
    if not isinstance(moment, datetime):
        return ""
    delta = ((now or timezone.now()) - moment).total_seconds()
    if -1 < delta < 1:
        return "just now"
    text = coarse_duration(round(abs(delta))) if abs(delta) >= 59.5 else f"{round(abs(delta))} s"
    return f"{text} ago" if delta > 0 else f"in {text}"


@register.filter
def num(value, digits=3) -> str:
    """Significant digits and thousands separators; see format_number."""
    return format_number(value, int(digits))


@register.filter
def count(value) -> str:
    """A whole number with thousands separators: 76564 -> '76,564'."""
    number = finite(value)
    return "" if number is None else f"{round(number):,}"


@register.filter
def seconds(value) -> str:
    return format_seconds(value)


@register.filter
def ago(value) -> str:
    return format_ago(value)


@register.filter(name="bytes")
def bytes_(value) -> str:
    """1536 -> '1.5 KiB' (lifeboat.units.human_size: the client's too)."""
    number = finite(value)
    return "" if number is None else human_size(number)


@register.filter
def rate(value) -> str:
    """Bytes per second as '512.0 MiB/s'."""
    text = bytes_(value)
    return f"{text}/s" if text else ""


@register.filter
def eta(value) -> str:
    """Seconds left, as format_seconds whole: '45 s', '2 min 5 s'."""
    number = finite(value)
    if number is None:
        return ""
    return f"{round(number)} s" if number < 59.5 else coarse_duration(round(number))


@register.filter
def percent(fraction) -> str:
    """0.0123 -> '1.23 %'; 0.00000643 -> '< 0.01 %' (not '0.000643 %')."""
    number = finite(fraction)
    if number is None:
        return ""
    value = number * 100
    if 0 < abs(value) < 0.01:
        return "< 0.01 %" if value > 0 else "> -0.01 %"
    return f"{value:.3g} %" if abs(value) < 100 else f"{value:.0f} %"
