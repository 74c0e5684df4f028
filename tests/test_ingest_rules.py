"""One text of the ingest rules (webapp/domain/ingest/rules.py): the PL/pgSQL function
that once applied some events on PostgreSQL is dropped by migration 0015, and the
in-process tests post events the way production applies them (group commit)."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.support.events import saved
from webapp.domain.models import Checkpoint

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a PostgreSQL function")
def test_no_ingest_function_is_left_in_the_database():
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = 'lifeboat_ingest_v1'")
        assert cursor.fetchone()[0] == 0


def test_a_single_event_posted_in_a_test_goes_through_the_group_committer(api, token, monkeypatch):
    from webapp.domain.ingest import group_commit

    applied = []
    apply_group = group_commit.apply_group

    def counted(group):
        applied.append(len(group))
        return apply_group(group)

    monkeypatch.setattr(group_commit, "apply_group", counted)
    answer = api.post_events(token, saved(step=3))
    assert answer.status_code == 202 and answer.json()["created"] == 1
    assert applied == [1]
    assert Checkpoint.objects.get().step == 3


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the pipelined way is PostgreSQL's")
def test_a_new_runs_first_event_is_one_transaction_and_its_next_takes_one_round_trip(api, token):
    from django.test.utils import CaptureQueriesContext

    from webapp.domain.models import Run

    def statements(step: int) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            answer = api.post_events(token, saved(run="fresh-run", step=step))
        assert answer.status_code == 202 and answer.json()["created"] == 1
        return [q["sql"] for q in captured.captured_queries]

    first = statements(1)
    # Once: no attempt that finds the run missing and is rolled back first.
    assert sum('INSERT INTO "domain_event"' in q for q in first) == 1, first
    assert not [q for q in first if q.startswith("ROLLBACK")], first
    assert sum('INSERT INTO "domain_run"' in q for q in first) == 1
    # The run is known now: its next event locks it, inserts the event and locks the
    # checkpoint in the first pipelined round trip, and creates no run.
    second = statements(2)
    assert sum('INSERT INTO "domain_event"' in q for q in second) == 1, second
    assert not [q for q in second if 'INSERT INTO "domain_run"' in q or q.startswith("ROLLBACK")]
    assert Run.objects.get(key="fresh-run").last_step == 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the pipelined way is PostgreSQL's")
def test_a_run_deleted_after_this_process_saw_it_is_made_again_by_its_next_event(api, token):
    from webapp.domain.models import Event, Run

    first = api.post_events(token, saved(run="gone-run", step=1))
    assert first.status_code == 202 and first.json()["created"] == 1
    Run.objects.filter(key="gone-run").delete()  # the process still counts it as known
    assert not Event.objects.filter(run__key="gone-run").exists()
    again = api.post_events(token, saved(run="gone-run", step=2))
    # The pipelined way finds it missing, is rolled back, and the run is made first.
    assert again.status_code == 202 and again.json()["created"] == 1
    run = Run.objects.get(key="gone-run")
    assert run.last_step == 2 and Checkpoint.objects.get(run=run).step == 2
