"""A big checkpoint's validation fans out: its files split into parts (ValidationPart),
one `validate_part` task per part that any validate worker takes, then one
`decide_validation` task that records the verdict. A small checkpoint stays one task.
Run here with a threshold of one byte (VALIDATION_FANOUT_BYTES) on checkpoints written
by bench/corpus.py: first the task functions one by one as the queue hands them out,
then two real Celery workers."""

from __future__ import annotations

import pytest
from django.test import override_settings

from bench import corpus as corpus_writer
from tests.support.celery_workers import queued_tasks, start_worker, stop_worker
from tests.support.events import saved
from tests.support.servers import wait_for
from webapp.domain.models import Checkpoint
from workers.validate import decide_validation, validate_checkpoint, validate_part

pytestmark = pytest.mark.django_db(transaction=True)

SHARD = "model-00002-of-00004.safetensors"


def report(api, token, project, location) -> Checkpoint:
    project.allowed_roots = [str(location.parent)]
    project.save()
    body = saved(run="big", step=1, location=str(location), files=corpus_writer.manifest(location))
    assert api.post_events(token, {**body, "format": "safetensors"}).status_code == 202
    return Checkpoint.objects.get(run__key="big", step=1)


def run_queue(redis) -> list[str]:
    """Runs the validate queue's tasks in this process, in order, until it is empty."""
    tasks = {
        "workers.validate.validate_checkpoint": validate_checkpoint,
        "workers.validate.validate_part": validate_part,
        "workers.validate.decide_validation": decide_validation,
    }
    ran = []
    while queued := queued_tasks(redis):
        redis.delete("validate")
        for task in queued:
            tasks[task["task"]](*task["args"], **task["kwargs"])
            ran.append(task["task"].rsplit(".", 1)[1])
    return ran


@override_settings(VALIDATION_FANOUT_BYTES=1, VALIDATION_FANOUT_PARTS=3)
def test_a_big_checkpoint_is_checked_in_part_tasks_then_one_verdict(
    api, token, project, queues, tmp_path
):
    location = corpus_writer.write("hf", tmp_path, 4 << 20)
    checkpoint = report(api, token, project, location)

    ran = run_queue(queues)

    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified", checkpoint.status_message
    assert ran == ["validate_checkpoint"] + ["validate_part"] * 3 + ["decide_validation"]
    validation = checkpoint.validations.get()
    assert sorted(p.index for p in validation.parts.all()) == [0, 1, 2]
    every_file = sorted(f for p in validation.parts.all() for f in p.files)
    assert every_file == sorted(f["path"] for f in corpus_writer.manifest(location))
    assert checkpoint.content["tensors"] == 4
    assert validation.files_done == validation.files_total == 6
    assert validation.bytes_done == checkpoint.total_size
    # Idempotent: the verdict and a part run again change nothing.
    assert decide_validation(validation.pk, "") == "settled"
    assert validate_part(validation.parts.first().pk) == "done"
    assert queued_tasks(queues) == []


@override_settings(VALIDATION_FANOUT_BYTES=1, VALIDATION_FANOUT_PARTS=3)
def test_a_flipped_byte_in_one_part_makes_the_whole_corrupt_and_names_the_shard(
    api, token, project, queues, tmp_path
):
    location = corpus_writer.write("hf", tmp_path, 4 << 20)
    checkpoint = report(api, token, project, location)
    with (location / SHARD).open("r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))

    run_queue(queues)

    checkpoint.refresh_from_db()
    assert checkpoint.status == "corrupt"
    assert SHARD in checkpoint.status_message
    [finding] = checkpoint.validations.get().findings
    assert (finding["code"], finding["file"]) == ("checksum_mismatch", SHARD)


def test_a_small_checkpoint_stays_one_task(api, token, project, queues, tmp_path):
    location = corpus_writer.write("hf", tmp_path, 4 << 20)
    checkpoint = report(api, token, project, location)

    assert run_queue(queues) == ["validate_checkpoint"]

    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified"
    assert not checkpoint.validations.get().parts.exists()


@pytest.mark.worker
def test_two_real_workers_share_the_parts(api, token, project, queues, worker_env, tmp_path):
    env = {**worker_env, "VALIDATION_FANOUT_BYTES": "1", "VALIDATION_FANOUT_PARTS": "4"}
    workers = [
        start_worker(env, "validate", tmp_path / f"worker-{name}.log", name=name)
        for name in ("a", "b")
    ]
    try:
        location = corpus_writer.write("deepspeed", tmp_path / "ckpt", 8 << 20)
        project.allowed_roots = [str(location.parent)]
        project.save()
        body = saved(
            run="big", step=1, location=str(location), files=corpus_writer.manifest(location)
        )
        assert api.post_events(token, body).status_code == 202
        checkpoint = Checkpoint.objects.get(run__key="big", step=1)
        wait_for(lambda: Checkpoint.objects.get(pk=checkpoint.pk).is_settled, timeout=180)
    finally:
        for worker in workers:
            stop_worker(worker)
    checkpoint.refresh_from_db()
    assert checkpoint.status == "verified", checkpoint.status_message
    parts = list(checkpoint.validations.get().parts.all())
    assert len(parts) == 4
    assert all(p.worker.split("@")[0] in ("a", "b") for p in parts)
