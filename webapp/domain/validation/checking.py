"""The validation of one checkpoint, as the `validate` queue runs it (workers/validate.py
is its entry point):

1. claim: lock the row; do nothing if it is already settled (unless this is a requested
   re-validation); mark it "verifying" and open (or reuse, after a redelivery) a
   Validation row. Short transaction.
2. check, outside any transaction: integrity (every file under an allowed root, its size
   and sha256 read in one pass, the files hashed by a bounded pool of threads; or
   streamed from S3), then the load check in limited child processes (inspector.py; a
   many-file checkpoint in parts at the same time, inspect_parts.py), then the
   comparisons with the run's history (keys, size). A big local checkpoint is instead
   fanned out as part tasks any worker can take, then one verdict task (fanout.py).
3. record: lock the row again; if the job re-saved the step meanwhile, this result is
   about bytes that are gone, so it is kept on the Validation but not applied.

A worker killed mid-check leaves the checkpoint "verifying"; the task is acknowledged
late, so Redis redelivers it and step 1 takes the same Validation row up again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import threading
import time

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp.domain import lease
from webapp.domain.health import alerts
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Event, Validation
from webapp.domain.models.checkpoints import NOT_SAVED, UNSETTLED, CheckpointStatus
from webapp.domain.models.recovery import ValidationKind, ValidationStatus
from webapp.domain.ranks import describe_ranks
from webapp.domain.replication import policy
from webapp.domain.replication.storage import s3_client
from webapp.domain.validation import checked_view, integrity, verdict
from webapp.domain.validation.inspect_parts import inspect_in_parts
from webapp.domain.validation.integrity import FileSpec

PROGRESS_EVERY_S = 1.0


def parallelism() -> int:
    """Files hashed, and inspection parts run, at once in one worker."""
    return max(1, min(settings.VALIDATION_PARALLEL, os.cpu_count() or 1))


def files_fingerprint(checkpoint) -> str:
    rows = sorted(checkpoint.files.values_list("path", "size", "sha256"))
    return hashlib.sha256(repr((checkpoint.location, rows)).encode()).hexdigest()


def claim(checkpoint_id: int, requested_by: str, revalidate: bool):
    with transaction.atomic():
        checkpoint = for_update(Checkpoint.objects.filter(pk=checkpoint_id)).first()
        if checkpoint is None:
            return None
        if checkpoint.status in (
            *NOT_SAVED,
            CheckpointStatus.DELETING,
            CheckpointStatus.DELETED,
        ):
            return None
        if checkpoint.is_settled and not revalidate:
            return None
        validation = (
            checkpoint.validations.filter(
                kind=ValidationKind.INTEGRITY,
                status__in=(ValidationStatus.QUEUED, ValidationStatus.RUNNING),
            )
            .order_by("-created_at")
            .first()
        ) or Validation(checkpoint=checkpoint, kind=ValidationKind.INTEGRITY)
        # A worker renews the lease while it checks (webapp/domain/lease.py): a live one
        # is not doubled; a lapsed one died, and this task takes the row over. A row the
        # sweeper handed back to the queue has no worker: the first task takes it.
        now = timezone.now()
        if (
            validation.status == ValidationStatus.RUNNING
            and validation.worker
            and (busy := lease.busy_until(validation.lease_until, now))
        ):
            return busy
        if busy := _over_fair_share(checkpoint, now):
            return busy
        validation.status = ValidationStatus.RUNNING
        validation.lease_until = lease.until(settings.VALIDATION_LEASE_S)
        validation.requested_by = validation.requested_by or requested_by
        validation.worker = socket.gethostname()
        validation.started_at = timezone.now()
        validation.bytes_total = checkpoint.total_size
        validation.bytes_done = 0
        validation.files_total = checkpoint.files.count()
        validation.files_done = 0
        validation.files_running = {}
        validation.save()
        if not checkpoint.is_settled:
            # A re-validation leaves a settled status alone until it has a verdict, so
            # /latest never loses its answer while a verified checkpoint is re-checked.
            checkpoint.status = CheckpointStatus.VERIFYING
            checkpoint.save(update_fields=["status"])
        return validation.pk, files_fingerprint(checkpoint)


# How long a check deferred for fairness waits before it asks again.
FAIR_SHARE_RETRY_S = 10.0


def _over_fair_share(checkpoint, now) -> lease.Busy | None:
    """Busy when the checkpoint's project already has VALIDATION_PROJECT_MAX_ACTIVE checks
    running and another project's checkpoints wait: one project's huge checkpoints then
    leave the other workers to the others. Work-conserving: with nobody else waiting, a
    project takes every worker."""

    limit = settings.VALIDATION_PROJECT_MAX_ACTIVE
    if not limit:
        return None
    running = (
        Validation.objects.filter(
            checkpoint__project_id=checkpoint.project_id,
            kind=ValidationKind.INTEGRITY,
            status=ValidationStatus.RUNNING,
            lease_until__gte=now,
        )
        .exclude(worker="")
        .exclude(checkpoint_id=checkpoint.pk)
        .count()
    )
    if running < limit:
        return None
    # Served by the partial index checkpoint_unsettled.
    others = Checkpoint.objects.filter(status__in=UNSETTLED).exclude(
        project_id=checkpoint.project_id
    )
    return lease.Busy(FAIR_SHARE_RETRY_S) if others.exists() else None


class FileProgress:
    """Bytes done, files done and the bytes of each file in flight, written to the
    Validation row about once a second (autocommit). Called from the hashing threads."""

    def __init__(self, validation_id: int, files_total: int = 0):
        self.validation_id = validation_id
        self.done = 0
        self.files_done = 0
        self.files_total = files_total
        self.running: dict[str, int] = {}
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, n: int, file: str = "") -> None:
        with self.lock:
            self.done += n
            if file:
                self.running[file] = self.running.get(file, 0) + n
            now = time.monotonic()
            due = now - self.last >= PROGRESS_EVERY_S
            if due:
                self.last = now
        if due:
            self.flush()

    def file_done(self, path: str, size: int) -> None:
        with self.lock:
            self.running.pop(path, None)
            self.files_done += 1

    def flush(self) -> None:
        with self.lock:
            fields = {
                "bytes_done": self.done,
                "files_done": self.files_done,
                "files_running": dict(self.running),
            }
        if self.files_total:
            fields["files_total"] = self.files_total
        Validation.objects.filter(pk=self.validation_id).update(**fields)


def file_specs(checkpoint) -> list:
    """The files the job reported, as integrity checks them, in path order."""

    rows = checkpoint.files.order_by("path").values_list("path", "size", "sha256")
    return [FileSpec(path, size, sha) for path, size, sha in rows]


def run_checks(validation_id: int):
    validation = Validation.objects.select_related("checkpoint__project", "checkpoint__run").get(
        pk=validation_id
    )
    checkpoint = validation.checkpoint
    project = checkpoint.project
    specs = file_specs(checkpoint)
    progress = FileProgress(validation_id, len(specs))
    scratch = None
    report = None
    view = settings.SCRATCH_DIR / f"validation-{validation_id}.checked"
    timings: dict[str, float] = {}
    try:
        if checkpoint.location.startswith("s3://"):
            bucket, _ = integrity.split_s3(checkpoint.location)
            scratch = settings.SCRATCH_DIR / f"validation-{validation_id}"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(mode=0o700, parents=True)
            report = integrity.check_s3(
                checkpoint.location,
                specs,
                project.allowed_roots,
                s3_client(project, bucket),
                str(scratch),
                progress,
                # Objects fetched at once, each hashed as it comes (bench/validate_s3.py:
                # 2 GiB in 8 shards, 4.18 s one at a time, 2.82 s two at once on 2 cores).
                workers=parallelism(),
            )
        else:
            checked_view.raise_open_file_limit(len(specs))
            report = integrity.check_local(
                checkpoint.location,
                specs,
                project.allowed_roots,
                progress,
                keep_open=True,
                workers=parallelism(),
            )
        progress.flush()
        timings["hash_s"] = round(report.seconds, 3)
        findings = list(report.findings)
        content: dict = {}
        if report.ok and report.base:
            # A local checkpoint is inspected through the descriptors integrity checked
            # (checked_view), never by its names in the job's directory again.
            base = checked_view.make_view(report.handles, view) if scratch is None else None
            inspection = inspect_in_parts(
                base or report.base,
                [s.path for s in specs],
                report.single_file,
                checkpoint.format,
                parts=parallelism(),
                timeout_s=settings.VALIDATION_TIMEOUT_S,
                memory_bytes=settings.VALIDATION_MEMORY_BYTES,
                # A worker checks many checkpoints: fork each limited child from a helper
                # that imported torch once, instead of paying ~2 s of imports per check.
                warm=True,
            )
            timings.update({k: round(v, 3) for k, v in inspection.get("timings", {}).items()})
            findings += [integrity.Finding(**f) for f in inspection.get("findings", [])]
            content = {
                k: inspection.get(k)
                for k in ("format", "tensors", "parameters", "dtypes", "keys")
                if inspection.get(k) is not None
            }
            findings += history_findings(checkpoint, content)
        result = verdict.decide(findings, report.bytes_read, len(specs), content)
        return result, content, timings
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        checked_view.remove_view(view)
        if report is not None:
            report.close()


def history_findings(checkpoint, content: dict) -> list:
    verified = checkpoint.run.checkpoints.filter(status=CheckpointStatus.VERIFIED).exclude(
        pk=checkpoint.pk
    )
    previous = verified.filter(step__lt=checkpoint.step).order_by("-step").first()
    findings = []
    if previous is not None and content.get("keys") and previous.content.get("keys"):
        findings += verdict.compare_keys(content["keys"], previous.content["keys"], previous.step)
    usual = list(verified.order_by("-step").values_list("total_size", flat=True)[:5])
    findings += verdict.compare_size(checkpoint.total_size, usual)
    return findings


def _lock(validation_id: int):
    """The validation's checkpoint, then the validation, locked in that order
    (webapp/domain/locks.py)."""

    checkpoint_id = Validation.objects.values_list("checkpoint_id", flat=True).get(pk=validation_id)
    checkpoint = for_update(Checkpoint.objects).get(pk=checkpoint_id)
    return checkpoint, for_update(Validation.objects).get(pk=validation_id)


def record(validation_id: int, fingerprint: str, result, content: dict, timings: dict) -> str:
    now = timezone.now()
    with transaction.atomic():
        checkpoint, validation = _lock(validation_id)
        if validation.is_final:
            return "settled"  # a verdict task that ran twice: the first one recorded it
        validation.findings = [f.as_dict() for f in result.findings]
        validation.timings = timings
        validation.finished_at = now
        missing = checkpoint.missing_parts()
        if missing or checkpoint.status in NOT_SAVED:
            # A part was replaced or went missing while this ran: never a verdict on a
            # checkpoint that is not whole (the complete one is checked when it is).
            validation.status = ValidationStatus.ERROR
            why = f"no part from {describe_ranks(missing)}" if missing else checkpoint.status
            validation.message = f"Not whole when checked ({why}); no verdict recorded."
            validation.save()
            return "superseded"
        if files_fingerprint(checkpoint) != fingerprint:
            validation.status = ValidationStatus.ERROR
            validation.message = (
                "The job saved this step again while it was being checked; this result is "
                "about the earlier files, and the new ones are checked separately."
            )
            validation.save()
            return "superseded"
        validation.status = result.validation_status
        validation.message = result.message
        validation.save()
        previous_status = checkpoint.status
        checkpoint.status = result.status
        checkpoint.status_message = result.message
        checkpoint.content = content
        checkpoint.updated_at = now
        if result.status == CheckpointStatus.VERIFIED:
            checkpoint.verified_at = now
        checkpoint.save(
            update_fields=["status", "status_message", "content", "updated_at", "verified_at"]
        )
        if result.status == CheckpointStatus.VERIFIED:
            # The copies its targets' policies ask for, in this very transaction: a
            # verified checkpoint never exists without the replica rows it is owed (the
            # sweeper re-sends a pending one whose message was lost). Queued on commit.
            policy.request(checkpoint)

        # Corrupt, suspicious or missing, and a save far slower than usual: alerts,
        # recorded in this transaction, sent after it commits.
        alerts.on_verdict(checkpoint, validation, previous_status)
        if previous_status != result.status:
            Event.record(
                f"checkpoint.{result.status}",
                checkpoint=checkpoint,
                time=now,
                actor="worker:validate",
                message=result.message,
            )
    return result.status


def record_error(validation_id: int, exc: Exception) -> None:
    """The check could not run (an S3 outage, a full disk). The checkpoint goes back to
    the queue by way of the sweeper, unless this keeps happening."""

    with transaction.atomic():
        checkpoint, validation = _lock(validation_id)
        if validation.is_final:
            return  # recorded already (a verdict, or this error by an earlier copy)
        validation.status = ValidationStatus.ERROR
        validation.message = f"The check could not run: {type(exc).__name__}: {exc}"[:2000]
        validation.finished_at = timezone.now()
        validation.save()
        if checkpoint.status != CheckpointStatus.VERIFYING:
            return  # a re-validation of a settled checkpoint: keep its verdict
        errors = checkpoint.validations.filter(
            status=ValidationStatus.ERROR, created_at__gte=checkpoint.created_at
        ).count()
        if errors >= settings.VALIDATION_MAX_ERRORS:
            checkpoint.status = CheckpointStatus.SUSPICIOUS
            checkpoint.status_message = (
                f"Could not be checked after {errors} attempts; last error: {validation.message}"
            )
        else:
            checkpoint.status = CheckpointStatus.REPORTED
            checkpoint.validation_enqueued_at = None  # the sweeper puts it back later
        checkpoint.save(update_fields=["status", "status_message", "validation_enqueued_at"])
