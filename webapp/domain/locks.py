"""Row locks: one way to take them, one order to take them in.

Every transaction that locks rows takes them with for_update(), and in this order, never
an earlier kind after a later one:

    project → run → checkpoint → validation → validation part → replica → resume
            → notification

(ingest locks its runs, then their checkpoints, each kind in primary-key order:
webapp/domain/ingest/bulk_select.py, in SQL of its own with the same lock strength).

Two rules keep PostgreSQL free of deadlocks under concurrent ingest, validation,
replication, retention, restore tests and launches:

* Only the rows meant (`of=("self",)`). FOR UPDATE on a query with joins locks every
  joined row: a replication that read its checkpoint's project and run with the replica
  locked both, in an order of its own, and deadlocked against ingest and validation.
* FOR NO KEY UPDATE, never FOR UPDATE. Lifeboat never changes a primary key, and FOR
  UPDATE also blocks the FOR KEY SHARE lock PostgreSQL takes on a row whenever a row
  that points to it is written (an event naming its run, a replica naming its target,
  anything naming its project). With FOR UPDATE, a worker inserting an event waited on
  the run ingest had locked, while ingest waited on the checkpoint that worker held.

SQLite has no row locks (it serialises writers), and Django leaves the clause out there.
tests/test_locks.py holds every lock in webapp/ to this module.
"""

from __future__ import annotations

from django.db.models import Manager, QuerySet

ORDER = (
    "project",
    "run",
    "checkpoint",
    "validation",
    "validationpart",
    "replica",
    "resume",
    "notification",
)


def for_update(queryset: QuerySet | Manager, *, skip_locked: bool = False) -> QuerySet:
    """The rows of `queryset` (not those of its select_related joins), locked until the
    transaction ends, without blocking inserts of rows that point to them."""
    return queryset.select_for_update(no_key=True, of=("self",), skip_locked=skip_locked)
