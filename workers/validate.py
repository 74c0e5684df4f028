"""The `validate` queue: check one checkpoint and tell the truth about it.

1. claim: lock the row; do nothing if it is already settled (unless this is a requested
   re-validation); mark it "verifying" and open (or reuse, after a redelivery) a
   Validation row. Short transaction.
2. check, outside any transaction: integrity (every file under an allowed root, its size
   and sha256 read in one pass; or streamed from S3), then the load check in a child
   process with memory and time limits (webapp.domain.validation.inspector), then the
   comparisons with the run's history (keys, size).
3. record: lock the row again; if the job re-saved the step meanwhile, this result is
   about bytes that are gone, so it is kept on the Validation but not applied.

A worker killed mid-check leaves the checkpoint "verifying"; the task is acknowledged
late, so Redis redelivers it and step 1 takes the same Validation row up again.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import socket
import time

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 1.0


@shared_task(name="workers.validate.validate_checkpoint", ignore_result=True)
def validate_checkpoint(
    checkpoint_id: int, requested_by: str = "system", revalidate: bool = False
) -> str:
    claimed = claim(checkpoint_id, requested_by, revalidate)
    if claimed is None:
        return "settled"
    validation_id, fingerprint = claimed
    try:
        verdict, content, timings = run_checks(validation_id)
    except Exception as exc:
        log.exception("validation %s of checkpoint %s could not run", validation_id, checkpoint_id)
        record_error(validation_id, exc)
        return "error"
    return record(validation_id, fingerprint, verdict, content, timings)


def files_fingerprint(checkpoint) -> str:
    rows = sorted(checkpoint.files.values_list("path", "size", "sha256"))
    return hashlib.sha256(repr((checkpoint.location, rows)).encode()).hexdigest()


def claim(checkpoint_id: int, requested_by: str, revalidate: bool):
    from webapp.domain.models import Checkpoint, Validation
    from webapp.domain.models.checkpoints import CheckpointStatus
    from webapp.domain.models.recovery import ValidationKind, ValidationStatus

    with transaction.atomic():
        checkpoint = Checkpoint.objects.select_for_update().filter(pk=checkpoint_id).first()
        if checkpoint is None:
            return None
        if checkpoint.status in (
            CheckpointStatus.SAVING,
            CheckpointStatus.FAILED,
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
        validation.status = ValidationStatus.RUNNING
        validation.requested_by = validation.requested_by or requested_by
        validation.worker = socket.gethostname()
        validation.started_at = timezone.now()
        validation.bytes_total = checkpoint.total_size
        validation.bytes_done = 0
        validation.save()
        if not checkpoint.is_settled:
            # A re-validation leaves a settled status alone until it has a verdict, so
            # /latest never loses its answer while a verified checkpoint is re-checked.
            checkpoint.status = CheckpointStatus.VERIFYING
            checkpoint.save(update_fields=["status"])
        return validation.pk, files_fingerprint(checkpoint)


class _Progress:
    """Writes bytes done to the Validation row about once a second (autocommit)."""

    def __init__(self, validation_id: int):
        self.validation_id = validation_id
        self.done = 0
        self.last = time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.flush()
            self.last = now

    def flush(self) -> None:
        from webapp.domain.models import Validation

        Validation.objects.filter(pk=self.validation_id).update(bytes_done=self.done)


def run_checks(validation_id: int):
    from webapp.domain.models import Validation
    from webapp.domain.validation import checked_view, integrity, verdict
    from webapp.domain.validation.inspector import inspect_checkpoint

    validation = Validation.objects.select_related("checkpoint__project", "checkpoint__run").get(
        pk=validation_id
    )
    checkpoint = validation.checkpoint
    project = checkpoint.project
    specs = [
        integrity.FileSpec(path, size, sha)
        for path, size, sha in checkpoint.files.order_by("path").values_list(
            "path", "size", "sha256"
        )
    ]
    progress = _Progress(validation_id)
    scratch = None
    report = None
    view = settings.SCRATCH_DIR / f"validation-{validation_id}.checked"
    timings: dict[str, float] = {}
    try:
        if checkpoint.location.startswith("s3://"):
            from webapp.domain.storage import s3_client

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
            )
        else:
            checked_view.raise_open_file_limit(len(specs))
            report = integrity.check_local(
                checkpoint.location, specs, project.allowed_roots, progress, keep_open=True
            )
        progress.flush()
        timings["hash_s"] = round(report.seconds, 3)
        findings = list(report.findings)
        content: dict = {}
        if report.ok and report.base:
            # A local checkpoint is inspected through the descriptors integrity checked
            # (checked_view), never by its names in the job's directory again.
            base = checked_view.make_view(report.handles, view) if scratch is None else None
            inspection = inspect_checkpoint(
                base or report.base,
                [s.path for s in specs],
                report.single_file,
                checkpoint.format,
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
            findings += _history_findings(checkpoint, content)
        result = verdict.decide(findings, report.bytes_read, len(specs), content)
        return result, content, timings
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        checked_view.remove_view(view)
        if report is not None:
            report.close()


def _history_findings(checkpoint, content: dict) -> list:
    from webapp.domain.models.checkpoints import CheckpointStatus
    from webapp.domain.validation import verdict

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


def record(validation_id: int, fingerprint: str, result, content: dict, timings: dict) -> str:
    from webapp.domain.models import Checkpoint, Event, Validation
    from webapp.domain.models.checkpoints import CheckpointStatus
    from webapp.domain.models.recovery import ValidationStatus

    now = timezone.now()
    with transaction.atomic():
        validation = Validation.objects.select_for_update().get(pk=validation_id)
        checkpoint = Checkpoint.objects.select_for_update().get(pk=validation.checkpoint_id)
        validation.findings = [f.as_dict() for f in result.findings]
        validation.timings = timings
        validation.finished_at = now
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
            # Copies to the storage targets, queued once this verdict is committed.
            from webapp.domain.replication.policy import on_verified

            transaction.on_commit(lambda: on_verified(checkpoint.pk))
        from webapp.domain import alerts

        # Corrupt, suspicious or missing, and a save far slower than usual: alerts,
        # recorded in this transaction, sent after it commits.
        alerts.on_verdict(checkpoint, validation, previous_status)
        if previous_status != result.status:
            Event.objects.create(
                project_id=checkpoint.project_id,
                run_id=checkpoint.run_id,
                type=f"checkpoint.{result.status}",
                step=checkpoint.step,
                time=now,
                actor="worker:validate",
                message=result.message,
            )
    return result.status


def record_error(validation_id: int, exc: Exception) -> None:
    """The check could not run (an S3 outage, a full disk). The checkpoint goes back to
    the queue by way of the sweeper, unless this keeps happening."""
    from webapp.domain.models import Checkpoint, Validation
    from webapp.domain.models.checkpoints import CheckpointStatus
    from webapp.domain.models.recovery import ValidationStatus

    with transaction.atomic():
        validation = Validation.objects.select_for_update().get(pk=validation_id)
        validation.status = ValidationStatus.ERROR
        validation.message = f"The check could not run: {type(exc).__name__}: {exc}"[:2000]
        validation.finished_at = timezone.now()
        validation.save()
        checkpoint = Checkpoint.objects.select_for_update().get(pk=validation.checkpoint_id)
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


@shared_task(name="workers.validate.dispatch_validations", ignore_result=True)
def dispatch_validations(checkpoint_ids: list[int]) -> int:
    """Fan a batch out into one validation task per checkpoint, so that they run in
    parallel on every worker. Safe to run twice: validations of settled checkpoints
    return at once."""
    from webapp.domain.validation_publish import publish_validations

    publish_validations(checkpoint_ids)
    return len(checkpoint_ids)
