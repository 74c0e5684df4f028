"""A scratch database on the PostgreSQL of this machine, for the in-process benchmarks
(bench/ingest_in_process.py, bench/ingest_many_runs.py), and the CPU its backends use."""

from __future__ import annotations

import os
from pathlib import Path

PG_HOST = os.environ.get("BENCH_PGHOST", "127.0.0.1")
PG_PORT = int(os.environ.get("BENCH_PGPORT", "5432"))


def url(name: str) -> str:
    return f"postgres://postgres@{PG_HOST}:{PG_PORT}/{name}"


def recreate(name: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')


def drop(name: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _admin(*statements: str) -> None:
    import psycopg

    with psycopg.connect(
        host=PG_HOST, port=PG_PORT, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        for statement in statements:
            conn.execute(statement)


def backend_cpu(pid: int) -> float:
    """Seconds of CPU a PostgreSQL backend has used (from /proc: PostgreSQL must run on
    this machine)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def django_on(name: str, **environ: str) -> None:
    """A new scratch database `name`, and Django set up on it in this process (settings
    from the environment, as the web process reads them; `environ` adds to them)."""
    recreate(name)
    os.environ.update(
        DATABASE_URL=url(name),
        DJANGO_SETTINGS_MODULE="webapp.settings",
        DEBUG="0",
        SECRET_KEY="bench",
        **environ,
    )
    import django

    django.setup()
