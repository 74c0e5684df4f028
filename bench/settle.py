"""Settling under load: 40 jobs report 5 checkpoints each at once, and the time until every
checkpoint is verified and every run's newest checkpoint has a verified copy on S3, on
PostgreSQL beside SQLite (`make run`'s default), in the same run, on the same machine.

    .venv/bin/python bench/settle.py                        # PostgreSQL, then SQLite
    .venv/bin/python bench/settle.py --database postgres --rounds 3
    .venv/bin/python bench/settle.py --jobs 80 --checkpoints 5 --workers 2

Each round is Lifeboat as deployed (bench/load_stack.py): gunicorn with two uvicorn
workers, Celery workers as `make run` starts them (prefork, two processes, every queue)
and beat, a Redis of its own, SeaweedFS (the one at 127.0.0.1:8333 if it answers, else
one started here). Jobs are threads that report as the client does: run.started, then
per checkpoint a real 64 KiB file, checkpoint.saved and a heartbeat. PostgreSQL is
127.0.0.1:5432 (user postgres, trust auth); the database `lifeboat_settle` is made anew
for each round. It also prints whether any worker log holds `deadlock detected`, and how
much work the sweeper had to send again (none, when nothing went wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"
PG_DB = "lifeboat_settle"


def database_url(kind: str, work: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{work / 'settle.sqlite3'}"
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_DB}")
    return f"postgres://postgres@127.0.0.1:5432/{PG_DB}"


def one_round(args) -> dict:
    """In a process of its own (Django is set up once per process, for one database)."""
    from tests.support.servers import S3Server

    work = Path(tempfile.mkdtemp(prefix="lifeboat-bench-settle-", dir=ROOT / "var"))
    (work / "s3").mkdir()
    s3 = S3Server(work / "s3")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LIFEBOAT_"))},
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "DATABASE_URL": database_url(args.one, work),
        "SECRET_KEY": secrets.token_urlsafe(32),
        "LIFEBOAT_ENV_FILE": "off",
        "LIFEBOAT_VAR_DIR": str(work / "var"),
        "LIFEBOAT_OUTBOUND_ALLOW": "127.0.0.1",
        "S3_ENDPOINT_URL": s3.endpoint,
        "S3_ACCESS_KEY_ID": s3.key,
        "S3_SECRET_ACCESS_KEY": s3.secret,
    }
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    from bench.load_stack import Load, LoadStack, settle
    from webapp.domain.models import Event, Project, StorageTarget

    call_command("migrate", verbosity=0)
    root = work / "checkpoints"
    root.mkdir()
    project = Project.objects.create(name="Settle", slug="settle", allowed_roots=[str(root)])
    token = project.issue_token("bench", ["ingest", "read"])[1]
    StorageTarget.objects.create(
        project=project, name="main", bucket=s3.bucket, prefix="settle", endpoint_url=s3.endpoint
    )
    stack = LoadStack(env, work / "stack", workers=args.workers).start()
    try:
        load = Load(stack.url, token, root, jobs=args.jobs, checkpoints=args.checkpoints)
        started = time.monotonic()
        sender = load.start()
        settled = settle(load, started, timeout=args.timeout)
        sender.join(60)
        sent_s = (load.sent_at or time.monotonic()) - started
        log = stack.log_text("worker")
    finally:
        stack.stop()
        s3.stop()
    return {
        "database": args.one,
        "verified_s": settled.verified_s,
        "replicated_s": settled.replicated_s,
        "verified": settled.verified,
        "latest_replicated": settled.latest_replicated,
        "events_sent_s": round(sent_s, 1),
        "event_p50_ms": round(1000 * statistics.median(load.latencies), 1),
        "event_p95_ms": round(1000 * statistics.quantiles(load.latencies, n=20)[-1], 1),
        "deadlocks": log.count("deadlock detected"),
        "repairs": Event.objects.filter(type="repair.resent").count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", action="append", choices=("postgres", "sqlite"))
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1, help="Celery workers of 2 processes")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_round(args)), flush=True)
        return 0
    (ROOT / "var").mkdir(exist_ok=True)
    results: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for kind in args.database or ["postgres", "sqlite"]:
            argv = [sys.executable, __file__, "--one", kind, "--jobs", str(args.jobs),
                    "--checkpoints", str(args.checkpoints), "--workers", str(args.workers),
                    "--timeout", str(args.timeout)]  # fmt: skip
            out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(out.stdout[-3000:], out.stderr[-3000:])
                return 1
            result = json.loads(line.removeprefix("RESULT "))
            results.setdefault(kind, []).append(result)
            print(json.dumps(result), flush=True)
    want = args.jobs * args.checkpoints
    print(f"\n{args.jobs} jobs x {args.checkpoints} checkpoints, {args.workers} worker(s) "
          f"of 2 processes; median of {args.rounds} round(s)")  # fmt: skip
    print(f"{'database':<10} {'all verified':>13} {'latest copied':>14} {'deadlocks':>10} "
          f"{'repairs':>8}")  # fmt: skip
    for kind, rows in results.items():

        def median(key: str, rows=rows) -> str:
            values = [r[key] for r in rows if r[key] is not None]
            return f"{statistics.median(values):.1f} s" if len(values) == len(rows) else "never"

        complete = all(r["verified"] == want and r["latest_replicated"] == args.jobs for r in rows)
        print(f"{kind:<10} {median('verified_s'):>13} {median('replicated_s'):>14} "
              f"{sum(r['deadlocks'] for r in rows):>10} {sum(r['repairs'] for r in rows):>8}"
              + ("" if complete else "   INCOMPLETE"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
