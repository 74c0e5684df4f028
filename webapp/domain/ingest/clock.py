"""Which clock to believe for an event: its own, unless that is impossible.

A job stamps each event with its own clock; Lifeboat stamps its receipt. The job's time is
the better one (an event spooled through an outage arrives late but happened when it
says), except when it cannot be right: later than its receipt (beyond a small skew), or
older than any spool keeps events. Then the receipt time stands in. One rule, used where
events fold into runs (ingest) and where the goodput ledger reads them back, so that an
event claiming the year 2000 can neither make a run 26 years long nor skew the MTBF.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings


def trusted_time(claimed: datetime, received: datetime) -> datetime:
    """`claimed` when it is possible for an event received at `received`, else `received`."""
    ahead = timedelta(seconds=settings.EVENT_CLOCK_AHEAD_S)
    behind = timedelta(seconds=settings.EVENT_CLOCK_BEHIND_S)
    if received - behind <= claimed <= received + ahead:
        return claimed
    return received


def believable_times(events: list[tuple[object, str, datetime, datetime]]) -> list[datetime]:
    """For (run, type, claimed, received) tuples, the times to fold them in with, in the
    same order: each event's trusted_time, except that a run.started stamped impossibly
    takes its run's earliest believable time among `events` (else its receipt). A start
    claiming the year 2000 then neither makes the run 26 years long nor, arriving with
    the events it precedes, looks like a restart after them."""
    times = [trusted_time(claimed, received) for _, _, claimed, received in events]
    earliest: dict[object, datetime] = {}
    for (run, _, claimed, _), when in zip(events, times, strict=True):
        if when == claimed:
            earliest[run] = min(earliest.get(run, when), when)
    return [
        min(when, earliest.get(run, when)) if type_ == "run.started" and when != claimed else when
        for (run, type_, claimed, _), when in zip(events, times, strict=True)
    ]
