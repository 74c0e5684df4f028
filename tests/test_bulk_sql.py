"""webapp/domain/ingest/bulk_sql.py: the ingest path's statements store exactly what the ORM
would, whichever shape the rows travel in (one JSON document for a few rows, binary
arrays for many), and refuse what the columns refuse."""

from __future__ import annotations

import math
from operator import attrgetter

import pytest
from django.db import DataError, IntegrityError, connection, transaction

from webapp.domain.ingest import bulk_sql, sql_pipeline
from webapp.domain.ingest.rules import new_checkpoint as _new_checkpoint
from webapp.domain.models import Checkpoint, CheckpointFile, Run

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]

SHAPES = {"json": 1, "arrays": bulk_sql._ARRAYS_FROM_ROWS}
postgresql_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="a PostgreSQL statement"
)


def _fields() -> tuple[str, ...]:
    return tuple(f.attname for f in Checkpoint._meta.concrete_fields if not f.primary_key)


def _rows(run: Run, steps, **values) -> list[tuple]:
    get = attrgetter(*_fields())
    return [
        get(_new_checkpoint(project_id=run.project_id, run_id=run.pk, step=step, **values))
        for step in steps
    ]


@pytest.fixture
def run(project):
    return Run.objects.create(project=project, key="r")


def _same(a, b) -> bool:
    return (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    ) or a == b


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_inserted_rows_read_back_as_the_orm_wrote_them(project, run, shape):
    count = SHAPES[shape]
    values = {
        "save_seconds": math.nan,  # PostgreSQL keeps NaN; SQLite makes it NULL
        "metrics": {"loss": 0.25, "nested": {"list": [1, "two", None]}, "text": 'q " \\ é'},
        "location": "/data/ckpt 1",
        "format": "torch",
        "epoch": None,
        "pinned": True,
    }
    back = bulk_sql.insert_rows(
        Checkpoint, _fields(), _rows(run, range(count), **values), returning=("id", "step")
    )
    assert sorted(step for _, step in back) == list(range(count))
    other = Run.objects.create(project=project, key="by-the-orm")
    reference = Checkpoint.objects.create(project=project, run=other, step=0, **values)
    reference.refresh_from_db()
    names = [n for n in _fields() if n not in ("run_id", "step", "created_at", "updated_at")]
    for checkpoint in Checkpoint.objects.filter(run=run):
        for name in names:
            assert _same(getattr(checkpoint, name), getattr(reference, name)), name


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_infinities_are_stored_as_such(run, shape):
    rows = _rows(run, range(SHAPES[shape]), save_seconds=-math.inf)
    bulk_sql.insert_rows(Checkpoint, _fields(), rows)
    assert set(Checkpoint.objects.values_list("save_seconds", flat=True)) == {-math.inf}


@postgresql_only
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_string_longer_than_its_column_is_refused_not_cut(run, shape):
    rows = _rows(run, range(SHAPES[shape]), format="x" * 51)  # max_length=50
    with pytest.raises(DataError), transaction.atomic():
        bulk_sql.insert_rows(Checkpoint, _fields(), rows)
    assert not Checkpoint.objects.exists()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_parents_and_children_in_one_statement(run, shape):
    count = SHAPES[shape]
    rows = _rows(run, range(count))
    files = [
        (run.pk, step, f"part-{k}", step * 10 + k, f"{k:064x}")
        for step in range(count)
        for k in range(2)
    ]
    back = bulk_sql.insert_with_children_later(
        Checkpoint,
        _fields(),
        rows,
        ("run_id", "step"),
        CheckpointFile,
        ("checkpoint_id", "path", "size", "sha256"),
        files,
    ).result()
    ids = {step: pk for pk, _, step in back}
    assert sorted(ids) == list(range(count))
    stored = sorted(CheckpointFile.objects.values_list("checkpoint_id", "path", "size"))
    assert stored == sorted(
        (ids[s], f"part-{k}", s * 10 + k) for s in range(count) for k in range(2)
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_many_rows_updated_by_one_statement(project, shape):
    count = SHAPES[shape]
    runs = [Run.objects.create(project=project, key=f"r{i}") for i in range(count)]
    updates = [(r.pk, i, {"lr": i / 10}, "running") for i, r in enumerate(runs)]
    bulk_sql.update_rows_later(Run, ("last_step", "last_metrics", "status"), updates).result()
    for i, r in enumerate(runs):
        r.refresh_from_db()
        assert (r.last_step, r.last_metrics, r.status) == (i, {"lr": i / 10}, "running")


@postgresql_only
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_rows_that_name_their_run_by_key_skip_runs_that_do_not_exist(run, shape):
    count = SHAPES[shape]
    rows = _rows(run, range(count))
    at = _fields().index("run_id")
    # Every other row names a run that does not exist.
    rows = [(*r[:at], "r" if i % 2 == 0 else "nope", *r[at + 1 :]) for i, r in enumerate(rows)]
    back = bulk_sql.insert_rows_by_key_later(
        Checkpoint,
        _fields(),
        rows,
        fk="run_id",
        target=Run,
        match=("project_id", "key"),
        returning=("step",),
    ).result()
    assert sorted(s for (s,) in back) == list(range(0, count, 2))
    assert set(Checkpoint.objects.values_list("run_id", flat=True)) == {run.pk}


@postgresql_only
def test_an_error_in_a_pipeline_is_django_s_and_rolls_the_transaction_back(run):
    rows = _rows(run, [1])
    with pytest.raises(IntegrityError), transaction.atomic(), sql_pipeline.pipeline():
        first = bulk_sql.insert_rows_later(Checkpoint, _fields(), rows)
        again = bulk_sql.insert_rows_later(Checkpoint, _fields(), rows)  # same step
        first.result()
        again.result()
    assert not Checkpoint.objects.exists()
    assert connection.connection._pipeline is None  # and the connection is usable
    assert Run.objects.filter(pk=run.pk).exists()
