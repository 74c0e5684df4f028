"""Run names in natural order: run-3 before run-28, as a person reads them.

The database sorts, with a collation named `natural_sort`: on PostgreSQL an ICU
collation with numeric ordering (`und-u-kn-true`, created by migration
0013_settings_tokens_natural_sort together with an index on the expression, so that a
page of the runs list sorted by name reads 50 index entries, not every run); on SQLite a
Python collation registered on each new connection. The sort key is what the list shows:
the run's name, or its key when it has none."""

from __future__ import annotations

import re

from django.db.backends.signals import connection_created
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Collate, NullIf

COLLATION = "natural_sort"
_DIGITS = re.compile(r"(\d+)")


def shown_name():
    """The expression the list sorts by: Collate(COALESCE(NULLIF(name, ''), key))."""
    return Collate(Coalesce(NullIf(F("name"), Value("")), F("key")), COLLATION)


def natural_key(text: str) -> tuple:
    """'run-28' -> ('run-', (28, '28'), ''): numbers compare as numbers, text as text
    (case-folded first, then as written, so the order is total)."""
    parts = _DIGITS.split(text)
    return tuple(
        (int(part), part) if index % 2 else (part.casefold(), part)
        for index, part in enumerate(parts)
    )


def _compare(a: str, b: str) -> int:
    ka, kb = natural_key(a), natural_key(b)
    return (ka > kb) - (ka < kb)


def register_sqlite_collation(sender, connection, **kwargs) -> None:
    if connection.vendor == "sqlite":
        connection.connection.create_collation(COLLATION, _compare)


connection_created.connect(register_sqlite_collation, dispatch_uid="lifeboat-natural-sort")
