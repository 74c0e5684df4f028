"""The PostgreSQL function (webapp/domain/ingest_in_sql.py) applies events exactly as
webapp/domain/ingest.py does.

Each scenario is sent twice, request by request: once into a project with the function
on and once into another with it off. Every row the two wrote (runs, checkpoints, their
files, events) and every answer must be the same, and the function must have taken the
requests it is meant to take: a test that passed because everything fell back to the
Python way would prove nothing.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from tests.conftest import event, saved
from webapp.api.events import parse_events
from webapp.domain import ingest_in_sql
from webapp.domain.ingest import ingest
from webapp.domain.models import Checkpoint, CheckpointFile, Event, Project, Run

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the function exists in PostgreSQL only"
    ),
]

OTHER_FILES = [{"path": "model.pt", "size": 7, "sha256": "ef" * 32}]


def started(run="run-1", t=0):
    return event("run.started", run=run, t=t, name="n", host="gpu-1")


def beat(step, t, run="run-1", **fields):
    return event("run.heartbeat", run=run, t=t, step=step, **fields)


def ckpt(type_, step, t, run="run-1", **fields):
    return event(type_, run=run, t=t, step=step, **fields)


# name: (requests, how many of them the function should apply)
SCENARIOS = {
    "heartbeats in order and late": (
        [
            [started()],
            [beat(10, 10, metrics={"loss": 0.5})],
            [beat(5, 5, metrics={"loss": 0.9})],  # late: changes nothing but last_seen
            [beat(None, 20)],  # no step, no metrics: keeps both
            [beat(30, 30, metrics={})],
        ],
        4,
    ),
    "a save announced, then saved, in separate requests": (
        [[started()], [ckpt("checkpoint.started", 100, 10)], [saved(step=100, t=20)]],
        2,
    ),
    "announced and saved in one request, listed newest first": (
        [[started()], [saved(step=100, t=20), ckpt("checkpoint.started", 100, 10)]],
        1,
    ),
    "failures: before anything, after the start, after the save": (
        [
            [started()],
            [ckpt("checkpoint.failed", 50, 5, error="disk full")],
            [ckpt("checkpoint.started", 60, 6)],
            [ckpt("checkpoint.failed", 60, 7, error="oom")],
            [saved(step=70, t=8)],
            [ckpt("checkpoint.failed", 70, 9, error="late failure")],
            [ckpt("checkpoint.failed", 70, 10, error="late failure")],
            [saved(step=50, t=11)],  # the failed step saved after all
        ],
        7,
    ),
    "steps out of order, and a heartbeat after a save in one request": (
        [
            [started()],
            [saved(step=200, t=20)],
            [saved(step=100, t=10)],  # a lower step arriving late
            [saved(step=300, t=30), beat(250, 31)],  # the heartbeat is newer: step 250
            [beat(400, 40), saved(step=350, t=35)],
        ],
        4,
    ),
    "saves only, several per request (applied together): runs, order, a step known": (
        [
            [started("a"), started("b")],
            [saved("a", step=30, t=3), saved("b", step=10, t=9), saved("a", step=20, t=4)],
            [saved("b", step=5, t=1), saved("a", step=40, t=2)],  # older than the run's news
            [ckpt("checkpoint.started", 50, 10, run="a")],
            [saved("a", step=50, t=11), saved("b", step=60, t=12)],  # 50 has a row: the loop
            # One step saved twice in a request: the loop, which declines the second.
            [saved("a", step=70, t=13), saved("a", step=70, t=14)],
        ],
        4,
    ),
    "two runs in one request": (
        [
            [started("a"), started("b")],
            [saved("a", step=1, t=5), saved("b", step=2, t=6), beat(3, 7, run="a")],
        ],
        1,
    ),
    "repeats: a later request, and twice in one request": (
        [
            [started()],
            [saved(step=100, t=10)],
        ],
        1,
    ),
    "a step saved again: left to the Python way": (
        [
            [started()],
            [saved(step=100, t=10)],
            [saved(step=100, t=20)],  # the same files again
            [saved(step=100, t=30, files=OTHER_FILES)],  # other bytes
            [saved(step=100, t=25)],  # an older report of it
        ],
        1,
    ),
    "a run not created yet, and events the function does not take": (
        [
            [saved("new", step=5, t=5)],
            [beat(6, 6, run="new")],
            [event("run.finished", run="new", t=9, exit_code=0), beat(7, 8, run="new")],
            [event("metrics", run="new", t=10, points=[{"step": 1, "values": {"loss": 1}}])],
        ],
        1,
    ),
}


def _with_repeats(requests):
    """The repeats scenario: its last request again, then one holding an event twice."""
    last = requests[-1]
    fresh = saved(step=500, t=50)
    return [*requests, list(last), [fresh, dict(fresh), beat(1, 1)]]


def _send(project, requests, settings, in_sql: bool, taken: list) -> list:
    """(statuses, whether the function applied it, every row after it) per request: a
    later request can hide what an earlier one got wrong."""
    settings.INGEST_IN_SQL = in_sql
    answers = []
    for raw in requests:
        events = parse_events(raw)
        before = taken[0]
        result = ingest(project, "tester", events, raw, finite=True)
        answers.append((result.statuses, taken[0] > before, _state(project)))
    return answers


def _state(project) -> dict:
    runs = {}
    for run in Run.objects.filter(project=project).order_by("key"):
        values = {
            f.attname: getattr(run, f.attname)
            for f in Run._meta.concrete_fields
            if f.attname not in ("id", "project_id", "created_at")
        }
        runs[run.key] = values
    checkpoints = {}
    for c in Checkpoint.objects.filter(project=project).select_related("run"):
        values = {
            f.attname: getattr(c, f.attname)
            for f in Checkpoint._meta.concrete_fields
            if f.attname
            not in (
                "id",
                "project_id",
                "run_id",
                "created_at",
                "updated_at",
                "validation_enqueued_at",
            )
        }
        values["queued"] = c.validation_enqueued_at is not None
        values["files"] = sorted(
            CheckpointFile.objects.filter(checkpoint=c).values_list("path", "size", "sha256")
        )
        checkpoints[(c.run.key, c.step)] = values
    events = sorted(
        (e.event_id, e.run.key if e.run else None, e.type, e.step, e.time, e.actor, e.data)
        for e in Event.objects.filter(project=project).select_related("run")
    )
    return {"runs": runs, "checkpoints": checkpoints, "events": events}


@pytest.fixture
def taken(monkeypatch) -> list:
    """How many groups the function applied (it is counted, not replaced)."""
    count = [0]
    real = ingest_in_sql.store

    def counting(*args, **kwargs):
        answer = real(*args, **kwargs)
        count[0] += 1
        return answer

    monkeypatch.setattr(ingest_in_sql, "store", counting)
    return count


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_function_writes_what_the_python_way_writes(name, settings, taken):
    requests, expected_in_sql = SCENARIOS[name]
    if name.startswith("repeats"):
        requests = _with_repeats(requests)
        expected_in_sql += 2
    in_sql = Project.objects.create(name="In SQL", slug="in-sql", allowed_roots=["/data"])
    python = Project.objects.create(name="Python", slug="python", allowed_roots=["/data"])

    answers_sql = _send(in_sql, requests, settings, True, taken)
    answers_python = _send(python, requests, settings, False, taken)

    assert sum(used for _, used, _ in answers_sql) == expected_in_sql
    assert not any(used for _, used, _ in answers_python)
    for i, (sql, python) in enumerate(zip(answers_sql, answers_python, strict=True)):
        assert sql[0] == python[0], f"answers to request {i}"
        assert sql[2] == python[2], f"rows after request {i}"


def test_a_declined_group_keeps_nothing_of_its_own(settings, project):
    """A step saved before is refused by the function after it inserted the group's other
    events; the Python way then applies the whole group once."""
    settings.INGEST_IN_SQL = True
    raw = [started()]
    ingest(project, "t", parse_events(raw), raw, finite=True)
    first = [saved(step=100, t=10)]
    ingest(project, "t", parse_events(first), first, finite=True)
    group = [beat(150, 15), saved(step=100, t=20, files=OTHER_FILES)]
    result = ingest(project, "t", parse_events(group), group, finite=True)
    assert result.statuses == ["created", "created"]
    assert Event.objects.filter(project=project).count() == 4
    checkpoint = Checkpoint.objects.get(step=100)
    assert list(checkpoint.files.values_list("sha256", flat=True)) == ["ef" * 32]
    assert Run.objects.get().last_step == 150


@pytest.mark.django_db(transaction=True)
def test_concurrent_copies_through_the_function_are_applied_once(project, settings, taken):
    """Eight connections send the same events at the same moment, each in its own order
    and grouped differently; the runs exist, so the function takes them. Every event is
    created once, every checkpoint has its files once, nothing deadlocks."""
    import random
    import threading

    from django.db import connection as this_connection

    settings.INGEST_IN_SQL = True
    setup = [started("a"), started("b")]
    ingest(project, "t", parse_events(setup), setup, finite=True)
    events = []
    for step in range(1, 7):
        run = "ab"[step % 2]
        events += [
            ckpt("checkpoint.started", step, step, run=run),
            saved(run, step=step, t=step + 0.5),
            beat(step, step + 0.7, run=run),
        ]
    events.append(ckpt("checkpoint.failed", 99, 50, run="a", error="x"))
    clients = 8
    barrier = threading.Barrier(clients)
    answers: list[tuple[str, str]] = []
    errors: list[BaseException] = []

    def send(seed: int):
        try:
            mine = list(events)
            random.Random(seed).shuffle(mine)
            size = 1 + seed % 3
            barrier.wait()
            for start in range(0, len(mine), size):
                group = mine[start : start + size]
                result = ingest(project, "t", parse_events(group), group, finite=True)
                answers.extend(zip((e["id"] for e in group), result.statuses, strict=True))
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)
        finally:
            this_connection.close()

    threads = [threading.Thread(target=send, args=(seed,)) for seed in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors, errors
    created = sorted(event_id for event_id, status in answers if status == "created")
    assert created == sorted(e["id"] for e in events)
    assert Event.objects.filter(project=project).count() == len(events) + 2
    assert Checkpoint.objects.filter(project=project).count() == 7
    assert CheckpointFile.objects.count() == 12
    assert Run.objects.get(key="b").last_step == 5  # its newest heartbeat and checkpoint
    assert taken[0] > 0


def test_without_the_function_the_python_way_applies_the_events(settings, project, taken):
    """Code newer than the database (migration 0005 not run yet): nothing fails."""
    settings.INGEST_IN_SQL = True
    raw = [started()]
    ingest(project, "t", parse_events(raw), raw, finite=True)
    with connection.cursor() as cursor:  # rolled back with the test's transaction
        cursor.execute("DROP FUNCTION lifeboat_ingest_v1(bigint, timestamptz, jsonb)")
    group = [saved(step=100, t=10), beat(100, 11)]
    result = ingest(project, "t", parse_events(group), group, finite=True)
    assert result.statuses == ["created", "created"]
    assert Checkpoint.objects.get().files.count() == 2
    assert taken[0] == 0


def _index_scans(plan: dict) -> list[dict]:
    found = [plan] if "Index Name" in plan else []
    for child in plan.get("Plans", []):
        found += _index_scans(child)
    return found


def test_a_step_is_looked_up_by_run_and_step_whatever_the_estimates():
    """The lookup of "this run's checkpoint at this step", planned as the function and
    the ingest transaction plan it (a generic plan, made once per connection) while the
    table is empty and never analyzed, as on a new install: both columns must bound the
    index scan. With an index on run alone beside the unique one (before migration
    0006), PostgreSQL took that one and read every checkpoint of the run per event."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(
            "PREPARE lookup(bigint, bigint) AS SELECT id FROM domain_checkpoint"
            " WHERE run_id = $1 AND step = $2 FOR UPDATE"
        )
        try:
            cursor.execute("EXPLAIN (FORMAT JSON) EXECUTE lookup(1, 2)")
            (plan,) = cursor.fetchone()
        finally:
            cursor.execute("DEALLOCATE lookup")
    if isinstance(plan, str):
        plan = json.loads(plan)
    (scan,) = _index_scans(plan[0]["Plan"])
    assert scan["Index Name"] == "checkpoint_run_step_unique"
    assert "step" in scan["Index Cond"] and "Filter" not in scan


def test_saves_of_new_steps_are_inserted_together(project, settings, taken):
    """The set-based block of migration 0007 takes a group of new saves: one INSERT of
    checkpoints for the whole group, where the loop makes one per event. Counted with
    auto_explain, which reports each statement the function runs."""
    settings.INGEST_IN_SQL = True
    setup = [started("a"), started("b")]
    ingest(project, "t", parse_events(setup), setup, finite=True)
    statements: list[str] = []
    raw_connection = connection.connection
    raw_connection.add_notice_handler(lambda d: statements.append(d.message_primary or ""))
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for name, value in [
            ("log_min_duration", "0"),
            ("log_nested_statements", "on"),
            ("log_level", "notice"),
        ]:
            cursor.execute(f"SET LOCAL auto_explain.{name} = {value}")
    group = [saved("a", step=s, t=s) for s in (1, 2)] + [saved("b", step=3, t=3)]
    result = ingest(project, "t", parse_events(group), group, finite=True)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL auto_explain.log_min_duration = -1")

    assert result.statuses == ["created"] * 3 and taken[0] == 1
    inserts = [s for s in statements if "INSERT INTO domain_checkpoint (" in s]
    assert len(inserts) == 1, statements
    assert Checkpoint.objects.filter(project=project).count() == 3


def _runs_read() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
            " FROM pg_stat_xact_user_tables WHERE relname = 'domain_run'"
        )
        return cursor.fetchone()[0]


def test_a_call_reads_only_its_own_runs_however_many_the_project_has(project, settings):
    """A sweep puts thousands of runs in one project. Before migration 0008 the function
    read every run of the project at each call, whether its plans were made while the
    table was small or after ANALYZE: 6-11 ms of PostgreSQL CPU per save with 20,000 runs
    (docs/benchmarks.md)."""
    settings.INGEST_IN_SQL = True
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    setup = [started("a")]
    ingest(project, "t", parse_events(setup), setup, finite=True)
    for step in range(1, 4):  # plans made now, with one run in the table
        raw = [saved("a", step=step, t=step)]
        ingest(project, "t", parse_events(raw), raw, finite=True)
    Run.objects.bulk_create([Run(project=project, key=f"sweep-{i}") for i in range(3000)])
    with connection.cursor() as cursor:  # as autovacuum would, soon after
        cursor.execute("ANALYZE domain_run")
    for raw in ([saved("a", step=10, t=10)], [saved("a", step=11, t=11), beat(12, 12, run="a")]):
        before = _runs_read()
        assert ingest(project, "t", parse_events(raw), raw, finite=True).statuses == [
            "created"
        ] * len(raw)
        assert _runs_read() - before < 20
    assert Run.objects.get(key="a").last_step == 12
