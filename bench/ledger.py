"""The storage ledger at 1,000,000 replicas.

Fills a PostgreSQL database of its own (lifeboat_bench_ledger, dropped and created again
unless --reuse) with bench/pages.py's 10,000 runs and 1,000,000 checkpoints, and one
replica on one storage target per checkpoint (--replicas of them, the oldest first;
the ledger reads the replica, not its checkpoint's status), each naming four objects:
three that every checkpoint of its run shares (a tokenizer, a config, a frozen shard,
stored once) and a model file of its own. Then it times, each --repeat times:

* `ledger.snapshot(project)`: the worker's pass (every STORAGE_LEDGER_S), which reads
  every replica of each target once and writes the history rows that the storage page,
  the API and the Prometheus gauges read, and each copy's added bytes where they changed:
  once as the first pass (every replica's figure written; `added_bytes` is cleared
  first), then as the passes after it (nothing changed, nothing written);
* `ledger.run_checkpoints(project, run)`: what each checkpoint of a run added, the
  answer of `GET /api/v1/storage?run=<key>`, for the big run (100,000 checkpoints) and
  for a run of 100;

and, as baselines in the same run over the same rows: PostgreSQL summing the replicas'
bytes (`SELECT count(*), sum(bytes_total)`: the least a pass over them costs, and what
counting every copy whole, without deduplication, would cost), and reading the `files`
column into Python without looking at it.

    .venv/bin/python bench/ledger.py                    # fill (about 2 minutes), measure
    .venv/bin/python bench/ledger.py --reuse            # measure again on the filled database
    .venv/bin/python bench/ledger.py --replicas 100000  # fewer replicas (the oldest)
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import pages  # noqa: E402 (after the path above)

DB_NAME = "lifeboat_bench_ledger"


def fill_replicas(target, limit: int) -> int:
    """One replica per checkpoint (the oldest `limit`), written by PostgreSQL."""
    from django.db import connection

    from webapp.domain.models import Checkpoint, Replica

    blob = "'replicas/bench/sha256/'"
    files = f"""jsonb_build_array(
        jsonb_build_object('path', 'tokenizer.json', 'size', 2000000,
            'sha256', md5(c.run_id || 't'), 'key', {blob} || md5(c.run_id || 't')),
        jsonb_build_object('path', 'config.json', 'size', 4000,
            'sha256', md5(c.run_id || 'c'), 'key', {blob} || md5(c.run_id || 'c')),
        jsonb_build_object('path', 'frozen.safetensors', 'size', 1000000000,
            'sha256', md5(c.run_id || 'f'), 'key', {blob} || md5(c.run_id || 'f')),
        jsonb_build_object('path', 'model.safetensors', 'size', c.total_size - 1002004000,
            'sha256', md5(c.id || 'm'), 'key', {blob} || md5(c.id || 'm')))"""
    given = {
        "checkpoint_id": "c.id",
        "target_id": str(int(target.pk)),
        "status": "'verified'",
        "bytes_total": "c.total_size",
        "bytes_done": "c.total_size",
        "attempts": "1",
        "manifest_key": "'replicas/bench/manifests/' || c.run_id || '/' || c.step || '.json'",
        "files": files,
        "created_at": "c.saved_at",
        "started_at": "c.saved_at",
        "finished_at": "c.saved_at",
        "verified_at": "c.saved_at",
    }
    columns, values, params = [], [], []
    for field in Replica._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(connection.ops.quote_name(field.column))
        if field.attname in given:
            values.append(given[field.attname])
        elif field.null:
            values.append("NULL")
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    with connection.cursor() as cursor:
        cursor.execute(
            # Table and column names from the models, the limit an int: nothing from outside.
            f"INSERT INTO {Replica._meta.db_table} ({', '.join(columns)}) "  # noqa: S608
            f"SELECT {', '.join(values)} FROM {Checkpoint._meta.db_table} c "
            f"ORDER BY c.id LIMIT {int(limit)}",
            params,
        )
        inserted = cursor.rowcount
        cursor.execute("VACUUM ANALYZE")
    return inserted


def timed(what, repeat: int) -> tuple[list[float], object]:
    seconds, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = what()
        seconds.append(time.perf_counter() - started)
    return seconds, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default=DB_NAME, help="its own, dropped unless --reuse")
    parser.add_argument("--reuse", action="store_true", help="keep a filled database")
    parser.add_argument("--replicas", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    pages.configure(args.server, args.database)
    must_fill = pages.create_database(args.server, args.database, args.reuse)
    import django

    django.setup()
    from django.db import connection

    from webapp.domain.models import Project, Replica, Run, StorageTarget
    from webapp.domain.replication import ledger

    if must_fill:
        started = time.perf_counter()
        pages.fill()
        project = Project.objects.get(slug="bench")
        target = StorageTarget.objects.create(
            project=project, name="bench", bucket="bench", prefix="replicas/bench",
            endpoint_url="http://127.0.0.1:8333", gb_month_price=0.02,
        )  # fmt: skip
        n = fill_replicas(target, args.replicas)
        print(f"filled {n:,} replicas in {time.perf_counter() - started:.0f} s")
    project = Project.objects.get(slug="bench")
    target = project.storage_targets.get()
    replicas = Replica.objects.filter(target=target).count()
    big_run = Run.objects.get(project=project, key="run-00000")

    def sql_sum():
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*), sum(bytes_total) FROM {Replica._meta.db_table} "  # noqa: S608
                "WHERE target_id = %s AND status = 'verified'",
                [target.pk],
            )
            return cursor.fetchone()

    def read_files():
        return sum(1 for _ in ledger.billed_copies(target).values_list("files").iterator(2000))

    small_run = Run.objects.get(project=project, key="run-00001")
    Replica.objects.filter(target=target).update(added_bytes=None)
    rows = [
        ("baseline: SELECT count(*), sum(bytes_total)", *timed(sql_sum, args.repeat)),
        ("baseline: read every replica's files", *timed(read_files, args.repeat)),
        ("ledger.snapshot(project), first pass", *timed(lambda: ledger.snapshot(project), 1)),
        (
            "ledger.snapshot(project), next passes",
            *timed(lambda: ledger.snapshot(project), args.repeat),
        ),
        (
            "ledger.run_checkpoints, 100,000 checkpoints",
            *timed(lambda: ledger.run_checkpoints(project, big_run), args.repeat),
        ),
        (
            f"ledger.run_checkpoints, {small_run.checkpoints.count()} checkpoints",
            *timed(lambda: ledger.run_checkpoints(project, small_run), args.repeat),
        ),
    ]
    print(f"{replicas:,} replicas on one target, {args.repeat} runs each (median, max):")
    for name, seconds, _ in rows:
        print(f"  {name:<45} {statistics.median(seconds):8.2f} s {max(seconds):8.2f} s")
    one = ledger.target_ledger(target)
    print(
        f"  stored {one['stored_bytes'] / 1e12:.1f} TB in {one['stored_objects']:,} objects, "
        f"{one['logical_bytes'] / 1e12:.1f} TB counted whole (saved "
        f"{one['saved_bytes'] / 1e12:.1f} TB)"
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak memory of this process: {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
