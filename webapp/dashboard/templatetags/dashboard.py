"""Small template helpers of the dashboard: sortable column headers, the badge colour
of an event type. Numbers, sizes and times: numbers.py, a builtin of every template."""

from __future__ import annotations

from django import template
from django.utils.html import format_html

from webapp.dashboard.run_sorting import RUN_SORTS
from webapp.dashboard.templatetags.numbers import format_seconds

register = template.Library()


@register.simple_tag(takes_context=True)
def sort_link(context, key: str, label: str):
    """A column header that sorts by `key`, keeping the other filters. On the current
    sort it reverses the direction; the arrow says the direction shown: ↑ ascending,
    ↓ descending."""

    request = context["request"]
    query = request.GET.copy()
    query["sort"] = key
    query.pop("page", None)
    query.pop("dir", None)
    current = context.get("sort") == key
    direction = context.get("direction") if current else None
    if current:
        query["dir"] = "asc" if direction == "desc" else "desc"
    words = {"asc": "ascending", "desc": "descending"}
    return format_html(
        '<a href="?{}"{} title="{}">{}{}</a>',
        query.urlencode(),
        format_html(' aria-current="true" class="sorted" data-dir="{}"', direction)
        if current
        else "",
        f"Sorted {words[direction]}; sort {words[query['dir']]}"
        if current
        else f"Sort by {label.lower()} ({words[RUN_SORTS[key][1]]})",
        label,
        (" ↑" if direction == "asc" else " ↓") if current else "",
    )


@register.filter
def duration(seconds) -> str:
    """1800 -> '30 min'; 90 -> '1 min 30 s'; 0.4 -> '400 ms' (numbers.format_seconds)."""
    return format_seconds(seconds)


_TONES = {
    "verified": "ok",
    "finished": "ok",
    "pinned": "info",
    "unpinned": "info",
    "started": "info",
    "saved": "info",
    "resumed": "info",
    "replicated": "ok",
    "suspicious": "warn",
    "validation_requested": "info",
    "corrupt": "bad",
    "missing": "bad",
    "failed": "bad",
    "deleted": "muted",
    "deleting": "muted",
}


@register.filter
def event_tone(event_type: str) -> str:
    """checkpoint.corrupt -> 'bad': the colour of its badge on the timeline."""
    return _TONES.get(event_type.rsplit(".", 1)[-1], "muted")


@register.filter
def event_summary(event) -> str:
    """One line for a timeline row: the event's message, or what its data says."""
    if event.message:
        return event.message
    data = event.data or {}
    parts = []
    if data.get("error"):
        parts.append(str(data["error"]))
    if data.get("exit_code") is not None:
        parts.append(f"exit code {data['exit_code']}")
    if data.get("save_seconds") is not None:
        parts.append(f"saved in {format_seconds(data['save_seconds'])}")
    if data.get("location"):
        parts.append(str(data["location"]))
    if data.get("host"):
        parts.append(f"on {data['host']}")
    if data.get("resumed_from"):
        parts.append(f"resumed from checkpoint {data['resumed_from']}")
    return " · ".join(parts)


@register.filter
def duration_precise(seconds) -> str:
    """The same as duration: format_seconds scales from µs to days."""
    return format_seconds(seconds)


@register.simple_tag
def interval_verdict(actual: float, recommended: float) -> str:
    """How the interval used compares with the recommended one, in words."""
    if not recommended:
        return ""
    ratio = actual / recommended
    if 0.8 <= ratio <= 1.25:
        return "about as often as it should"
    if ratio < 1:
        return f"{1 / ratio:.1f}× more often than it needs to"
    return f"{ratio:.1f}× less often than it should"
