"""The test database, set up faster than pytest-django's own `django_db_setup` and
emptied faster after each transactional test, with the same result: a database of its
own per test process, migrated by the project's migrations, empty between tests.

* Migrated once per session, not once per parallel process: on PostgreSQL, the first
  process (pytest-xdist) to need a database migrates its own, copies it to a template
  (CREATE DATABASE ... TEMPLATE) and the others copy the template. Migrating took each
  process 4-7 s on two cores, the three at once; a copy takes a fraction of a second.
* A transactional test (django_db(transaction=True)) ends with Django's `flush`, which
  on PostgreSQL is one TRUNCATE of every table: 0.4 s on an idle machine, 2-3 s on a
  busy one (it makes new files for every table and their indexes), after each of some
  400 tests. DELETE FROM every table empties the same tables in 10 ms; the foreign keys
  Django makes are deferred to the commit, so the order does not matter, and the row
  triggers of migration 0014 (run stats) only update a table that is emptied too.

Used by tests/conftest.py's `django_db_setup`, which calls setup() and teardown().
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import setup_databases, teardown_databases
from pytest_django.fixtures import _disable_migrations, _get_databases_for_setup

from tests.support.servers import file_lock

# In the folder the parallel processes share: the template's name, present from when the
# first process has made it until it has been dropped, and the lock around both.
TEMPLATE_FILE = "db-template.name"
LOCK_FILE = "db-template.lock"


def _delete_instead_of_truncate(original):
    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            # Sequences restarted, or tables outside `tables` emptied too: TRUNCATE's
            # options, which no DELETE has; no test asks for them today.
            return original(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        return [
            f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};"
            for table in tables
        ]

    sql_flush.deletes = True
    return sql_flush


def empty_by_delete() -> None:
    """Django's flush empties PostgreSQL tables by DELETE, not TRUNCATE (docstring)."""
    if connection.vendor != "postgresql":
        return  # SQLite's flush is a DELETE already
    operations = type(connection.ops)
    if not getattr(operations.sql_flush, "deletes", False):
        operations.sql_flush = _delete_instead_of_truncate(operations.sql_flush)


def _execute(sql: str) -> None:
    with connection._nodb_cursor() as cursor:
        cursor.execute(sql)


def setup(request, shared: Path | None, migrations: bool, keepdb: bool) -> tuple:
    """What pytest-django's django_db_setup does, the database copied from the session's
    template where another process made one; returns (setup_databases's answer, the
    template this process made or None). `shared` is the folder of the parallel
    processes, None without pytest-xdist, where there is nothing to share."""
    empty_by_delete()
    if not migrations:
        _disable_migrations()
    aliases, serialized_aliases = _get_databases_for_setup(request.session.items)
    kwargs = dict(
        verbosity=request.config.option.verbose, interactive=False,
        aliases=aliases, serialized_aliases=serialized_aliases, keepdb=keepdb,
    )  # fmt: skip
    if shared is None or connection.vendor != "postgresql" or keepdb:
        return setup_databases(**kwargs), None
    quote = connection.ops.quote_name
    run = request.config.workerinput["testrunuid"][:12]  # one session's processes share it
    template = f"test_{connection.settings_dict['NAME'][:30]}_template_{run}"
    own = connection.creation._get_test_db_name()
    with file_lock(shared / LOCK_FILE):
        if (shared / TEMPLATE_FILE).exists():
            # A copy of the migrated template, which setup_databases then keeps (keepdb)
            # and migrates with nothing left to do; its other steps are as without it.
            _execute(f"CREATE DATABASE {quote(own)} TEMPLATE {quote(template)}")
            return setup_databases(**{**kwargs, "keepdb": True}), None
        made = setup_databases(**kwargs)
        connection.close()  # CREATE DATABASE ... TEMPLATE wants no session in its source
        _execute(f"CREATE DATABASE {quote(template)} TEMPLATE {quote(own)}")
        (shared / TEMPLATE_FILE).write_text(template)
        return made, template


def teardown(request, shared: Path | None, made: tuple) -> None:
    """Drops this process's database, and the template if this process made it: under
    the lock, so that no process copies it meanwhile (one that sets up later finds no
    template and migrates a database of its own)."""
    databases, template = made
    try:
        teardown_databases(databases, verbosity=request.config.option.verbose)
    except Exception as exc:  # noqa: BLE001 (as pytest-django's own teardown: a warning)
        # A process a test started may still hold a session on the database: the next
        # session's setup drops and makes it again.
        request.node.warn(pytest.PytestWarning(f"could not drop the test database: {exc!r}"))
    if template is None:
        return
    with file_lock(shared / LOCK_FILE):
        (shared / TEMPLATE_FILE).unlink(missing_ok=True)
        _execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(template)}")
