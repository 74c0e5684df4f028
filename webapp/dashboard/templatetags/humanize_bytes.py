from __future__ import annotations

from django import template

register = template.Library()

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


@register.filter(name="bytes")
def bytes_(value) -> str:
    """1536 -> '1.5 KiB' (binary units, as file systems and `du -h` report)."""
    try:
        size = float(value)
    except (TypeError, ValueError):
        return ""
    for unit in _UNITS:
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


@register.filter
def rate(value) -> str:
    """Bytes per second as '512.0 MiB/s'."""
    text = bytes_(value)
    return f"{text}/s" if text else ""


@register.filter
def eta(seconds) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    return f"{seconds // 60} min {seconds % 60:02d} s"
