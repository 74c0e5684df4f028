"""Restore tests: prove that a checkpoint comes back, and measure how long that takes.

A restore test fetches the checkpoint from a verified replica (never the local copy:
the local copy is what dies with the cluster), verifies every file's sha256 as it
arrives, loads it in a child process (webapp/domain/recovery/restore_load.py) and moves every
tensor to the device: the GPU when the worker has one. Each phase is timed, with peak
memory and the device; the total is the measured time to recover, shown on the
dashboard and used by the analytics (docs/analytics.md).

The load runs in a child forked from the worker's warm loader (restore_load --serve,
started at worker start, or by the first restore test, and kept): the same limits and
error reporting as a fresh interpreter, without paying for `import torch` (about 1.2 s on
2 cores) in every test. A loader that dies or hangs fails that test and is replaced.

It is a Validation of kind "restore". Workers started with a GPU listen on the `gpu`
queue and say so in Redis (mark_gpu_worker); restore tests go there while one is alive,
else to the `restore` queue.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import time
from datetime import timedelta
from pathlib import Path

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from lifeboat.units import human_size
from webapp.domain import publish
from webapp.domain.health import alerts
from webapp.domain.launch.run_as import RunAsRefused
from webapp.domain.models import Checkpoint, Event, Run, Validation
from webapp.domain.models.recovery import ReplicaStatus, ValidationKind, ValidationStatus
from webapp.domain.recovery import quarantine, reshard, restore_checks
from webapp.domain.replication.restore import RestoreError, restore_replica
from webapp.domain.validation.inspector import largest_file, warm_helper

log = logging.getLogger(__name__)

GPU_WORKER_KEY = "lifeboat:gpu-worker:"
LOADER_MODULE = "webapp.domain.recovery.restore_load"
# A load that ran out of memory (the CPU allocator's, CUDA's, Python's).
_OUT_OF_MEMORY = re.compile(r"MemoryError|out of memory|can't allocate|alloc", re.I)


# -- where it runs ---------------------------------------------------------------------------


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2)


def mark_gpu_worker(hostname: str, ttl_s: int = 120) -> None:
    _redis().set(GPU_WORKER_KEY + hostname, "1", ex=ttl_s)


def gpu_worker_alive() -> bool:
    try:
        return next(_redis().scan_iter(GPU_WORKER_KEY + "*", count=100), None) is not None
    except redis.RedisError:
        return False


def has_gpu() -> bool:
    """Whether this host has an NVIDIA GPU, without importing torch in the worker."""
    return os.path.exists("/dev/nvidiactl") or bool(os.environ.get("LIFEBOAT_FORCE_GPU"))


# -- asking for one ----------------------------------------------------------------------------


def request(checkpoint, requested_by: str = ""):
    """Queue a restore test of `checkpoint` after the caller's transaction commits, unless
    one is already queued or running. Returns the Validation."""

    existing = Validation.objects.filter(
        checkpoint=checkpoint,
        kind=ValidationKind.RESTORE,
        status__in=(ValidationStatus.QUEUED, ValidationStatus.RUNNING),
    ).first()
    if existing is not None:
        return existing
    validation = Validation.objects.create(
        checkpoint=checkpoint, kind=ValidationKind.RESTORE, requested_by=requested_by
    )
    transaction.on_commit(lambda: enqueue(validation.pk))
    return validation


TASK = "workers.restore.restore_test"


def enqueue(validation_id: int) -> str:
    queue = "gpu" if gpu_worker_alive() else "restore"
    try:
        publish.send(TASK, (validation_id,), queue=queue)
    except Exception:  # noqa: BLE001 (the hourly schedule requeues what is stuck)
        log.warning("could not enqueue restore test %s", validation_id)
    return queue


def schedule(now=None) -> list[int]:
    """The latest verified checkpoint (with a verified replica) of every active run gets a
    restore test if it had none in RESTORE_TEST_EVERY_S. Returns the validation ids."""

    now = now or timezone.now()
    every = timedelta(seconds=settings.RESTORE_TEST_EVERY_S)
    active = Run.objects.filter(last_seen_at__gte=now - timedelta(days=1)) | Run.objects.filter(
        status="running"
    )
    queued = []
    for run in active.distinct():
        checkpoint = (
            Checkpoint.objects.filter(
                run=run, status="verified", replicas__status=ReplicaStatus.VERIFIED
            )
            .order_by("-step")
            .first()
        )
        if checkpoint is None:
            continue
        recent = Validation.objects.filter(
            checkpoint=checkpoint, kind=ValidationKind.RESTORE, created_at__gte=now - every
        ).exclude(status=ValidationStatus.ERROR)
        if recent.exists():
            continue
        with transaction.atomic():
            queued.append(request(checkpoint, requested_by="schedule").pk)
    # Tests whose message was lost or whose worker died: the sweeper's
    # (webapp/domain/recovery/owed.py).
    return queued


# -- doing one ----------------------------------------------------------------------------------


def claim(validation_id: int):
    """Take the test: queued, or running past its lease (the worker died). None if another
    worker has it or it is settled: then there is nothing to do."""

    now = timezone.now()
    lease = now - timedelta(seconds=settings.VALIDATION_TIMEOUT_S + 600)
    claimable = Validation.objects.filter(pk=validation_id, kind="restore").filter(
        status=ValidationStatus.QUEUED
    ) | Validation.objects.filter(
        pk=validation_id, kind="restore", status=ValidationStatus.RUNNING, started_at__lt=lease
    )
    taken = claimable.update(
        status=ValidationStatus.RUNNING,
        started_at=now,
        worker=socket.gethostname(),
        bytes_done=0,
    )
    if taken != 1:
        return None
    return Validation.objects.select_related("checkpoint__run", "checkpoint__project").get(
        pk=validation_id
    )


def _finish(validation, status: str, message: str, timings: dict, findings=None, device=""):
    validation.status = status
    validation.message = message
    validation.timings = timings
    validation.findings = findings or []
    validation.device = device
    validation.finished_at = timezone.now()
    # Not bytes_done: the progress callback writes that column directly.
    validation.save(
        update_fields=["status", "message", "timings", "findings", "device", "finished_at"]
    )
    checkpoint = validation.checkpoint
    Event.record(
        f"restore_test.{status}",
        checkpoint=checkpoint,
        time=validation.finished_at,
        actor=f"worker:{validation.worker}",
        message=message,
        data={"validation": validation.pk, "timings": timings, "device": device},
    )
    if status in ("failed", "error"):
        _alert(validation, message)
    return status


def _unloadable(validation, message: str, timings: dict, **extra) -> str:
    """Verified bytes that do not load (or fail the project's deeper checks): the test
    fails, and the checkpoint is quarantined at once, so no resume starts from it."""

    status = _finish(validation, ValidationStatus.FAILED, message, timings, **extra)
    quarantine.quarantine(
        validation.checkpoint, f"its restore test failed: {message}", actor="restore test"
    )
    return status


def _alert(validation, message: str) -> None:
    try:
        checkpoint = validation.checkpoint
        alerts.record(
            "restore.failed",
            f"restore.failed:{validation.pk}",
            f"Restore test of step {checkpoint.step} of run {checkpoint.run.key} failed: "
            f"{message[:500]}",
            project_id=checkpoint.project_id,
            run_id=checkpoint.run_id,
            checkpoint_id=checkpoint.pk,
        )
    except Exception:  # noqa: BLE001 (an alert must never hide the verdict)
        log.exception("could not record the restore.failed alert")


def start_warm_loader() -> None:
    """Starts this process's warm loader now (it imports torch, which takes a while), so
    that the first restore test does not wait for it."""

    warm_helper(LOADER_MODULE).ensure_started()


def _child_load(base: Path, files: list[str]) -> dict:
    """Loads the files in a child process forked from this process's warm loader (started
    now if it is not running). Raises RuntimeError when the child did not answer."""

    # CUDA reserves far more address space than it uses, so a GPU child is bounded by
    # the timeout only; a CPU child also by memory, like the validation's load check.
    limit = None
    if not has_gpu():
        limit = settings.VALIDATION_MEMORY_BYTES + 2 * largest_file(str(base), files)
    request = {"base": str(base), "files": files, "device": "auto"}
    timeout = settings.VALIDATION_TIMEOUT_S
    return _loaded(warm_helper(LOADER_MODULE).run(request, limit, timeout), timeout)


def _loaded(outcome: dict, timeout: float) -> dict:
    if outcome.get("timed_out"):
        raise RuntimeError(f"the load child did not finish within {timeout:g} s")
    returncode, stdout = outcome.get("returncode"), outcome.get("stdout", "")
    tail = outcome.get("stderr", "").strip().splitlines()[-1:] or ["no output"]
    if returncode is None:  # the helper died, hung (then it is replaced) or could not start
        raise RuntimeError(f"the load child could not run: {tail[0][:300]}")
    if returncode != 0 or not stdout.strip():
        raise RuntimeError(f"the load child exited with {returncode}: {tail[0][:300]}")
    return json.loads(stdout)


def run(validation_id: int) -> str:
    validation = claim(validation_id)
    if validation is None:
        return "not claimed"
    replica = (
        validation.checkpoint.replicas.filter(status=ReplicaStatus.VERIFIED)
        .select_related("target")
        .order_by("-verified_at")
        .first()
    )
    if replica is None:
        return _finish(
            validation,
            ValidationStatus.ERROR,
            "No verified replica to restore from: replicate this checkpoint first.",
            {},
        )
    # The worker's own folder, 0700: the job-given file paths are checked by the download
    # (no absolute path, no '..'), and no job can plant a symlink in it.
    scratch = Path(settings.SCRATCH_DIR) / f"restore-{validation.pk}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700, parents=True)
    try:
        return _restore_and_load(validation, replica, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _progress_writer(validation, total: int):
    """About once a second: the dashboard and the CLI read bytes, rate and ETA from it."""
    last_write = [0.0]

    def progress(done: int, _total: int) -> None:
        now = time.monotonic()
        if now - last_write[0] >= 1 or done >= total:
            last_write[0] = now
            type(validation).objects.filter(pk=validation.pk).update(bytes_done=done)

    return progress


def _restore_and_load(validation, replica, scratch: Path) -> str:
    """Download and verify into `scratch`, load, run the deeper levels; each phase
    timed. Returns what _finish returns; the caller deletes `scratch`."""

    checkpoint = validation.checkpoint
    timings: dict = {}
    total = checkpoint.total_size
    validation.bytes_total = total
    validation.save(update_fields=["bytes_total"])
    started = time.perf_counter()
    try:
        # Scratch space, deleted after the test: no fsync (durable=False).
        restore_replica(
            replica, scratch, _progress_writer(validation, total), durable=False,
            keep_mismatched=True,
        )  # fmt: skip
    except RestoreError as exc:
        timings["download_s"] = time.perf_counter() - started
        altered = _altered(checkpoint, scratch, exc)
        if altered:
            exc = RestoreError(f"{exc}; {altered}")
        # This worker's disk or the network failed, not the copy: say nothing of the copy.
        status, said = (
            (ValidationStatus.FAILED, f"The replica on {replica.target.name} does not restore")
            if exc.replica_at_fault
            else (ValidationStatus.ERROR, "The restore test could not run")
        )
        return _finish(validation, status, f"{said}: {exc}", timings)
    # sha256 is checked in the same pass as the download: one read of the bytes.
    timings["download_verify_s"] = time.perf_counter() - started
    files = sorted(checkpoint.files.values_list("path", flat=True))
    try:
        loaded = _child_load(scratch, files)
    except (OSError, RuntimeError, ValueError) as exc:
        # The loader itself broke (out of memory, a child that died): not the bytes'
        # verdict, so no quarantine.
        return _finish(
            validation, ValidationStatus.FAILED,
            f"Downloaded and verified, but loading failed: {exc}", timings,
        )  # fmt: skip
    timings["load_s"] = loaded["load_s"]
    timings["to_device_s"] = loaded["to_device_s"]
    timings["total_s"] = time.perf_counter() - started
    timings["peak_host_bytes"] = loaded["peak_host_bytes"]
    timings["peak_device_bytes"] = loaded["peak_device_bytes"]
    type(validation).objects.filter(pk=validation.pk).update(bytes_done=total)
    if loaded["error"]:
        message = (
            f"Downloaded and verified from {replica.target.name}, but it does not load: "
            f"{loaded['error']}"
        )
        if _OUT_OF_MEMORY.search(loaded["error"]):
            # As much about this worker as about the checkpoint: failed, not quarantined
            # (a worker with more memory may load it).
            return _finish(
                validation, ValidationStatus.FAILED, message, timings, device=loaded["device"]
            )
        return _unloadable(validation, message, timings, device=loaded["device"])
    try:
        levels = reshard.levels(validation, scratch, files, timings)
        levels += restore_checks.deep_levels(validation, scratch, files, timings)
    except RunAsRefused as exc:
        return _finish(
            validation, ValidationStatus.ERROR,
            f"Downloaded, verified and loaded; the project's own checks could not run: {exc}",
            timings, device=loaded["device"],
        )  # fmt: skip
    failed = [level for level in levels if not level["ok"]]
    if failed:
        return _unloadable(
            validation,
            "Downloaded, verified and loaded, but "
            + "; ".join(f"the {lv['level']} check failed: {lv['message']}" for lv in failed),
            timings,
            findings=levels,
            device=loaded["device"],
        )
    message = _passed_message(replica, total, timings, loaded, levels)
    return _finish(
        validation, ValidationStatus.PASSED, message, timings, findings=levels,
        device=loaded["device"],
    )  # fmt: skip


def _altered(checkpoint, scratch: Path, exc) -> str:
    """The tensors of a shard that no longer matches its sha256 that differ from the
    chunks recorded when the checkpoint last loaded on another world size."""
    mismatched = getattr(exc, "mismatched", None)
    if mismatched is None:
        return ""
    relative = mismatched.relative_to(scratch).as_posix().removesuffix(".mismatched")
    try:
        return reshard.altered_tensors(checkpoint, relative, mismatched)
    except OSError:
        return ""


def _passed_message(replica, total: int, timings: dict, loaded: dict, levels: list) -> str:
    rate = total / timings["download_verify_s"] if timings["download_verify_s"] else 0
    message = (
        f"Restored from {replica.target.name} in {timings['total_s']:.1f} s: "
        f"{human_size(total)} downloaded and verified at {human_size(rate)}/s, "
        f"{loaded['tensors']:,} tensors ({human_size(loaded['bytes'])}) loaded in "
        f"{timings['load_s']:.1f} s and moved to {loaded['device']} in "
        f"{timings['to_device_s']:.2f} s; peak memory {human_size(loaded['peak_host_bytes'])}"
    )
    if loaded["peak_device_bytes"]:
        message += f" on the host, {human_size(loaded['peak_device_bytes'])} on the GPU"
    if loaded["skipped"]:
        message += (
            f". Not loadable as tensors (checked by sha256 only): {', '.join(loaded['skipped'])}"
        )
    for level in levels:
        message += f". {level['level'].capitalize()}: {level['message']}"
    return message + "."
