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

from django.db.models import Q, Sum
from django.utils import timezone

from webapp.domain.models import Checkpoint, Replica, StorageSnapshot
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.recovery import ReplicaStatus

GB = 1024**3
FREED_WINDOW = timedelta(days=30)
TOP_RUNS = 10


def billed_copies(target):
    """The target's replicas whose objects are on the store now."""
    return Replica.objects.filter(target=target).filter(
        Q(status=ReplicaStatus.VERIFIED) | Q(status=ReplicaStatus.DELETED, deleted_at__isnull=True)
    )


def _monthly(stored_bytes: int, price: float | None) -> float | None:
    return None if price is None else round(stored_bytes / GB * price, 2)


def target_ledger(target, doomed: frozenset = frozenset(), now=None) -> dict:
    """One target's figures; `doomed`: the ids of the replicas retention would delete."""
    now = now or timezone.now()
    # key -> [size, first run, first checkpoint, named by a replica that stays]
    objects: dict[str, list] = {}
    logical = copies = manifests = 0
    rows = (
        billed_copies(target)
        .order_by("pk")
        .values_list("pk", "checkpoint_id", "checkpoint__run_id", "bytes_total", "files",
                     "manifest_key")
    )  # fmt: skip
    for pk, checkpoint_id, run_id, total, files, manifest in rows.iterator(chunk_size=500):
        copies += 1
        logical += total
        manifests += bool(manifest)
        stays = pk not in doomed
        for entry in files or []:
            if not isinstance(entry, dict) or "key" not in entry:
                continue
            held = objects.get(entry["key"])
            if held is None:
                objects[entry["key"]] = [int(entry.get("size") or 0), run_id, checkpoint_id, stays]
            elif stays:
                held[3] = True
    stored = sum(held[0] for held in objects.values())
    by_run: dict[int, int] = {}
    by_checkpoint: dict[int, int] = {}
    for size, run_id, checkpoint_id, _ in objects.values():
        by_run[run_id] = by_run.get(run_id, 0) + size
        by_checkpoint[checkpoint_id] = by_checkpoint.get(checkpoint_id, 0) + size
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
        "by_checkpoint": by_checkpoint,
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


def measure(project, now=None, runs_limit: int = TOP_RUNS) -> dict:
    """The project's ledger now: each target, the local copies, the totals over the
    targets, and the runs that store most."""
    from webapp.domain.models import Run
    from webapp.domain.retention import policy as retention

    now = now or timezone.now()
    doomed_replicas = frozenset(
        d.replica_id for d in retention.plan(project, "replicas") if d.delete and d.replica_id
    )
    doomed_local = frozenset(d.checkpoint_id for d in retention.plan(project, "local") if d.delete)
    targets = [
        target_ledger(target, doomed_replicas, now)
        for target in project.storage_targets.order_by("name")
    ]
    by_run: dict[int, int] = {}
    for one in targets:
        for run_id, size in one.pop("by_run").items():
            by_run[run_id] = by_run.get(run_id, 0) + size
        one.pop("by_checkpoint")
    top = sorted(by_run.items(), key=lambda item: (-item[1], item[0]))[:runs_limit]
    keys = dict(Run.objects.filter(pk__in=[run_id for run_id, _ in top]).values_list("pk", "key"))
    priced = [t for t in targets if t["monthly_cost"] is not None]
    totals = {
        name: sum(t[name] for t in targets)
        for name in ("copies", "stored_bytes", "stored_objects", "logical_bytes", "saved_bytes",
                     "would_free_bytes", "freed_bytes", "freed_bytes_30d")
    }  # fmt: skip
    totals["monthly_cost"] = round(sum(t["monthly_cost"] for t in priced), 2) if priced else None
    return {
        "taken_at": now,
        "targets": targets,
        "replicas": totals,
        "local": local_ledger(project, doomed_local, now),
        "runs": [{"run": keys.get(run_id, ""), "stored_bytes": size} for run_id, size in top],
        "runs_total": len(by_run),
    }


def run_checkpoints(project, run) -> list[dict]:
    """Each checkpoint of the run with a billed copy: what it added on each target."""
    rows = []
    for target in project.storage_targets.order_by("name"):
        added = target_ledger(target)["by_checkpoint"]
        for checkpoint_id, step, logical in (
            billed_copies(target)
            .filter(checkpoint__run=run)
            .order_by("checkpoint__step")
            .values_list("checkpoint_id", "checkpoint__step", "bytes_total")
        ):
            rows.append({
                "target": target.name, "step": step, "checkpoint": checkpoint_id,
                "logical_bytes": logical, "added_bytes": added.get(checkpoint_id, 0),
            })  # fmt: skip
    return rows


def snapshot(project, now=None) -> list[StorageSnapshot]:
    """Write the ledger's figures of now as history rows (the chart's points)."""
    now = now or timezone.now()
    figures = measure(project, now)
    rows = [
        StorageSnapshot(
            project=project, target_id=one["target_id"], taken_at=now,
            stored_bytes=one["stored_bytes"], stored_objects=one["stored_objects"],
            logical_bytes=one["logical_bytes"], copies=one["copies"],
            would_free_bytes=one["would_free_bytes"],
        )
        for one in figures["targets"]
    ]  # fmt: skip
    local = figures["local"]
    rows.append(
        StorageSnapshot(
            project=project, target=None, taken_at=now, stored_bytes=local["stored_bytes"],
            stored_objects=local["stored_files"], logical_bytes=local["stored_bytes"],
            would_free_bytes=local["would_free_bytes"],
        )
    )  # fmt: skip
    return StorageSnapshot.objects.bulk_create(rows)


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
