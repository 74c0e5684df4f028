"""What a call of lifeboat_ingest_v1 costs when its project holds many runs (a sweep).

    .venv/bin/python bench/ingest_many_runs.py                  # about 30 s
    .venv/bin/python bench/ingest_many_runs.py --runs 50000 --calls 500
    .venv/bin/python bench/ingest_many_runs.py --migration 0007 # the function before 0008

A scratch database (lifeboat_bench_runs on the PostgreSQL at BENCH_PGHOST, default
127.0.0.1:5432) is migrated (up to --migration when given) and holds one project with one
run. The same call (one new checkpoint.saved of that run) is timed --calls times in four
states, printing wall time and the PostgreSQL backend's CPU per call (from /proc, so
PostgreSQL must run on this machine):

  1. one run in the project (the baseline), in a connection that makes its plans now;
  2. --runs more runs added, in that same connection (plans made on the small table,
     never analyzed: a server with autovacuum off);
  3. a new connection, the table still never analyzed;
  4. a new connection after ANALYZE (what autovacuum does).

The database is dropped at the end. docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scratch_postgres  # noqa: E402

DB = "lifeboat_bench_runs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20000, help="runs added to the project")
    parser.add_argument("--calls", type=int, default=300, help="calls timed per state")
    parser.add_argument("--migration", help="migrate the domain app up to this one only")
    args = parser.parse_args()

    scratch_postgres.django_on(DB)
    import orjson
    import psycopg
    from django.core.management import call_command
    from django.utils import timezone

    from webapp.domain.models import Project, Run

    try:
        call_command(
            "migrate", "domain", *([args.migration] if args.migration else []), verbosity=0
        )
        project = Project.objects.create(name="sweep", slug="sweep", allowed_roots=["/data"])
        Run.objects.create(project=project, key="r0", created_at=timezone.now())
        steps = iter(range(1, 10**9))

        def payload() -> str:
            event = {
                "id": str(uuid.uuid4()),
                "type": "checkpoint.saved",
                "run": "r0",
                "time": datetime.datetime.now(datetime.UTC).isoformat(),
                "step": next(steps),
                "actor": "bench",
                "data": {},
                "epoch": 1,
                "location": "/data/r0",
                "format": "torch",
                "files": [["model.pt", 1000, "ab" * 32]],
                "total_size": 1000,
                "file_count": 1,
                "save_seconds": 1.0,
                "metrics": {},
            }
            return orjson.dumps([event]).decode()

        def timed(conn, label: str) -> None:
            pid = conn.info.backend_pid
            cpu, wall = scratch_postgres.backend_cpu(pid), time.perf_counter()
            for _ in range(args.calls):
                conn.execute(
                    "SELECT lifeboat_ingest_v1(%s, %s, %s::jsonb)",
                    [project.pk, timezone.now(), payload()],
                )
            wall = (time.perf_counter() - wall) / args.calls * 1000
            cpu = (scratch_postgres.backend_cpu(pid) - cpu) / args.calls * 1000
            print(f"  {label:<44} wall {wall:6.2f} ms   PostgreSQL CPU {cpu:6.2f} ms per call")

        print(f"lifeboat_ingest_v1, one save per call, {args.calls} calls per line")
        first = psycopg.connect(scratch_postgres.url(DB), autocommit=True)
        timed(first, "1 run (baseline), plans made now")
        Run.objects.bulk_create(
            [
                Run(project=project, key=f"sweep-{i}", created_at=timezone.now())
                for i in range(args.runs)
            ],
            batch_size=5000,
        )
        timed(first, f"+{args.runs:,} runs, same connection")
        timed(
            psycopg.connect(scratch_postgres.url(DB), autocommit=True),
            "new connection, never analyzed",
        )
        first.execute("ANALYZE domain_run")
        timed(
            psycopg.connect(scratch_postgres.url(DB), autocommit=True),
            "new connection after ANALYZE",
        )
        first.close()
    finally:
        from django.db import connections

        connections.close_all()
        scratch_postgres.drop(DB)


if __name__ == "__main__":
    main()
