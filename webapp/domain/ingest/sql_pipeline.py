"""Statements sent without waiting for their answers, for the ingest path: prepared
once per connection on PostgreSQL, and grouped into one round trip by pipeline()."""

from __future__ import annotations

import time
from contextlib import contextmanager

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections


class Pending:
    """The answer to a statement already sent; result() waits for it if need be."""

    def __init__(self, cursor=None, returning: bool = False, convert=None, value=None):
        self._cursor, self._returning, self._convert, self._value = (
            cursor,
            returning,
            convert,
            value,
        )

    @classmethod
    def done(cls, value) -> Pending:
        return cls(value=value)

    def result(self):
        if self._cursor is None:
            return self._value
        cursor, self._cursor = self._cursor, None
        with connection.wrap_database_errors:
            try:
                rows = cursor.fetchall() if self._returning else []
            finally:
                cursor.close()
        self._value = self._convert(rows) if self._convert else rows
        return self._value


def send(sql: str, params, returning: bool, convert=None) -> Pending:
    cursor = new_cursor()
    try:
        execute(cursor, sql, params)
    except BaseException:
        cursor.close()
        raise
    return Pending(cursor, returning, convert)


def generic_plans_later() -> Pending | None:
    """For the rest of the transaction, prepared statements run on their generic plan
    instead of being planned again at each execution (PostgreSQL's default for a
    statement whose first custom plans were no dearer). The ingest path's statements are
    lookups and inserts by unique keys, whose generic plan is the custom one: planning
    them again was about a fifth of PostgreSQL's CPU in a small transaction
    (docs/benchmarks.md). Sent in the first pipeline; None on SQLite."""
    if connection.vendor != "postgresql":
        return None
    cursor = new_cursor()
    try:
        with connection.wrap_database_errors:
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan", prepare=False)
    except BaseException:
        cursor.close()
        raise
    return Pending(cursor, False)


def commit_later() -> Pending:
    """COMMIT, sent with the other statements of a pipeline: a transaction's last
    writes and its commit in one round trip. Only in the outermost atomic block, as its
    last statement: Django's own commit at the end of the block then has nothing to do
    (psycopg sends nothing when no transaction is open), and on_commit hooks run then."""
    cursor = new_cursor()
    try:
        with connection.wrap_database_errors:
            cursor.execute("COMMIT", prepare=False)  # a transaction command: not prepared
    except BaseException:
        cursor.close()
        raise
    return Pending(cursor, False)


@contextmanager
def pipeline():
    """The statements sent inside go to PostgreSQL together and their answers come
    back together: one round trip where each would wait for its own (psycopg's
    pipeline mode). Only statements that do not need each other's results belong in
    one; read them with Pending.result() inside or after the block. Elsewhere, and when
    already inside one, a no-op."""
    if connection.vendor != "postgresql":
        yield
        return
    connection.ensure_connection()
    raw = connection.connection
    if raw._pipeline is not None:
        yield
        return
    with connection.wrap_database_errors, raw.pipeline():
        yield


def execute(cursor, sql: str, params) -> None:
    if isinstance(cursor, psycopg.Cursor):
        # Prepared once per connection and statement text: PostgreSQL then skips the
        # parse and reuses its plan (about 0.1-0.2 ms of its CPU per statement). Errors
        # become Django's (IntegrityError, OperationalError...) and mark the connection
        # as Django's own cursor would, so a broken one is replaced.
        with connection.wrap_database_errors:
            cursor.execute(sql, params, prepare=True)
    else:
        cursor.execute(sql, params)


def new_cursor():
    """On PostgreSQL a cursor that binds parameters on the server, so psycopg prepares
    a statement it sees repeatedly; elsewhere Django's cursor."""
    db = connections[DEFAULT_DB_ALIAS]  # not the proxy: each of its lookups costs
    if db.vendor != "postgresql":
        return db.cursor()
    if db.connection is None:
        db.ensure_connection()
    if db.queries_logged:
        return _LoggedCursor(db.connection)
    return psycopg.Cursor(db.connection)


class _LoggedCursor(psycopg.Cursor):
    """Records its statements where Django records its own (DEBUG, and the tests'
    query counts), so that the ingest path's bounded work stays visible."""

    def execute(self, query, params=None, **kwargs):
        started = time.monotonic()
        try:
            return super().execute(query, params, **kwargs)
        finally:
            connection.queries_log.append(
                {"sql": query, "time": f"{time.monotonic() - started:.3f}"}
            )
