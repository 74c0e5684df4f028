"""A big checkpoint's validation spread over workers: its files split into parts
(ValidationPart rows, balanced by bytes, a DCP folder split by shard), one `validate_part`
task per part that any validate worker on any host takes (it hashes its part's files and
inspects them, in parallel within the worker too), then one `decide_validation` task that
merges every part into the verdict, recorded as a one-task validation's would be.

Only a local checkpoint of at least VALIDATION_FANOUT_BYTES with two files or more fans
out: a small one stays one task (the fan-out costs a few task hops), and an S3 one is
fetched once by one worker. Every task takes ids and is safe to run twice: a part that
finished is not run again, the last part to finish publishes the verdict task after its
commit, and a verdict already recorded is not recorded again. A part task that was lost
is published again when the sweeper re-queues the checkpoint (claim() takes the same
Validation up, and fan_out() re-publishes the parts that have not finished).
"""

from __future__ import annotations

import logging
import socket
import threading

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from webapp.domain import lease
from webapp.domain.locks import for_update
from webapp.domain.models import Validation, ValidationPart
from webapp.domain.models.recovery import ValidationStatus
from webapp.domain.transient import is_transient
from webapp.domain.validation import checked_view, checking, integrity, node_local, verdict
from webapp.domain.validation.checking import file_specs, parallelism
from webapp.domain.validation.inspect_parts import merge_parts, raw_parts, split
from webapp.domain.validation.integrity import Finding

log = logging.getLogger(__name__)


def fan_out(validation_id: int, fingerprint: str) -> bool:
    """Splits the validation into part tasks when its checkpoint is big enough; False when
    it should run as one task."""

    validation = Validation.objects.select_related("checkpoint__project").get(pk=validation_id)
    checkpoint = validation.checkpoint
    if node_local.applies(checkpoint):
        return _fan_out_by_host(validation_id, fingerprint, checkpoint)
    threshold = settings.VALIDATION_FANOUT_BYTES
    rows = list(checkpoint.files.order_by("path").values_list("path", "size"))
    if (
        not threshold
        or checkpoint.total_size < threshold
        or len(rows) < 2
        or checkpoint.location.startswith("s3://")
    ):
        return False
    with transaction.atomic():
        locked = for_update(Validation.objects).get(pk=validation_id)
        if not locked.parts.exists():
            sizes = dict(rows)
            groups = split([path for path, _ in rows], sizes, settings.VALIDATION_FANOUT_PARTS)
            ValidationPart.objects.bulk_create(
                ValidationPart(
                    validation=locked,
                    index=i,
                    files=group,
                    bytes_total=sum(sizes[p] for p in group),
                    # What the verdict task compares with the files' rows when it records.
                    result={"fingerprint": fingerprint},
                )
                for i, group in enumerate(groups)
            )
        locked.files_total = len(rows)
        locked.save(update_fields=["files_total"])
        pending = list(locked.parts.exclude(finished_at__isnull=False).values_list("pk", flat=True))
        transaction.on_commit(lambda: _publish_parts(pending, validation_id, fingerprint))
    return True


def _fan_out_by_host(validation_id: int, fingerprint: str, checkpoint) -> bool:
    """A node-local checkpoint: one part per host, on that host's queue (node_local.py);
    rank 0's shared files first."""

    with transaction.atomic():
        locked = for_update(Validation.objects).get(pk=validation_id)
        if not locked.parts.exists():
            ValidationPart.objects.bulk_create(
                ValidationPart(
                    validation=locked,
                    index=i,
                    files=part["files"],
                    bytes_total=part["bytes"],
                    host=part["host"],
                    result={"fingerprint": fingerprint, "phase": part["phase"]},
                )
                for i, part in enumerate(node_local.plan(checkpoint))
            )
        locked.files_total = checkpoint.file_count
        locked.save(update_fields=["files_total"])
        pending = _publishable(locked)
        transaction.on_commit(lambda: _publish_parts(pending, validation_id, fingerprint))
    return True


def _publishable(validation) -> list[int]:
    """The unfinished parts that may run now: the shared phase first, then the rest."""
    unfinished = list(
        validation.parts.filter(finished_at__isnull=True)
        .order_by("index")
        .values_list("pk", "result__phase")
    )
    shared = [pk for pk, phase in unfinished if phase == node_local.PHASE_SHARED]
    return shared or [pk for pk, _ in unfinished]


def _publish_parts(part_ids: list[int], validation_id: int, fingerprint: str) -> None:
    hosts = dict(ValidationPart.objects.filter(pk__in=part_ids).values_list("pk", "host"))
    for part_id in part_ids:
        current_app.send_task(
            "workers.validate.validate_part",
            args=[part_id],
            queue=node_local.queue_for(hosts.get(part_id, "")),
        )
    if not part_ids:  # every part had finished: the verdict task may have been lost
        current_app.send_task(
            "workers.validate.decide_validation", args=[validation_id, fingerprint]
        )


class PartProgress:
    """Adds this part's bytes and files to the whole validation's, about once a second
    (an UPDATE with F(): many parts on many workers add to the same row)."""

    def __init__(self, validation_id: int):
        self.validation_id = validation_id
        self.bytes = self.files = 0
        self.lock = threading.Lock()
        self.last = timezone.now()

    def __call__(self, n: int, file: str = "") -> None:
        with self.lock:
            self.bytes += n
        if (timezone.now() - self.last).total_seconds() >= 1.0:
            self.flush()

    def file_done(self, path: str, size: int) -> None:
        with self.lock:
            self.files += 1

    def flush(self) -> None:
        with self.lock:
            n, files, self.bytes, self.files = self.bytes, self.files, 0, 0
            self.last = timezone.now()
        if n or files:
            Validation.objects.filter(pk=self.validation_id).update(
                bytes_done=F("bytes_done") + n, files_done=F("files_done") + files
            )


def run_part(part_id: int, worker: str = "") -> str:
    part = ValidationPart.objects.select_related("validation__checkpoint__project").get(pk=part_id)
    if part.finished_at is not None or part.validation.is_final:
        _part_finished(part.pk)  # a redelivery: make sure the verdict task went out
        return "done"
    ValidationPart.objects.filter(pk=part_id).update(
        status=ValidationStatus.RUNNING, worker=worker or socket.gethostname()
    )
    try:
        # The whole validation's lease, renewed while a part of it runs: when every
        # worker that had a part died, it lapses and the sweeper sends the check again
        # (whose fan-out publishes the parts that never finished).
        with lease.kept(Validation, part.validation_id, settings.VALIDATION_LEASE_S):
            result, status = _check_part(part), ValidationStatus.PASSED
    except Exception as exc:
        if is_transient(exc):
            raise  # tried again (workers/retrying.py): the part itself did not fail
        log.exception("part %s of validation %s could not run", part_id, part.validation_id)
        result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        status = ValidationStatus.ERROR
    result["fingerprint"] = part.result.get("fingerprint", "")
    if part.result.get("phase"):
        result["phase"] = part.result["phase"]
    if part.host:  # a node-local part: say where its files are
        for finding in result.get("findings", []):
            finding["message"] = f"{finding['message']} (on host {part.host})"
    with transaction.atomic():
        locked = for_update(ValidationPart.objects).get(pk=part_id)
        if locked.finished_at is None:
            locked.result, locked.status, locked.finished_at = result, status, timezone.now()
            locked.save(update_fields=["result", "status", "finished_at"])
    _part_finished(part_id)
    return status


def _check_part(part) -> dict:
    checkpoint = part.validation.checkpoint
    phase = part.result.get("phase")
    specs = file_specs(checkpoint)
    progress = PartProgress(part.validation_id)
    view = settings.SCRATCH_DIR / f"validation-{part.validation_id}-part-{part.index}.checked"
    checked_view.raise_open_file_limit(len(specs))
    report = integrity.check_local(
        checkpoint.location,
        specs,
        checkpoint.project.allowed_roots,
        progress,
        keep_open=True,
        workers=parallelism(),
        only=set(part.files),
    )
    try:
        progress.flush()
        out = {
            "findings": [f.as_dict() for f in report.findings],
            "bytes_read": report.bytes_read,
            "hash_s": round(report.seconds, 3),
            "inspections": [],
        }
        if phase == node_local.PHASE_SHARED:
            # Checked here; inspected with each host's part, which reads these bytes.
            out["shared"] = node_local.keep_shared(report, part.files)
            return out
        if report.ok and report.base:
            base = checked_view.make_view(report.handles, view)
            inspected = part.files
            if phase == node_local.PHASE_HOSTS:
                shared = _shared_part(part)
                node_local.fill_view(base, specs, report.handles, shared.result.get("shared", {}))
                if shared.host == part.host:  # inspected here, where they were hashed
                    inspected = [*shared.files, *part.files]
            out["inspections"] = raw_parts(
                base,
                [s.path for s in specs],
                report.single_file,
                inspected,
                parts=parallelism(),
                timeout_s=settings.VALIDATION_TIMEOUT_S,
                memory_bytes=settings.VALIDATION_MEMORY_BYTES,
                warm=True,
            )
        return out
    finally:
        checked_view.remove_view(view)
        report.close()


def _shared_part(part):
    """The shared phase's part of the same validation (an empty one when it had none)."""

    shared = part.validation.parts.filter(result__phase=node_local.PHASE_SHARED).first()
    return shared or ValidationPart(files=[], host="\0", result={})


def _part_finished(part_id: int) -> None:
    """The last part to finish publishes the verdict task (after its commit); the last
    of a node-local check's shared phase publishes the hosts' parts."""

    with transaction.atomic():
        part = ValidationPart.objects.get(pk=part_id)
        validation = for_update(Validation.objects).get(pk=part.validation_id)
        fingerprint = part.result.get("fingerprint", "")
        if validation.is_final:
            return
        if validation.parts.filter(finished_at__isnull=True).exists():
            if part.result.get("phase") == node_local.PHASE_SHARED:
                pending = _publishable(validation)
                transaction.on_commit(lambda: _publish_parts(pending, validation.pk, fingerprint))
            return
        transaction.on_commit(
            lambda: current_app.send_task(
                "workers.validate.decide_validation", args=[validation.pk, fingerprint]
            )
        )


def decide(validation_id: int, fingerprint: str) -> str:
    """Merges the parts into one verdict and records it (checking.record)."""

    validation = Validation.objects.select_related("checkpoint__run").get(pk=validation_id)
    parts = list(validation.parts.order_by("index"))
    if validation.is_final:
        return "settled"
    if not parts or any(p.finished_at is None for p in parts):
        return "waiting"
    errors = [p.result.get("error") for p in parts if p.result.get("error")]
    if errors:
        checking.record_error(validation_id, RuntimeError(f"a part could not run: {errors[0]}"))
        return "error"
    findings = [Finding(**f) for p in parts for f in p.result.get("findings", [])]
    inspections = [i for p in parts for i in p.result.get("inspections", [])]
    timings = {"hash_s": max(p.result.get("hash_s", 0.0) for p in parts)}
    content: dict = {}
    if inspections and not any(f.severity in ("corrupt", "missing", "refused") for f in findings):
        checkpoint = validation.checkpoint
        inspection = merge_parts(inspections, checkpoint.format)
        timings.update(inspection["timings"])
        findings += [Finding(**f) for f in inspection["findings"]]
        content = {
            k: inspection.get(k)
            for k in ("format", "tensors", "parameters", "dtypes", "keys")
            if inspection.get(k) is not None
        }
        findings += checking.history_findings(checkpoint, content)
    bytes_read = sum(p.result.get("bytes_read", 0) for p in parts)
    file_count = sum(len(p.files) for p in parts)
    result = verdict.decide(findings, bytes_read, file_count, content)
    return checking.record(validation_id, fingerprint, result, content, timings)
