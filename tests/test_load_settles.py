"""The production database under load and faults: 40 jobs report 5 checkpoints each at
once to Lifeboat as deployed (gunicorn, prefork Celery workers on every queue, beat) on
PostgreSQL, and every checkpoint ends verified and every run's newest one replicated,
within a bound: with nothing going wrong, with the broker frozen for 25 s (and back
without its messages), with every worker process SIGKILLed, and with every database
connection terminated, mid-load.

SQLite serialises writes and hides deadlocks, so these run on PostgreSQL only. The
stack is the module's (bench/load_stack.py); each test has its own project and runs.
The broker's visibility timeout stays at its default (6 h): what a killed worker held is
found again by the sweeper from the database, not by Redis' redelivery."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connection

from bench.load_stack import Load, LoadStack, progress, settle
from tests.support.servers import wait_for
from webapp.domain.models import Event, StorageTarget

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

# Seconds from the first event to all settled. Nothing going wrong settles in about
# a tenth of this on this 2-core machine (docs/benchmarks.md, "Settling under load").
BOUND_S = 150


@pytest.fixture(scope="module")
def stack(worker_env, s3_server, tmp_path_factory):
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is tested on PostgreSQL: SQLite serialises every write")
    env = {
        **worker_env,
        "DEBUG": "0",
        "SECRET_KEY": "load-test-" + uuid.uuid4().hex,
        "S3_ENDPOINT_URL": s3_server.endpoint,
        "S3_ACCESS_KEY_ID": s3_server.key,
        "S3_SECRET_ACCESS_KEY": s3_server.secret,
        # The sweeper every 2 s, and leases it can see lapse within the test.
        "SWEEP_INTERVAL_S": "2",
        "REPLICATION_LEASE_S": "5",
        "REPLICATION_RETRY_BASE_S": "1",
        "REPLICATION_RETRY_MAX_S": "4",
        "VALIDATION_LEASE_S": "6",
        # Longer than a check can wait between its message and its claim on 2 busy
        # cores: 10 s once took a slow start for a lost message (a needless resend).
        "SWEEP_LOST_AFTER_S": "20",
    }
    stack = LoadStack(env, tmp_path_factory.mktemp("load"), workers=2).start()
    stack.pause()
    yield stack
    stack.stop()


@pytest.fixture
def load(stack, project, root, token, s3_server):
    """The workers and beat run for one test only: the database is emptied between
    tests, which must not meet a worker's transaction."""
    StorageTarget.objects.create(
        project=project,
        name="main",
        bucket=s3_server.bucket,
        prefix=f"load-{uuid.uuid4().hex[:8]}",
        endpoint_url=s3_server.endpoint,
    )
    stack.resume()
    yield Load(stack.url, token, root)
    stack.pause()


def run_load(stack, load, fault=None):
    """The load, with `fault` done once a fifth of its checkpoints are verified (work of
    every stage is in flight then: checks, copies, events still arriving)."""
    log_before = len(stack.log_text("worker"))
    started = time.monotonic()
    sender = load.start()
    if fault is not None:
        wait_for(lambda: progress(load)[0] >= load.jobs * load.checkpoints // 5, timeout=60)
        fault()
    settled = settle(load, started, timeout=BOUND_S)
    sender.join(60)
    worker_log = stack.log_text("worker")[log_before:]
    return settled, worker_log


def assert_settled(settled, load, worker_log):
    want = load.jobs * load.checkpoints
    assert settled.verified == want, f"{settled.verified}/{want} verified\n{worker_log[-4000:]}"
    assert settled.latest_replicated == load.jobs, (
        f"{settled.latest_replicated}/{load.jobs} runs' latest replicated\n{worker_log[-4000:]}"
    )


def test_many_jobs_at_once_settle_with_no_deadlock(stack, load):
    settled, worker_log = run_load(stack, load)
    assert_settled(settled, load, worker_log)
    assert "deadlock detected" not in worker_log
    assert "Traceback" not in worker_log, worker_log[-4000:]
    # Nothing went wrong, so the sweeper found nothing owed: it never takes slow for lost.
    assert list(Event.objects.filter(type="repair.resent").values_list("message", flat=True)) == []


def test_a_broker_frozen_for_25_s_then_back_empty_mid_load_loses_nothing(stack, load):
    """Frozen, every client of Redis blocks; back without the messages it held (a
    restart without persistence), the checks and copies they asked for are gone."""
    settled, worker_log = run_load(
        stack, load, lambda: stack.freeze_broker(25, comes_back_empty=True)
    )
    assert_settled(settled, load, worker_log)


def test_every_worker_process_sigkilled_mid_load_loses_nothing(stack, load):
    settled, worker_log = run_load(stack, load, stack.kill_workers)
    assert_settled(settled, load, worker_log)


def test_database_connections_terminated_mid_load_lose_nothing(stack, load):
    killed = []

    def terminate_twice():
        killed.append(stack.kill_database_connections())
        time.sleep(1.5)
        killed.append(stack.kill_database_connections())

    settled, worker_log = run_load(stack, load, terminate_twice)
    assert sum(killed) > 0
    assert_settled(settled, load, worker_log)
