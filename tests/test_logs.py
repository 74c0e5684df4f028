"""Structured logs: a real Celery worker's lines for a validation carry the task, the run
and the checkpoint ids, as JSON when LOG_FORMAT=json."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.support.celery_workers import start_worker, stop_worker
from tests.support.events import saved
from tests.support.servers import wait_for
from webapp.domain.models import Checkpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_every_line_of_a_task_carries_its_run_and_checkpoint(
    api, token, project, tmp_path, worker_env, queues
):
    project.allowed_roots = [str(tmp_path)]
    project.save()
    data = b"weights" * 1000
    (tmp_path / "model.bin").write_bytes(data)
    files = [{"path": "model.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    worker = start_worker({**worker_env, "LOG_FORMAT": "json"}, "validate", tmp_path / "w.log")
    try:
        body = saved(location=str(tmp_path), files=files)
        assert api.post_events(token, body).status_code == 202
        checkpoint = Checkpoint.objects.get()
        wait_for(lambda: Checkpoint.objects.get().status == "verified", 60, 0.2)
        wait_for(lambda: "succeeded" in worker.log_path.read_text(), 10, 0.2)
    finally:
        stop_worker(worker)
    log_path = worker.log_path

    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    task_lines = [
        line for line in lines if line.get("task") == "workers.validate.validate_checkpoint"
    ]
    assert task_lines, log_path.read_text()
    for line in task_lines:
        assert line["checkpoint_id"] == checkpoint.pk
        assert line["run_id"] == checkpoint.run_id
        assert line["task_id"]
    assert any("succeeded" in line["message"] for line in task_lines)
    # Lines outside a task carry no stale ids.
    assert any(line["message"].endswith("ready.") and "checkpoint_id" not in line for line in lines)


def test_a_newline_in_a_reported_value_cannot_forge_a_log_line():
    """A value from a job (a file path may hold a newline) stays on its own line in the
    plain format; a traceback after the line is kept as it is."""
    import io
    import logging

    from webapp.ops.logs import ContextFilter, PlainFormatter, bound

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(PlainFormatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(ContextFilter())
    logger = logging.getLogger("lifeboat.test.forge")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with bound(run_key="r\nINFO forged: context"):
            logger.warning("cannot read %s", "m.pt\nERROR webapp: forged line\x1b[31m")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("a real failure")
    finally:
        logger.removeHandler(handler)
    first, *rest = stream.getvalue().splitlines()
    assert first.startswith("WARNING lifeboat.test.forge: cannot read m.pt\\nERROR webapp")
    assert "\\x1b[31m" in first and "run_key=r\\nINFO forged" in first
    assert rest[0] == "ERROR lifeboat.test.forge: a real failure"
    assert rest[1] == "Traceback (most recent call last):"
