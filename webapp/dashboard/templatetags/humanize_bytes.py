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
