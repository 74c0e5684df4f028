"""Group commit (webapp/domain/ingest/group_commit.py): concurrent requests of one web process
share a transaction, and each still gets exactly its own answer. (Every in-process test
that posts events goes through it too: tests/conftest.py's `api` fixture.)"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as Timeout

import pytest
from django.db import connection

from tests.support.celery_workers import queued_tasks
from tests.support.concurrency import run_together
from tests.support.events import saved
from tests.support.servers import WebServer, wait_for
from webapp.domain.ingest.group_commit import GroupCommitter, _Request, apply_group
from webapp.domain.models import Checkpoint, CheckpointFile, Event, Project

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def test_concurrent_requests_share_transactions_and_each_gets_its_own_statuses(project, worker_env):
    token = project.issue_token("t", ["ingest"])[1]
    # 60 events, each sent twice at the same moment by two different threads.
    events = [saved(run=f"run-{i % 3}", step=i, t=i) for i in range(60)]
    answers: dict[str, list[str]] = {e["id"]: [] for e in events}
    failures: list = []
    lock = threading.Lock()
    web = WebServer(worker_env)

    def send(batch):
        for body in batch:
            status, answer = web.post_events(token, body)
            with lock:
                if status != 202:
                    failures.append((status, answer))
                    continue
                assert answer["results"][0]["id"] == body["id"]
                answers[body["id"]].append(answer["results"][0]["status"])

    try:
        run_together(
            send, [[events[k::8]] for k in range(8)] + [[events[k::8][::-1]] for k in range(8)]
        )
    finally:
        web.stop()

    assert failures == []
    # Each event: one copy created, the other a duplicate, whichever came first.
    assert all(sorted(s) == ["created", "duplicate"] for s in answers.values()), answers
    assert Event.objects.count() == 60
    assert Checkpoint.objects.count() == 60
    assert CheckpointFile.objects.count() == 120
    # One transaction stamps all its events with one received_at: several single-event
    # requests shared one, which one transaction per request never does.
    shared = Counter(Event.objects.values_list("received_at", flat=True))
    assert max(shared.values()) > 1


def _request(project, actor, body):
    from webapp.domain.ingest.event_schema import parse_event

    return _Request(project, actor, [parse_event(0, body)], [body], False, None)


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs a value PostgreSQL refuses (NUL in jsonb)"
)
def test_a_request_that_fails_in_the_database_does_not_fail_its_group(project):
    bad_body = saved(step=1)
    bad_body["note"] = "nul \x00 here"  # jsonb cannot hold it; the endpoint refuses it
    good, bad = _request(project, "token:a", saved(step=2)), _request(project, "token:b", bad_body)
    bad_outcome, good_outcome = apply_group([bad, good])

    assert good_outcome.statuses == ["created"]
    assert isinstance(bad_outcome, Exception)
    assert list(Checkpoint.objects.values_list("step", flat=True)) == [2]
    assert Event.objects.get().actor == "token:a"


def test_a_group_spanning_projects_and_tokens_keeps_each_apart(project, other_project):
    a = _request(project, "token:a", saved(run="same", step=1))
    b = _request(other_project, "token:b", saved(run="same", step=1))
    c = _request(project, "token:c", saved(run="same", step=2))
    outcomes = apply_group([a, b, c])

    assert [r.statuses for r in outcomes] == [["created"]] * 3
    assert sorted(Event.objects.values_list("actor", flat=True)) == [
        "token:a",
        "token:b",
        "token:c",
    ]
    assert set(
        Project.objects.get(pk=project.pk).runs.get().checkpoints.values_list("step", flat=True)
    ) == {1, 2}
    assert list(
        Project.objects.get(pk=other_project.pk)
        .runs.get()
        .checkpoints.values_list("step", flat=True)
    ) == [1]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="ends PostgreSQL sessions")
def test_a_database_connection_that_died_is_replaced_without_failing_a_request(project, worker_env):
    """A connection that died since its last use (a restart, a failover) is replaced and
    the request still gets its 202."""
    token = project.issue_token("t", ["ingest"])[1]
    web = WebServer(worker_env, DB_CONN_MAX_AGE="600")  # production's: connections kept
    try:
        assert web.post_events(token, saved(step=1))[0] == 202
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] >= 1  # the web server's connections
        statuses = [web.post_events(token, saved(step=s))[0] for s in range(2, 6)]
    finally:
        web.stop()
    assert statuses == [202] * 4
    assert sorted(Checkpoint.objects.values_list("step", flat=True)) == [1, 2, 3, 4, 5]


def test_validations_are_published_after_the_groups_commit(project, worker_env, queues):
    token = project.issue_token("t", ["ingest"])[1]
    web = WebServer(worker_env)
    try:
        assert web.post_events(token, saved(step=1))[0] == 202
    finally:
        web.stop()
    checkpoint = Checkpoint.objects.get()
    assert checkpoint.validation_enqueued_at is not None
    assert [t["args"] for t in queued_tasks(queues)] == [[checkpoint.pk]]


def test_batches_are_applied_by_their_own_thread_small_requests_by_the_committer(
    api, project, monkeypatch
):
    """A batch shares its transaction among its events already: through the committer,
    the batches of a process would wait for each other."""
    from webapp.domain.ingest import group_commit

    grouped = []

    def apply_group(group):
        grouped.append(sum(len(request.events) for request in group))
        return group_commit.apply_group.__wrapped__(group)

    apply_group.__wrapped__ = group_commit.apply_group
    monkeypatch.setattr(group_commit, "apply_group", apply_group)
    token = project.issue_token("t", ["ingest"])[1]
    size = group_commit.GROUP_BELOW
    batch = {"events": [saved(run="b", step=s, t=s) for s in range(size)]}
    assert api.post_events(token, batch).json()["created"] == size
    assert api.post_events(token, saved(run="s", step=1)).json()["created"] == 1

    assert grouped == [1]  # only the small request went through the committer
    assert Checkpoint.objects.count() == size + 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no row locks")
def test_a_second_group_is_applied_while_the_first_waits_for_the_database(project):
    """INGEST_COMMITTERS: groups run in threads of the pool, each with its own
    connection, so requests that arrive while one transaction waits (here on a row lock)
    are applied by another."""
    from django.db import transaction

    from webapp.domain.ingest.event_schema import parse_event
    from webapp.domain.models import Run

    apply_group([_request(project, "token:a", saved(run="held", step=1))])

    def closing(function, *args):
        try:
            return function(*args)
        finally:
            connection.close()

    def stuck_and_free(in_flight: int) -> tuple[bool, bool]:
        pool = ThreadPoolExecutor(2)
        committer = GroupCommitter(pool, 1000, in_flight, closing)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever)
        thread.start()

        def submit(run: str):
            body = saved(run=run, step=10 + in_flight)
            coroutine = committer.submit(project, "token:a", [parse_event(0, body)], [body], False)
            return asyncio.run_coroutine_threadsafe(coroutine, loop)

        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(key="held")  # the lock stuck waits on
                stuck = submit("held")
                wait_for(_a_session_waits_for_a_lock, timeout=10)
                free = submit("free")
                try:
                    free.result(timeout=1 if in_flight == 1 else 10)
                    free_done = True
                except Timeout:
                    free_done = False
                stuck_done = stuck.done()
            assert stuck.result(timeout=10).statuses == free.result(timeout=10).statuses
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            pool.shutdown()
        return free_done, stuck_done

    assert stuck_and_free(in_flight=2) == (True, False)
    assert stuck_and_free(in_flight=1) == (False, False)  # one at a time: free waits too
    assert Checkpoint.objects.filter(run__key="free").count() == 2
    assert Checkpoint.objects.filter(run__key="held").count() == 3


def _a_session_waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        # Inside a transaction the statistics views keep their first snapshot.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0
