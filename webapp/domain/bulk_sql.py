"""Multi-row INSERT and one-row UPDATE for the ingest path, without the ORM's compiler.

Why: the ingest endpoint is the hottest path of the server. Django's bulk_create
renders every value through the field, then psycopg quotes each one into the SQL text
in Python (Django uses client-side binding): about 0.5 ms of CPU per event in a batch,
and 0.3–0.5 ms per statement for a single event, more than PostgreSQL spends storing
it. Here PostgreSQL gets one prepared statement per table whatever the batch size,
with every row in one JSON parameter (jsonb_array_elements) that orjson writes in C;
SQLite gets plain multi-row VALUES through Django's cursor.

Values are given by attribute name (``run_id``, not ``run``) as plain Python values;
JSON fields take Python objects. Only quoted identifiers and placeholders are formatted
into the SQL; every value is a parameter.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from functools import lru_cache

import orjson
import psycopg
from django.db import connection, models

# SQLite allows 32,766 host parameters per statement; stay well under it.
_SQLITE_ROWS_PER_STATEMENT = 500


@lru_cache(maxsize=64)
def _fields(model: type[models.Model], attnames: tuple[str, ...]) -> tuple:
    by_attname = {f.attname: f for f in model._meta.concrete_fields}
    return tuple(by_attname[name] for name in attnames)


def _json_text(value) -> str:
    # orjson is several times faster than json; it refuses what JSON cannot hold
    # (NaN, integers over 64 bits), which the stdlib then writes as Django would.
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)


def _is_json(field) -> bool:
    return isinstance(field, models.JSONField)


def insert_rows(
    model: type[models.Model],
    attnames: Sequence[str],
    rows: Sequence[Sequence],
    *,
    ignore_conflicts_on: Sequence[str] = (),
    returning: Sequence[str] = (),
) -> list[tuple]:
    """INSERT rows (tuples in the order of attnames) into model's table.

    ignore_conflicts_on: the columns of a unique constraint; a row that collides is
    skipped (ON CONFLICT DO NOTHING). returning: the columns to give back for each row
    actually inserted, in no promised order (PostgreSQL returns them in input order
    for a plain INSERT ... SELECT, but callers must not rely on it)."""
    if not rows:
        return []
    attnames = tuple(attnames)
    fields = _fields(model, attnames)
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    columns = ", ".join(quote(f.column) for f in fields)
    conflict = ""
    if ignore_conflicts_on:
        conflict = f" ON CONFLICT ({', '.join(quote(c) for c in ignore_conflicts_on)}) DO NOTHING"
    back = f" RETURNING {', '.join(quote(c) for c in returning)}" if returning else ""
    if connection.vendor == "postgresql":
        return _insert_postgresql(table, columns, fields, rows, conflict + back, bool(returning))
    return _insert_portable(table, columns, fields, rows, conflict + back, bool(returning))


def _insert_postgresql(table, columns, fields, rows, tail, returning) -> list[tuple]:
    sql, float_columns = _postgresql_insert(table, columns, fields, tail)
    if float_columns:
        rows = [_finite(row, float_columns) for row in rows]
    # One JSON document holds every row: orjson writes it in C at about a microsecond a
    # row, where binding one array per column cost psycopg tens of microseconds per
    # array in Python, whatever the number of rows (about 0.8 ms per single event).
    try:
        payload = orjson.dumps(rows)
    except TypeError:  # an integer over 64 bits: PostgreSQL's own error is the clear one
        payload = json.dumps(rows, default=str).encode()
    with _cursor() as cursor:
        _execute(cursor, sql, (payload.decode(),))
        return cursor.fetchall() if returning else []


def _finite(row, float_columns) -> tuple:
    # JSON has no NaN or Infinity (orjson would write null); PostgreSQL reads them from
    # the strings 'NaN', 'Infinity' and '-Infinity'.
    if not any(isinstance(row[i], float) and not math.isfinite(row[i]) for i in float_columns):
        return row
    row = list(row)
    for i in float_columns:
        value = row[i]
        if isinstance(value, float) and not math.isfinite(value):
            row[i] = "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    return tuple(row)


@lru_cache(maxsize=64)
def _postgresql_insert(table: str, columns: str, fields: tuple, tail: str) -> tuple[str, tuple]:
    """The statement (rows as one JSON array of arrays, bound as one parameter) and the
    positions of float columns."""
    select = ", ".join(
        f"NULLIF(r->{i}, 'null'::jsonb)" if _is_json(f) else f"(r->>{i})::{_cast(f)}"
        for i, f in enumerate(fields)
    )
    sql = (
        f"INSERT INTO {table} ({columns}) SELECT {select} "  # noqa: S608 (identifiers only)
        f"FROM jsonb_array_elements(%s::jsonb) AS r{tail}"
    )
    floats = tuple(i for i, f in enumerate(fields) if isinstance(f, models.FloatField))
    return sql, floats


def _cast(field) -> str:
    # Without the length: an explicit cast to varchar(n) would cut a longer string
    # silently, where storing it into the column refuses it.
    db_type = field.db_type(connection)
    return db_type.split("(")[0] if db_type.startswith("varchar") else db_type


def _insert_portable(table, columns, fields, rows, tail, returning) -> list[tuple]:
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    out: list[tuple] = []
    with connection.cursor() as cursor:
        for start in range(0, len(rows), _SQLITE_ROWS_PER_STATEMENT):
            chunk = rows[start : start + _SQLITE_ROWS_PER_STATEMENT]
            params = [
                field.get_db_prep_save(value, connection)
                for row in chunk
                for field, value in zip(fields, row, strict=True)
            ]
            sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * len(chunk))}{tail}"  # noqa: S608
            cursor.execute(sql, params)
            if returning:
                out.extend(cursor.fetchall())
    return out


def update_row(model: type[models.Model], pk, values: dict) -> None:
    """UPDATE one row's columns by primary key (values by attname)."""
    if not values:
        return
    attnames = tuple(sorted(values))
    fields = _fields(model, attnames)
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(f.column)} = %s" for f in fields)
    params = [f.get_db_prep_save(values[f.attname], connection) for f in fields]
    params.append(pk)
    table, pk_column = quote(model._meta.db_table), quote(model._meta.pk.column)
    sql = f"UPDATE {table} SET {assignments} WHERE {pk_column} = %s"  # noqa: S608
    with _cursor() as cursor:
        _execute(cursor, sql, params)


def select_locked(model: type[models.Model], where: dict[str, Sequence]) -> list:
    """Rows whose columns are in the given values, locked FOR UPDATE (where the
    database has row locks), in primary-key order so that two transactions lock in the
    same order and wait for each other instead of deadlocking.

    Not a queryset: the ORM spends about 0.5 ms compiling each one, which is most of a
    single event's budget."""
    if any(not values for values in where.values()):
        return []
    quote = connection.ops.quote_name
    meta = model._meta
    fields = meta.concrete_fields
    columns = ", ".join(quote(f.column) for f in fields)
    postgresql = connection.vendor == "postgresql"
    conditions, params = [], []
    for column, values in where.items():
        if postgresql:  # one array parameter: the same statement text, prepared once
            conditions.append(f"{quote(column)} = ANY(%s)")
            params.append(list(values))
        else:
            conditions.append(f"{quote(column)} IN ({', '.join(['%s'] * len(values))})")
            params.extend(values)
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    sql = (
        f"SELECT {columns} FROM {quote(meta.db_table)} WHERE {' AND '.join(conditions)}"  # noqa: S608
        f" ORDER BY {quote(meta.pk.column)}{lock}"
    )
    with _cursor() as cursor:
        _execute(cursor, sql, params)
        rows = cursor.fetchall()
    converters = _converters(model)
    names = [f.attname for f in fields]
    out = []
    for row in rows:
        values = [
            value if convert is None or value is None else convert(value)
            for value, convert in zip(row, converters, strict=True)
        ]
        out.append(model.from_db(connection.alias, names, values))
    return out


@lru_cache(maxsize=16)
def _converters(model: type[models.Model]) -> tuple:
    """For each concrete field, the function that turns what the cursor gives into
    the Python value (JSON text into objects, SQLite's text into UUIDs and datetimes),
    or None where the value is already right."""
    out = []
    for field in model._meta.concrete_fields:
        converters = [
            *connection.ops.get_db_converters(field.get_col(field.model._meta.db_table)),
            *field.get_db_converters(connection),
        ]
        if not converters:
            out.append(None)
            continue
        expression = field.get_col(field.model._meta.db_table)

        def convert(value, converters=converters, expression=expression):
            for converter in converters:
                value = converter(value, expression, connection)
            return value

        out.append(convert)
    return tuple(out)


def _execute(cursor, sql: str, params) -> None:
    if isinstance(cursor, psycopg.Cursor):
        # Prepared once per connection and statement text: PostgreSQL then skips the
        # parse and reuses its plan (about 0.1-0.2 ms of its CPU per statement). Errors
        # become Django's (IntegrityError, OperationalError...) and mark the connection
        # as Django's own cursor would, so a broken one is replaced.
        with connection.wrap_database_errors:
            cursor.execute(sql, params, prepare=True)
    else:
        cursor.execute(sql, params)


def _cursor():
    """On PostgreSQL a cursor that binds parameters on the server, so psycopg prepares
    a statement it sees repeatedly; elsewhere Django's cursor."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.ensure_connection()
    if connection.queries_logged:
        return _LoggedCursor(connection.connection)
    return psycopg.Cursor(connection.connection)


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
