"""Row locks (webapp/domain/locks.py): every lock goes through one function, locks only
the rows it names, and never blocks a worker that writes a row pointing at a locked one.
The concurrent cases run on PostgreSQL (SQLite has no row locks)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from django.db import connection, connections, transaction

from tests.support.replication import make_checkpoint
from webapp.domain.ingest.bulk_select import select_locked
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Event, Project, Replica, Run, StorageTarget

pytestmark = pytest.mark.sqlite

ROOT = Path(__file__).resolve().parent.parent

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks: PostgreSQL (SQLite has none)"
)


def test_every_row_lock_in_the_product_goes_through_locks_for_update():
    offenders = []
    for path in sorted((ROOT / "webapp").rglob("*.py")):
        if path.name == "locks.py" or "migrations" in path.parts:
            continue
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            if "select_for_update(" in code or re.search(r"FOR (KEY )?UPDATE\b\S*\"", code):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.django_db
def test_a_lock_names_only_its_own_rows_and_lets_inserts_through():
    rows = for_update(Run.objects.select_related("project")).filter(pk=1)
    with transaction.atomic():
        sql, _ = rows.query.get_compiler(using="default").as_sql()
    if connection.vendor == "postgresql":
        assert sql.endswith('FOR NO KEY UPDATE OF "domain_run"'), sql
    else:
        assert "FOR " not in sql  # SQLite serialises writers instead


def _in_thread(target, *args):
    errors: list[BaseException] = []

    def body():
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, errors


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_ingest_and_a_worker_crossing_on_a_run_and_its_checkpoint_do_not_deadlock(root, project):
    """Ingest locks a run, then its checkpoints; a validation locks a checkpoint, then
    writes an event naming the run. With FOR UPDATE the worker's insert waited for the
    run's lock while ingest waited for the checkpoint: PostgreSQL's deadlock detector
    killed one of them."""
    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"})
    run = checkpoint.run
    worker_has_checkpoint, ingest_has_run = threading.Event(), threading.Event()

    def worker():
        with transaction.atomic():
            for_update(Checkpoint.objects.filter(pk=checkpoint.pk)).get()
            worker_has_checkpoint.set()
            assert ingest_has_run.wait(10)
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '5s'")
            Event.record("checkpoint.verified", checkpoint=checkpoint, actor="worker:validate")

    def ingest():
        assert worker_has_checkpoint.wait(10)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '10s'")
            select_locked(Run, {"project_id": [project.pk], "key": [run.key]})
            ingest_has_run.set()
            select_locked(Checkpoint, {"run_id": [run.pk], "step": [1]})

    threads = [_in_thread(worker), _in_thread(ingest)]
    for thread, _ in threads:
        thread.join(30)
    assert [e for _, errors in threads for e in errors] == []
    assert Event.objects.filter(type="checkpoint.verified", run=run).count() == 1


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_claiming_a_replica_does_not_lock_its_project_run_or_target(root, project, s3):
    from webapp.domain.replication import replicate

    checkpoint = make_checkpoint(project, root, 1, {"m": b"x"})
    target = StorageTarget.objects.create(project=project, name="t", bucket=s3.bucket)
    replica = Replica.objects.create(checkpoint=checkpoint, target=target)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(status="verified")
    claimed, held = threading.Event(), threading.Event()

    def claim_and_hold():
        # claim()'s transaction, held open by an outer one: its locks stay until then.
        with transaction.atomic():
            assert isinstance(replicate.claim(replica.pk), replicate.Claim)
            claimed.set()
            held.wait(10)

    thread, errors = _in_thread(claim_and_hold)
    assert claimed.wait(10)
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            # What ingest and the settings pages lock meanwhile: none of it waits.
            select_locked(Run, {"project_id": [project.pk], "key": [checkpoint.run.key]})
            for_update(Project.objects.filter(pk=project.pk)).get()
            for_update(StorageTarget.objects.filter(pk=target.pk)).get()
            for_update(Checkpoint.objects.filter(pk=checkpoint.pk)).get()
    finally:
        held.set()
        thread.join(10)
    assert errors == []
