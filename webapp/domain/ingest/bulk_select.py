"""Rows locked for the ingest path, without the ORM's compiler (why:
webapp/domain/ingest/bulk_sql.py's docstring), read back as the ORM would load them.

The lock is FOR NO KEY UPDATE, as every row lock of Lifeboat's (webapp/domain/locks.py:
FOR UPDATE would also block workers that insert a row naming a locked run)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import cast

from django.db import connection, models

from webapp.domain.ingest.sql_pipeline import Pending, send


def select_locked(model: type[models.Model], where: dict[str, Sequence]) -> list:
    return select_locked_later(model, where).result()


def select_locked_later(model: type[models.Model], where: dict[str, Sequence]) -> Pending:
    """Rows whose columns are in the given values, locked (where the
    database has row locks), in primary-key order so that two transactions lock in the
    same order and wait for each other instead of deadlocking.

    Not a queryset: the ORM spends about 0.5 ms compiling each one, which is most of a
    single event's budget."""
    if any(not values for values in where.values()):
        return Pending.done([])
    postgresql = connection.vendor == "postgresql"
    if postgresql:  # one array parameter per column: the same text, prepared once
        sql, instances = _select_sql(model, tuple(where))
        return send(sql, [list(values) for values in where.values()], True, instances)
    quote = connection.ops.quote_name
    conditions: list[str] = []
    params: list = []
    for column, values in where.items():
        conditions.append(f"{quote(column)} IN ({', '.join(['%s'] * len(values))})")
        params.extend(values)
    order = quote(cast(str, model._meta.pk.column))  # a concrete model's pk has a column
    sql = f"{_select_head(model)} WHERE {' AND '.join(conditions)} ORDER BY {order}"  # noqa: S608
    instances = _instances(model)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return Pending.done(instances(cursor.fetchall()))


def select_locked_by_key_later(
    model: type[models.Model],
    where: dict[str, Sequence],
    *,
    fk: str,
    target: type[models.Model],
    target_where: dict[str, Sequence],
) -> Pending:
    """select_locked_later (PostgreSQL only) whose foreign key fk is given by the
    target rows that target_where finds, not by their ids: it can go in the same round
    trip as the statement that locks those target rows."""
    if any(not values for values in (*where.values(), *target_where.values())):
        return Pending.done([])
    sql, instances = _select_by_key_sql(model, tuple(where), fk, target, tuple(target_where))
    params = [list(v) for v in target_where.values()] + [list(v) for v in where.values()]
    return send(sql, params, True, instances)


@lru_cache(maxsize=16)
def _select_by_key_sql(model, columns, fk, target, target_columns) -> tuple:
    quote = connection.ops.quote_name
    inner = " AND ".join(f"{quote(c)} = ANY(%s)" for c in target_columns)
    targets = f"SELECT {quote(target._meta.pk.column)} FROM {quote(target._meta.db_table)}"  # noqa: S608
    conditions = " AND ".join(
        [
            f"{quote(model._meta.get_field(fk).column)} IN ({targets} WHERE {inner})",
            *(f"{quote(c)} = ANY(%s)" for c in columns),
        ]
    )
    sql = (
        f"{_select_head(model)} WHERE {conditions} "  # noqa: S608
        f"ORDER BY {quote(model._meta.pk.column)} FOR NO KEY UPDATE"
    )
    return sql, _instances(model)


def _select_head(model) -> str:
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in model._meta.concrete_fields)
    return f"SELECT {columns} FROM {quote(model._meta.db_table)}"  # noqa: S608


@lru_cache(maxsize=64)
def _select_sql(model, columns: tuple) -> tuple:
    quote = connection.ops.quote_name
    conditions = " AND ".join(f"{quote(column)} = ANY(%s)" for column in columns)
    sql = (
        f"{_select_head(model)} WHERE {conditions} "  # noqa: S608
        f"ORDER BY {quote(model._meta.pk.column)} FOR NO KEY UPDATE"
    )
    return sql, _instances(model)


@lru_cache(maxsize=16)
def _instances(model):
    """A function from the cursor's rows to model instances, as the ORM would load them."""
    converters = _converters(model)
    names = [f.attname for f in model._meta.concrete_fields]
    alias = connection.alias

    def instances(rows) -> list:
        out = []
        for row in rows:
            values = [
                value if convert is None or value is None else convert(value)
                for value, convert in zip(row, converters, strict=True)
            ]
            out.append(model.from_db(alias, names, values))
        return out

    return instances


@lru_cache(maxsize=16)
def _converters(model: type[models.Model]) -> tuple:
    """For each concrete field, the function that turns what the cursor gives into
    the Python value (JSON text into objects, SQLite's text into UUIDs and datetimes),
    or None where the value is already right."""
    out: list = []
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
