"""The storage ledger: what a project's checkpoints take, where, what it costs, what
retention freed and what it would free now.

On a storage target objects are content-addressed (targets.py), so a file that does not
change between checkpoints is stored once however many replicas name it. The ledger
counts each object once (`stored_bytes`), and beside it each copy whole (`logical_bytes`,
what the same copies would take without deduplication): the difference is `saved_bytes`.
Runs and checkpoints are given the objects they were first to name (in the order the
copies were made), so their figures add up to the target's: a checkpoint's bytes are
what it added. A replica counts while it is verified, and after retention deleted it for
as long as the store still lists its objects (replica_objects.py): those are billed too.

`would_free_bytes` is what the retention policy now in force would delete: the objects
only the replicas it would delete name (the dry run's, webapp/domain/retention/policy.py).
The local copies (where the jobs wrote them) are a line of their own: their files, what
local retention freed and would free.

Money: a target's `gb_month_price` per GB (2**30 bytes, as S3 bills) and month.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.db.models import Q, Sum
from django.utils import timezone

from webapp.domain.models import Checkpoint, Replica, Run, StorageSnapshot
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.replication.objects import objects_of
from webapp.domain.retention import policy as retention

GB = 1024**3
FREED_WINDOW = timedelta(days=30)
TOP_RUNS = 10
TOP_RUNS_KEPT = 100  # per target, on each history row
WRITE_BATCH = 1000


# A replica whose objects are on the store now.
BILLED = Q(status=ReplicaStatus.VERIFIED) | Q(status=ReplicaStatus.DELETED, deleted_at__isnull=True)


def billed_copies(target):
    """The target's replicas whose objects are on the store now."""
    return Replica.objects.filter(BILLED, target=target)


def _monthly(stored_bytes: int, price: float | None) -> float | None:
    return None if price is None else round(stored_bytes / GB * price, 2)


def target_ledger(target, doomed: frozenset = frozenset(), now=None) -> dict:
    """One target's figures; `doomed`: the ids of the replicas retention would delete."""
    now = now or timezone.now()
    # key -> [size, first run, first replica, named by a replica that stays]
    objects: dict[str, list] = {}
    by_replica: dict[int, int] = {}
    logical = copies = manifests = 0
    rows = (
        billed_copies(target)
        .order_by("pk")
        .values_list("pk", "checkpoint__run_id", "bytes_total", "files", "manifest_key")
    )  # fmt: skip
    for pk, run_id, total, files, manifest in rows.iterator(chunk_size=500):
        by_replica[pk] = 0
        copies += 1
        logical += total
        manifests += bool(manifest)
        stays = pk not in doomed
        for key, size in (pair for entry in files or [] for pair in objects_of(entry)):
            held = objects.get(key)
            if held is None:
                objects[key] = [size, run_id, pk, stays]
            elif stays:
                held[3] = True
    stored = sum(held[0] for held in objects.values())
    by_run: dict[int, int] = {}
    for size, run_id, pk, _ in objects.values():
        by_run[run_id] = by_run.get(run_id, 0) + size
        by_replica[pk] += size
    freed = Replica.objects.filter(target=target, deleted_at__isnull=False).aggregate(
        total=Sum("freed_bytes", default=0),
        recent=Sum("freed_bytes", default=0, filter=Q(deleted_at__gte=now - FREED_WINDOW)),
    )
    price = target.gb_month_price
    return {
        "target_id": target.pk,
        "target": target.name,
        "bucket": target.bucket,
        "prefix": target.prefix,
        "copies": copies,
        "stored_bytes": stored,
        "stored_objects": len(objects) + manifests,
        "logical_bytes": logical,
        "saved_bytes": max(logical - stored, 0),
        "would_free_bytes": sum(held[0] for held in objects.values() if not held[3]),
        "freed_bytes": freed["total"],
        "freed_bytes_30d": freed["recent"],
        "gb_month_price": price,
        "monthly_cost": _monthly(stored, price),
        "by_run": by_run,
        "by_replica": by_replica,
    }


def local_ledger(project, doomed: frozenset = frozenset(), now=None) -> dict:
    """The checkpoints' copies where the jobs wrote them (the quota's figure)."""
    now = now or timezone.now()
    kept = Checkpoint.objects.filter(project=project).exclude(status=CheckpointStatus.DELETED)
    sums = kept.aggregate(bytes=Sum("total_size", default=0), files=Sum("file_count", default=0))
    gone = Checkpoint.objects.filter(
        project=project, status=CheckpointStatus.DELETED, deleted_at__isnull=False
    ).aggregate(
        total=Sum("total_size", default=0),
        recent=Sum("total_size", default=0, filter=Q(deleted_at__gte=now - FREED_WINDOW)),
    )
    would_free = 0
    if doomed:
        would_free = kept.filter(pk__in=doomed).aggregate(n=Sum("total_size", default=0))["n"]
    return {
        "stored_bytes": sums["bytes"],
        "stored_files": sums["files"],
        "would_free_bytes": would_free,
        "freed_bytes": gone["total"],
        "freed_bytes_30d": gone["recent"],
    }


def _doomed(project) -> tuple[frozenset, frozenset]:
    """(replica ids, checkpoint ids) the retention policies in force would delete now."""

    replicas = frozenset(
        d.replica_id for d in retention.plan(project, "replicas") if d.delete and d.replica_id
    )
    local = frozenset(d.checkpoint_id for d in retention.plan(project, "local") if d.delete)
    return replicas, local


def _freed_30d(project, now) -> tuple[dict, int]:
    """({target id: bytes}, local bytes) freed by retention over the last 30 days: read
    on every request (cheap), as the history rows are an hour old."""
    since = now - FREED_WINDOW
    by_target = dict(
        Replica.objects.filter(target__project=project, deleted_at__gte=since)
        .values("target_id")
        .annotate(n=Sum("freed_bytes"))
        .order_by()
        .values_list("target_id", "n")
    )
    local = Checkpoint.objects.filter(
        project=project, status=CheckpointStatus.DELETED, deleted_at__gte=since
    ).aggregate(n=Sum("total_size", default=0))["n"]
    return by_target, local


def run_checkpoints(project, run) -> list[dict]:
    """Each checkpoint of the run with a billed copy: what it added on each target, as of
    the ledger's last pass (None for a copy made since)."""
    rows = (
        Replica.objects.filter(BILLED, target__project=project, checkpoint__run=run)
        .order_by("target__name", "checkpoint__step")
        .values_list("target__name", "checkpoint__step", "checkpoint_id", "bytes_total",
                     "added_bytes")
    )  # fmt: skip
    return [
        {"target": target, "step": step, "checkpoint": checkpoint_id,
         "logical_bytes": logical, "added_bytes": added}
        for target, step, checkpoint_id, logical, added in rows
    ]  # fmt: skip


def _record_added(target, by_replica: dict[int, int]) -> int:
    """Write what each copy added where it changed since the last pass (new copies; the
    objects of a deleted copy pass to the next that names them), so that a run's
    breakdown is a read of its own rows. Batches commit one by one: the workers update
    these rows too, and a pass must not hold a million row locks.

    One UPDATE ... FROM (VALUES ...) a batch (PostgreSQL and SQLite alike): Django's
    bulk_update builds a CASE with a branch a row; writing 100,000 rows of
    bench/ledger.py's database took it 22.5 s against this 8.8 s."""
    changed = [
        (pk, by_replica[pk])
        for pk, recorded in billed_copies(target)
        .values_list("pk", "added_bytes")
        .iterator(chunk_size=5000)
        if pk in by_replica and recorded != by_replica[pk]
    ]
    table = connection.ops.quote_name(Replica._meta.db_table)
    for start in range(0, len(changed), WRITE_BATCH):
        batch = changed[start : start + WRITE_BATCH]
        values = ", ".join(["(%s, %s)"] * len(batch))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET added_bytes = v.column2 FROM (VALUES {values}) AS v "  # noqa: S608 (the model's own table; values bound)
                f"WHERE {table}.id = v.column1",
                [number for row in batch for number in row],
            )
    return len(changed)


def snapshot(project, now=None) -> list[StorageSnapshot]:
    """The ledger's pass (the worker's, every STORAGE_LEDGER_S): every replica of each
    target read once, written as history rows that the page, the API and the gauges read."""

    now = now or timezone.now()
    doomed_replicas, doomed_local = _doomed(project)
    rows = []
    for target in project.storage_targets.order_by("name"):
        one = target_ledger(target, doomed_replicas, now)
        _record_added(target, one["by_replica"])
        top = sorted(one["by_run"].items(), key=lambda item: (-item[1], item[0]))
        top = top[:TOP_RUNS_KEPT]
        keys = dict(Run.objects.filter(pk__in=[r for r, _ in top]).values_list("pk", "key"))
        rows.append(
            StorageSnapshot(
                project=project, target=target, taken_at=now,
                stored_bytes=one["stored_bytes"], stored_objects=one["stored_objects"],
                logical_bytes=one["logical_bytes"], copies=one["copies"],
                would_free_bytes=one["would_free_bytes"], freed_bytes=one["freed_bytes"],
                runs=[{"run": keys.get(r, ""), "stored_bytes": n} for r, n in top],
                runs_total=len(one["by_run"]),
            )
        )  # fmt: skip
    local = local_ledger(project, doomed_local, now)
    rows.append(
        StorageSnapshot(
            project=project, target=None, taken_at=now, stored_bytes=local["stored_bytes"],
            stored_objects=local["stored_files"], logical_bytes=local["stored_bytes"],
            would_free_bytes=local["would_free_bytes"], freed_bytes=local["freed_bytes"],
        )
    )  # fmt: skip
    return StorageSnapshot.objects.bulk_create(rows)


def _newest(project) -> dict:
    """{target id (None: local): its newest history row}."""
    found = {}
    for target_id in [*project.storage_targets.values_list("pk", flat=True), None]:
        row = (
            StorageSnapshot.objects.filter(project=project, target_id=target_id)
            .order_by("-taken_at")
            .first()
        )
        if row is not None:
            found[target_id] = row
    return found


def latest(project, runs_limit: int = TOP_RUNS, now=None) -> dict:
    """The ledger as of its newest pass (taken first if a target has none yet: a new
    target, a new deployment), with the last 30 days' freed bytes read now."""
    now = now or timezone.now()
    targets = list(project.storage_targets.order_by("name"))
    newest = _newest(project)
    if any(t.pk not in newest for t in targets) or None not in newest:
        snapshot(project, now)
        newest = _newest(project)
    freed_recent, local_recent = _freed_30d(project, now)
    shown = []
    merged: dict[str, int] = {}
    runs_total = 0
    for target in targets:
        row = newest[target.pk]
        shown.append({
            "target": target.name, "bucket": target.bucket, "prefix": target.prefix,
            "copies": row.copies, "stored_bytes": row.stored_bytes,
            "stored_objects": row.stored_objects, "logical_bytes": row.logical_bytes,
            "saved_bytes": max(row.logical_bytes - row.stored_bytes, 0),
            "would_free_bytes": row.would_free_bytes, "freed_bytes": row.freed_bytes,
            "freed_bytes_30d": freed_recent.get(target.pk) or 0,
            "gb_month_price": target.gb_month_price,
            "monthly_cost": _monthly(row.stored_bytes, target.gb_month_price),
            "taken_at": row.taken_at,
        })  # fmt: skip
        for entry in row.runs:
            merged[entry["run"]] = merged.get(entry["run"], 0) + entry["stored_bytes"]
        runs_total = max(runs_total, row.runs_total)
    priced = [t for t in shown if t["monthly_cost"] is not None]
    totals = {
        name: sum(t[name] for t in shown)
        for name in ("copies", "stored_bytes", "stored_objects", "logical_bytes", "saved_bytes",
                     "would_free_bytes", "freed_bytes", "freed_bytes_30d")
    }  # fmt: skip
    totals["monthly_cost"] = round(sum(t["monthly_cost"] for t in priced), 2) if priced else None
    local = newest[None]
    top = sorted(merged.items(), key=lambda item: (-item[1], item[0]))[:runs_limit]
    return {
        "taken_at": min([local.taken_at, *(t["taken_at"] for t in shown)]),
        "targets": shown,
        "replicas": totals,
        "local": {
            "stored_bytes": local.stored_bytes,
            "stored_files": local.stored_objects,
            "would_free_bytes": local.would_free_bytes,
            "freed_bytes": local.freed_bytes,
            "freed_bytes_30d": local_recent,
        },
        "runs": [{"run": run, "stored_bytes": size} for run, size in top],
        # Runs on the busiest target (a run on two targets counts once).
        "runs_total": max(runs_total, len(merged)),
    }


def history(project, since) -> list[dict]:
    """Per snapshot time: bytes on the targets (summed) and local, oldest first."""
    points: dict = {}
    for taken_at, target_id, stored in (
        StorageSnapshot.objects.filter(project=project, taken_at__gte=since)
        .order_by("taken_at")
        .values_list("taken_at", "target_id", "stored_bytes")
    ):
        point = points.setdefault(taken_at, {"at": taken_at, "replicas": 0, "local": 0})
        point["local" if target_id is None else "replicas"] += stored
    return list(points.values())
