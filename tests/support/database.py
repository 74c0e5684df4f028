"""After a transactional test (django_db(transaction=True)), Django empties every table
with its `flush`, which on PostgreSQL is one TRUNCATE of all of them. TRUNCATE makes new
files for every table and its indexes: 0.2 s on an idle machine, 0.6 s (median) and up
to 3 s with the suite running, after each of some 400 tests, about a sixth of the whole
suite's process time. DELETE FROM every table empties the same tables in about 0.02 s:
the foreign keys Django makes are deferred to the commit, so the order does not matter,
and the row triggers of migration 0014 (run stats) only update a table emptied too.

One difference matters: TRUNCATE waits for every other session's lock on a table, DELETE
does not. A process that still wrote after its test had ended would leave rows for the
next test; a test's own servers and workers stop in its fixtures' teardown, before the
flush, and a module's shared ones are idle once its test has seen the outcome it waits
for. Measured on the whole suite (`make test`, PostgreSQL): 905 s with TRUNCATE, 755 s
with DELETE, every test passing both times.

Loaded by tests/conftest.py (pytest_plugins)."""

from __future__ import annotations

from django.db.backends.postgresql.operations import DatabaseOperations

_truncate = DatabaseOperations.sql_flush


def _sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    if reset_sequences or allow_cascade or not tables:
        # Sequences restarted, or tables outside `tables` emptied too: TRUNCATE's own
        # options, which no DELETE has (no test asks for them today).
        return _truncate(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )
    delete = style.SQL_KEYWORD("DELETE FROM")
    return [f"{delete} {style.SQL_FIELD(self.quote_name(table))};" for table in tables]


def pytest_configure(config):
    DatabaseOperations.sql_flush = _sql_flush
