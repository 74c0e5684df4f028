"""The runs list's sorts: each column's ordering, its first direction, its exact
reverse (which an index serves by scanning backwards), and the pager's words for it."""

from __future__ import annotations

from django.db.models import F

from webapp.dashboard import natural_sort

# Each sort's ordering in its first direction (the one a click on a new header gives)
# and that direction; the other direction is its exact reverse (run_ordering), which an
# index serves by scanning backwards.
RUN_SORTS = {
    "activity": (("-last_seen_at", "-id"), "desc"),
    "name": ((natural_sort.shown_name().asc(), "key"), "asc"),
    "status": (("status", "-last_seen_at"), "asc"),
    "step": ((F("last_step").desc(nulls_last=True), "-id"), "desc"),
    "age": ((F("last_checkpoint_at").asc(nulls_last=True), "-id"), "asc"),
    "storage": (("-storage_bytes", "-id"), "desc"),
}


def run_ordering(sort: str, direction: str) -> list:
    """The ORDER BY of a sort in a direction: as listed, or each term reversed."""
    terms, first = RUN_SORTS[sort]
    if direction == first:
        return list(terms)
    return [
        (term[1:] if term.startswith("-") else "-" + term)
        if isinstance(term, str)
        else term.copy().reverse_ordering()  # in place otherwise: RUN_SORTS would flip
        for term in terms
    ]


def sort_and_direction(request) -> tuple[str, str]:
    sort = request.GET.get("sort", "activity")
    if sort not in RUN_SORTS:
        sort = "activity"
    direction = request.GET.get("dir", "")
    if direction not in ("asc", "desc"):
        direction = RUN_SORTS[sort][1]
    return sort, direction


def pager_labels(sort: str, direction: str) -> tuple[str, str]:
    """ "Newer"/"Older" only where the list is in time order; otherwise "Previous"/"Next"."""
    if sort == "activity":
        return ("← Newer", "Older →") if direction == "desc" else ("← Older", "Newer →")
    return "← Previous", "Next →"
