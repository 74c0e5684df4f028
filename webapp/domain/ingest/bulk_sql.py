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
from collections.abc import Sequence
from functools import lru_cache
from typing import cast

import orjson
from django.db import connection, models

from webapp.domain.ingest.sql_pipeline import Pending, execute, new_cursor, send

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
    return insert_rows_later(
        model, attnames, rows, ignore_conflicts_on=ignore_conflicts_on, returning=returning
    ).result()


def insert_rows_later(
    model: type[models.Model],
    attnames: Sequence[str],
    rows: Sequence[Sequence],
    *,
    ignore_conflicts_on: Sequence[str] = (),
    returning: Sequence[str] = (),
) -> Pending:
    """insert_rows, whose rows are read later: inside pipeline() the statement is sent
    at once and its answer waited for together with the others'."""
    if not rows:
        return Pending.done([])
    if connection.vendor != "postgresql":
        return Pending.done(
            _insert_portable(model, tuple(attnames), rows, ignore_conflicts_on, returning)
        )
    sql, source = _insert_sql(
        model,
        tuple(attnames),
        tuple(ignore_conflicts_on),
        tuple(returning),
        len(rows) >= _ARRAYS_FROM_ROWS,
    )
    return send(sql, source.params(rows), bool(returning))


def insert_rows_by_key_later(
    model: type[models.Model],
    attnames: Sequence[str],
    rows: Sequence[Sequence],
    *,
    fk: str,
    target: type[models.Model],
    match: tuple[str, str],
    ignore_conflicts_on: Sequence[str] = (),
    returning: Sequence[str] = (),
) -> Pending:
    """insert_rows_later (PostgreSQL only) where each row names the row its foreign key
    fk points to by a key instead of an id: in fk's place the row holds the value of
    target's column match[1], for the target row whose column match[0] equals the row's
    own match[0]. Rows whose target does not exist are not inserted (nor returned).

    Why: the insert need not wait for the target's id to be read first, so it can go
    in the same round trip as that read (pipeline())."""
    if not rows:
        return Pending.done([])
    sql, source = _insert_by_key_sql(
        model,
        tuple(attnames),
        fk,
        target,
        match,
        tuple(ignore_conflicts_on),
        tuple(returning),
        len(rows) >= _ARRAYS_FROM_ROWS,
    )
    return send(sql, source.params(rows), bool(returning))


@lru_cache(maxsize=16)
def _insert_by_key_sql(model, attnames, fk, target, match, conflict_on, returning, arrays):
    quote = connection.ops.quote_name
    fields = _fields(model, attnames)
    at = attnames.index(fk)
    shared, key = match
    key_field = target._meta.get_field(key)
    source = _source_of((*fields[:at], key_field, *fields[at + 1 :]), arrays)
    values = source.columns()
    own_shared = values[attnames.index(shared)]
    target_shared = quote(target._meta.get_field(shared).column)
    join = f"k.{target_shared} = {own_shared} AND k.{quote(key_field.column)} = {values[at]}"
    values[at] = f"k.{quote(target._meta.pk.column)}"
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
        f"SELECT {', '.join(values)} FROM {source.sql('r')} "
        f"JOIN {quote(target._meta.db_table)} AS k ON {join}"
        f"{_tail(conflict_on, returning)}"
    )
    return sql, source


def _tail(conflict_on: Sequence[str], returning: Sequence[str]) -> str:
    quote = connection.ops.quote_name
    conflict = ""
    if conflict_on:
        conflict = f" ON CONFLICT ({', '.join(quote(c) for c in conflict_on)}) DO NOTHING"
    back = f" RETURNING {', '.join(quote(c) for c in returning)}" if returning else ""
    return conflict + back


# Statement texts are built once per shape and process: building them took a third of
# a single event's CPU (field types, quoting).
@lru_cache(maxsize=256)
def _insert_sql(model, attnames, conflict_on, returning, arrays) -> tuple[str, _Source]:
    quote = connection.ops.quote_name
    fields = _fields(model, attnames)
    source = _source_of(fields, arrays)
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
        f"SELECT {', '.join(source.columns())} FROM {source.sql('r')}"
        f"{_tail(conflict_on, returning)}"
    )
    return sql, source


# Rows reach PostgreSQL in one of two shapes. A few rows (a single event, a small
# group): one JSON document, which orjson writes in C in microseconds, where binding an
# array per column cost psycopg tens of microseconds per array in Python (0.8 ms of a
# single event). Many rows (a batch): one binary array per column, which PostgreSQL
# reads without parsing text; for 1000 rows JSON cost it three times the CPU.
_ARRAYS_FROM_ROWS = 20


class _Source:
    """A FROM item that yields the rows, with one parameter or one per column."""

    def __init__(self, fields: tuple, arrays: bool):
        self.fields, self.arrays = fields, arrays
        self.floats = tuple(i for i, f in enumerate(fields) if isinstance(f, models.FloatField))
        self.json_columns = tuple(i for i, f in enumerate(fields) if _is_json(f))

    def sql(self, alias: str) -> str:
        if not self.arrays:
            return f"jsonb_array_elements(%s::jsonb) AS {alias}"
        unnest = ", ".join(
            "%b::text[]" if _is_json(f) else f"%b::{_cast(f)}[]" for f in self.fields
        )
        names = ", ".join(f"c{i}" for i in range(len(self.fields)))
        return f"unnest({unnest}) AS {alias}({names})"

    def columns(self, alias: str = "r") -> list[str]:
        """The SQL of each value of a row, as its field's type."""
        out = []
        for i, field in enumerate(self.fields):
            if self.arrays:
                out.append(f"{alias}.c{i}::jsonb" if _is_json(field) else f"{alias}.c{i}")
            elif _is_json(field):
                out.append(f"NULLIF({alias}->{i}, 'null'::jsonb)")
            else:
                out.append(f"({alias}->>{i})::{_cast(field)}")
        return out

    def params(self, rows) -> list:
        if self.arrays:
            return [
                [None if row[i] is None else _json_text(row[i]) for row in rows]
                if i in self.json_columns
                else [row[i] for row in rows]
                for i in range(len(self.fields))
            ]
        if self.floats:
            rows = [_finite(row, self.floats) for row in rows]
        try:
            return [orjson.dumps(rows).decode()]
        except TypeError:  # an integer over 64 bits: PostgreSQL's own error is the clear one
            return [json.dumps(rows, default=str)]


@lru_cache(maxsize=128)
def _source_of(fields: tuple, arrays: bool) -> _Source:
    return _Source(fields, arrays)


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


def _cast(field) -> str:
    # Without the length: an explicit cast to varchar(n) would cut a longer string
    # silently, where storing it into the column refuses it.
    db_type = field.db_type(connection)
    return db_type.split("(")[0] if db_type.startswith("varchar") else db_type


def _insert_portable(model, attnames, rows, conflict_on, returning) -> list[tuple]:
    quote = connection.ops.quote_name
    fields = _fields(model, attnames)
    table = quote(model._meta.db_table)
    columns = ", ".join(quote(f.column) for f in fields)
    tail = _tail(conflict_on, returning)
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
    # A concrete model's pk field has its column (the stubs allow None before it is bound).
    table, pk_column = quote(model._meta.db_table), quote(cast(str, model._meta.pk.column))
    sql = f"UPDATE {table} SET {assignments} WHERE {pk_column} = %s"  # noqa: S608
    with new_cursor() as cursor:
        execute(cursor, sql, params)


def update_rows_later(
    model: type[models.Model], attnames: Sequence[str], rows: Sequence[Sequence]
) -> Pending:
    """UPDATE the given columns of many rows in one statement: rows are (pk, *values in
    the order of attnames)."""
    if not rows:
        return Pending.done([])
    attnames = tuple(attnames)
    if connection.vendor != "postgresql":
        for pk, *values in rows:
            update_row(model, pk, dict(zip(attnames, values, strict=True)))
        return Pending.done([])
    sql, source = _update_sql(model, attnames, len(rows) >= _ARRAYS_FROM_ROWS)
    return send(sql, source.params(rows), False)


@lru_cache(maxsize=256)
def _update_sql(model, attnames, arrays) -> tuple[str, _Source]:
    pk_field = model._meta.pk
    fields = (pk_field, *_fields(model, attnames))
    source = _source_of(fields, arrays)
    quote = connection.ops.quote_name
    pk_value, *values = source.columns()
    assignments = ", ".join(
        f"{quote(f.column)} = {value}" for f, value in zip(fields[1:], values, strict=True)
    )
    sql = (
        f"UPDATE {quote(model._meta.db_table)} AS t SET {assignments} "  # noqa: S608
        f"FROM {source.sql('r')} WHERE t.{quote(pk_field.column)} = {pk_value}"
    )
    return sql, source


def insert_with_children_later(
    parent: type[models.Model],
    attnames: Sequence[str],
    rows: Sequence[Sequence],
    key: Sequence[str],
    child: type[models.Model],
    child_attnames: Sequence[str],
    child_rows: Sequence[Sequence],
) -> Pending:
    """INSERT parent rows and their children in one statement; the answer is (pk, *key)
    for each parent row. key: attnames of the parent that identify a row of this
    insert (they must be among attnames); child_attnames: the child's columns, its
    foreign key to the parent first; child_rows: (*key values, *the other columns), the
    key naming the parent whose new pk fills the foreign key."""
    if not rows:
        return Pending.done([])
    if connection.vendor != "postgresql" or not child_rows:
        back = insert_rows(parent, attnames, rows, returning=("id", *key))
        ids = {tuple(found[1:]): found[0] for found in back}
        width = len(key)
        insert_rows(
            child,
            child_attnames,
            [(ids[tuple(row[:width])], *row[width:]) for row in child_rows],
        )
        return Pending.done(back)
    sql, source, child_source = _children_sql(
        parent,
        tuple(attnames),
        tuple(key),
        child,
        tuple(child_attnames),
        len(rows) >= _ARRAYS_FROM_ROWS,
        len(child_rows) >= _ARRAYS_FROM_ROWS,
    )
    return send(sql, [*source.params(rows), *child_source.params(child_rows)], True)


@lru_cache(maxsize=64)
def _children_sql(parent, attnames, key, child, child_attnames, arrays, child_arrays):
    quote = connection.ops.quote_name
    fields = _fields(parent, attnames)
    key_fields = _fields(parent, key)
    child_fields = _fields(child, child_attnames)
    source = _source_of(fields, arrays)
    # Child rows: the parent's key first, then the child's columns after its foreign key.
    child_source = _source_of((*key_fields, *child_fields[1:]), child_arrays)
    pk = quote(parent._meta.pk.column)
    key_columns = [quote(f.column) for f in key_fields]
    child_values = child_source.columns("x")
    width = len(key)
    join = " AND ".join(
        f"p.{column} = {value}"
        for column, value in zip(key_columns, child_values[:width], strict=True)
    )
    sql = (
        f"WITH p AS (INSERT INTO {quote(parent._meta.db_table)} "  # noqa: S608
        f"({', '.join(quote(f.column) for f in fields)}) "
        f"SELECT {', '.join(source.columns())} FROM {source.sql('r')} "
        f"RETURNING {pk}, {', '.join(key_columns)}), "
        f"c AS (INSERT INTO {quote(child._meta.db_table)} "
        f"({', '.join(quote(f.column) for f in child_fields)}) "
        f"SELECT p.{pk}, {', '.join(child_values[width:])} "
        f"FROM {child_source.sql('x')} JOIN p ON {join}) "
        f"SELECT {pk}, {', '.join(key_columns)} FROM p"
    )
    return sql, source, child_source
