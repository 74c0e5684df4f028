"""Group commit on the event loop (webapp/domain/loop_commit.py) writes what the threaded
way writes, and gives back untouched whatever it does not take.

The loop's connection is its own, so these tests commit (transaction=True). The served
tests of tests/test_group_commit.py (concurrent copies, a connection that died,
validation after commit) go through this way too, under gunicorn, as production does.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from tests.conftest import event, saved
from tests.test_ingest_in_sql import SCENARIOS, _state, _with_repeats, beat, ckpt, started
from webapp.api.events import parse_events
from webapp.domain import loop_commit
from webapp.domain.ingest import ingest
from webapp.domain.loop_commit import LoopCommitter
from webapp.domain.models import Checkpoint, Event, Project

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the function exists in PostgreSQL only"
    ),
]


class Counted(LoopCommitter):
    """The real committer, with the calls it made to PostgreSQL counted."""

    calls = 0

    async def _call(self, project_id, payload):
        self.calls += 1
        return await super()._call(project_id, payload)


def _submit_together(committer, project, requests, actor="tester"):
    """Submit requests at the same moment, as a loop that read them all in one round
    does; each answer is an IngestResult or None (not taken)."""

    async def main():
        try:
            return await asyncio.gather(
                *(
                    committer.submit(project, actor, parse_events(raw), raw, True)
                    for raw in requests
                )
            )
        finally:
            await committer.close()

    return _run(main())


def _run(coroutine):
    """asyncio.run in a thread of its own: a test before may have left an event loop
    running in this one (Playwright's sync API does)."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


def _as_the_endpoint(committer, project, raw):
    """One request as webapp/api/ingest_asgi.py applies it: this way, else the other."""
    (result,) = _submit_together(committer, project, [raw])
    taken = result is not None
    if not taken:
        result = ingest(project, "tester", parse_events(raw), raw, finite=True)
    return result.statuses, taken, _state(project)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_loop_writes_what_the_threaded_way_writes(name, settings):
    requests, expected = SCENARIOS[name]
    if name.startswith("repeats"):
        requests = _with_repeats(requests)
        expected += 2
    settings.INGEST_IN_SQL = True
    on_loop = Project.objects.create(name="Loop", slug="loop", allowed_roots=["/data"])
    threaded = Project.objects.create(name="Threads", slug="threads", allowed_roots=["/data"])
    committer = Counted(1000)

    loop_answers = [_as_the_endpoint(committer, on_loop, raw) for raw in requests]
    thread_answers = [
        (ingest(threaded, "tester", parse_events(raw), raw, finite=True).statuses, _state(threaded))
        for raw in requests
    ]

    # Taken here: what the function applies on its own (the count in SCENARIOS).
    assert sum(taken for _, taken, _ in loop_answers) == expected
    for i, (mine, theirs) in enumerate(zip(loop_answers, thread_answers, strict=True)):
        assert mine[0] == theirs[0], f"answers to request {i}"
        assert mine[2] == theirs[1], f"rows after request {i}"


def test_requests_waiting_together_share_one_call_and_each_gets_its_own_answer(settings):
    settings.INGEST_IN_SQL = True
    on_loop = Project.objects.create(name="Loop", slug="loop", allowed_roots=["/data"])
    threaded = Project.objects.create(name="Threads", slug="threads", allowed_roots=["/data"])
    setup = [started("a"), started("b")]
    for project in (on_loop, threaded):
        ingest(project, "t", parse_events(setup), setup, finite=True)
    twice = saved("a", step=20, t=2)
    requests = [
        [saved("a", step=10, t=1)],
        [twice],
        [saved("b", step=5, t=3), beat(6, 4, run="b")],
        [dict(twice)],  # the same event from another request: a duplicate
        [ckpt("checkpoint.started", 30, 5, run="a")],
    ]
    committer = Counted(1000)

    results = _submit_together(committer, on_loop, requests)

    assert committer.calls == 1
    assert [r.statuses for r in results] == [
        ["created"],
        ["created"],
        ["created", "created"],
        ["duplicate"],
        ["created"],
    ]
    everything = [e for raw in requests for e in raw]
    ingest(threaded, "tester", parse_events(everything), everything, finite=True)
    assert _state(on_loop) == _state(threaded)


def test_a_group_the_function_declines_is_given_back_with_nothing_kept(settings, project):
    """A run that does not exist yet: the function refuses the whole call, and every
    request of it goes the threaded way, which creates the run."""
    settings.INGEST_IN_SQL = True
    setup = [started("known")]
    ingest(project, "t", parse_events(setup), setup, finite=True)
    requests = [[saved("known", step=1, t=1)], [saved("new", step=1, t=2)]]

    results = _submit_together(Counted(1000), project, requests)

    assert results == [None, None]
    assert Event.objects.filter(project=project).count() == 1  # run.started only
    for raw in requests:
        ingest(project, "t", parse_events(raw), raw, finite=True)
    assert Checkpoint.objects.filter(project=project).count() == 2


def test_events_it_does_not_handle_are_given_back_without_a_call(project):
    committer = Counted(1000)
    requests = [
        [started()],
        [event("run.finished", t=9, exit_code=0)],
        [event("metrics", t=10, points=[{"step": 1, "values": {"loss": 1}}])],
    ]
    assert _submit_together(committer, project, requests) == [None, None, None]
    assert committer.calls == 0
    assert not Event.objects.exists()


def test_a_dead_connection_gives_the_group_back_and_the_next_call_reconnects(settings, project):
    settings.INGEST_IN_SQL = True
    setup = [started()]
    ingest(project, "t", parse_events(setup), setup, finite=True)
    committer = Counted(1000)

    async def main():
        first = await committer.submit(project, "t", parse_events([s := saved(step=1)]), [s], True)
        pid = committer._conn.info.backend_pid
        await asyncio.to_thread(_terminate, pid)
        second = await committer.submit(
            project, "t", parse_events([s2 := saved(step=2)]), [s2], True
        )
        third = await committer.submit(
            project, "t", parse_events([s3 := saved(step=3)]), [s3], True
        )
        await committer.close()
        return first, second, third

    first, second, third = _run(main())

    assert first.statuses == ["created"]
    assert second is None  # the endpoint sends it the threaded way
    assert third.statuses == ["created"]  # on a new connection
    assert sorted(Checkpoint.objects.values_list("step", flat=True)) == [1, 3]


def test_an_unexpected_error_answers_every_request_of_the_group(project):
    """Nothing waits forever: the group goes the threaded way, and the next one is
    applied again."""

    class FailingOnce(LoopCommitter):
        failed = False

        async def _call(self, project_id, payload):
            if not self.failed:
                self.failed = True
                raise RuntimeError("boom")
            return await super()._call(project_id, payload)

    setup = [started()]
    ingest(project, "t", parse_events(setup), setup, finite=True)
    committer = FailingOnce(1000)
    first = _submit_together(committer, project, [[saved(step=1)], [saved(step=2)]])
    second = _submit_together(committer, project, [[saved(step=3)]])
    assert first == [None, None]
    assert second[0].statuses == ["created"]
    assert list(Checkpoint.objects.values_list("step", flat=True)) == [3]


def _terminate(pid: int) -> None:
    from django.db import connections

    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    connections["default"].close()


def test_the_way_is_off_where_it_cannot_be_used(settings):
    settings.INGEST_ON_LOOP = True
    settings.INGEST_GROUP_COMMIT = True
    settings.INGEST_IN_SQL = True
    assert loop_commit.enabled()
    settings.INGEST_GROUP_COMMIT = False  # the in-process test client
    assert not loop_commit.enabled()
    settings.INGEST_GROUP_COMMIT = True
    settings.INGEST_IN_SQL = False
    assert not loop_commit.enabled()
    settings.INGEST_IN_SQL = True
    settings.INGEST_ON_LOOP = False
    assert not loop_commit.enabled()


def test_served_single_events_are_applied_from_the_loop(project, worker_env):
    """Under gunicorn, as production serves: single events are applied by the loop's
    connection (a test that passed with everything going the threaded way would prove
    nothing about this one)."""
    from tests.conftest import WebServer

    token = project.issue_token("t", ["ingest"])[1]
    web = WebServer(worker_env)
    try:
        assert web.post_events(token, [started()][0])[0] == 202
        answers = [web.post_events(token, saved(step=s, t=s)) for s in range(1, 6)]
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s",
                [loop_commit.APPLICATION_NAME],
            )
            (loop_connections,) = cursor.fetchone()
    finally:
        web.stop()
    assert [a[1]["results"][0]["status"] for a in answers] == ["created"] * 5
    assert loop_connections >= 1
    assert sorted(Checkpoint.objects.values_list("step", flat=True)) == [1, 2, 3, 4, 5]
