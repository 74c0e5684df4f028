"""A worker's lease on a row while it works on it: renewed in the background, so that a
row whose lease lapsed says "the worker holding me died", whatever phase it died in
(hashing, a load check in a child process, an upload).

The sweeper (webapp/domain/repair.py) sends the work of a lapsed lease again; the task
that takes it over checks the lease too, so a live worker is never doubled.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection
from django.utils import timezone

log = logging.getLogger(__name__)


@dataclass
class Busy:
    """Another worker holds the lease (or a retry is not due yet): look again in
    retry_in_s, in case its holder died."""

    retry_in_s: float


def busy_until(lease_until, now) -> Busy | None:
    if lease_until is not None and lease_until > now:
        return Busy((lease_until - now).total_seconds() + 0.5)
    return None


def until(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


@contextmanager
def kept(model, pk: int, seconds: float, field: str = "lease_until"):
    """Inside the block, `model` row `pk` has `field` renewed to now + `seconds` every
    third of it (from a thread, on a database connection of its own, so a renewal never
    waits for the block's own transaction). A renewal that fails (the database away) is
    logged and tried again at the next tick."""
    stop = threading.Event()

    def renew() -> None:
        try:
            while not stop.wait(seconds / 3):
                try:
                    model.objects.filter(pk=pk).update(**{field: until(seconds)})
                except Exception as exc:  # noqa: BLE001 (the next tick tries again)
                    log.warning("could not renew the lease of %s %s: %s", model.__name__, pk, exc)
                    connection.close()
        finally:
            connection.close()

    model.objects.filter(pk=pk).update(**{field: until(seconds)})
    thread = threading.Thread(target=renew, name=f"lease-{model.__name__}-{pk}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
