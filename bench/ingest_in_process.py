"""What one ingest transaction costs, in-process: the PostgreSQL function against the
Python way (webapp/domain/ingest_in_sql.py, INGEST_IN_SQL).

    .venv/bin/python bench/ingest_in_process.py                 # about a minute
    .venv/bin/python bench/ingest_in_process.py --groups 1,4,16 --transactions 500

A scratch database (lifeboat_bench_inproc on the PostgreSQL at BENCH_PGHOST, default
127.0.0.1:5432) is migrated and holds one project with 8 runs. For each group size, and
each way in turn (--rounds times, alternating), it applies --transactions groups of new
checkpoint.saved events (2 files each) with webapp.domain.ingest.ingest(), as the web
process's committer does, and prints per transaction: wall time, the CPU of this thread
(Python) and the CPU of its PostgreSQL backend (from /proc, so PostgreSQL must run on
this machine). Events are checked (pydantic) before the clock starts. The database is
dropped at the end.
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

DB = "lifeboat_bench_inproc"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", default="1,4", help="events per transaction")
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    scratch_postgres.django_on(DB, VALIDATION_PUBLISH_MS="0")
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    import webapp.domain.ingest as ingest_module
    import webapp.domain.validation_outbox as outbox
    from webapp.domain.event_schema import parse_event
    from webapp.domain.ingest import ingest
    from webapp.domain.models import Project, Run

    # Only the transaction is measured: the validations it would queue are not published
    # (ingest_in_sql looks the function up in the outbox module at each call).
    outbox.publish_after_commit = ingest_module.publish_after_commit = lambda ids: None

    try:
        call_command("migrate", verbosity=0)
        project = Project.objects.create(name="bench", slug="bench", allowed_roots=["/data"])
        for i in range(8):
            Run.objects.create(project=project, key=f"run-{i}")
        step = [0]

        def event(run: str) -> dict:
            step[0] += 1
            return {
                "id": str(uuid.uuid4()),
                "type": "checkpoint.saved",
                "run": run,
                "time": datetime.datetime.now(datetime.UTC).isoformat(),
                "step": step[0],
                "epoch": 1,
                "location": f"/data/{run}/step-{step[0]}",
                "save_seconds": 1.5,
                "metrics": {"loss": 0.5, "lr": 0.0003},
                "format": "torch",
                "files": [
                    {"path": "model.pt", "size": 1000, "sha256": "a" * 64},
                    {"path": "optim.pt", "size": 2000, "sha256": "b" * 64},
                ],
            }

        def groups(size: int, count: int) -> list:
            out = []
            for _ in range(count):
                raws = [event(f"run-{i % 8}") for i in range(size)]
                out.append((raws, [parse_event(i, r) for i, r in enumerate(raws)]))
            return out

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (backend,) = cursor.fetchone()
        print(f"{args.transactions} transactions per figure; ms per transaction")
        print(f"{'events':>6}  {'way':<8} {'wall':>7} {'Python':>7} {'PostgreSQL':>10}")
        for size in [int(g) for g in args.groups.split(",")]:
            for _ in range(args.rounds):
                for in_sql in (True, False):
                    settings.INGEST_IN_SQL = in_sql
                    for raws, events in groups(size, 20):  # warm-up
                        ingest(project, "bench", events, raws, finite=True)
                    work = groups(size, args.transactions)
                    w0, c0, p0 = (
                        time.perf_counter(),
                        time.thread_time(),
                        scratch_postgres.backend_cpu(backend),
                    )
                    for raws, events in work:
                        ingest(project, "bench", events, raws, finite=True)
                    w1, c1, p1 = (
                        time.perf_counter(),
                        time.thread_time(),
                        scratch_postgres.backend_cpu(backend),
                    )
                    n = args.transactions
                    print(
                        f"{size:>6}  {'function' if in_sql else 'Python':<8}"
                        f" {(w1 - w0) / n * 1e3:>7.2f} {(c1 - c0) / n * 1e3:>7.2f}"
                        f" {(p1 - p0) / n * 1e3:>10.2f}"
                    )
    finally:
        connection.close()
        scratch_postgres.drop(DB)


if __name__ == "__main__":
    main()
