"""Quarantine: a verified checkpoint that jobs cannot come back from is set aside, so
that no resume, `latest` or automatic resume takes it again until an operator releases
it; and restart loops: a lineage whose automatic resumes make no progress is stopped.

Why a verified checkpoint can still be bad: its bytes are the ones written and it loads,
yet the job dies right after loading it (a model or optimizer state that no longer fits
the code, NaNs that blow up at the first step, a shard that loads but holds the wrong
values). Lifeboat sees that as resumes from it that fail before any progress.

- **No progress**: the resumed run never reported a step past its checkpoint's (in a
  heartbeat, a metric or a checkpoint).
- **Quarantine** (`note_failed_run`): after `project.quarantine_after` such failures of
  resumes from one checkpoint, it is quarantined with their evidence (exit codes, the
  error class, the last line of each error); a restore test that could not load it
  quarantines it at once (restore_test.py). `resumable_q()` and
  `Run.latest_verified_checkpoint()` leave quarantined checkpoints out, so the next
  resume falls back to the newest checkpoint before it.
- **Restart loop** (`restart_loop`): when the lineage's last `project.loop_after`
  resumes each ended (failed, or preempted) without progress, automatic resume
  stops and says why in one `run.restart_loop` alert, instead of spending max_restarts.
- **Release** (`release`): an operator's, audited as a `checkpoint.released` event.
"""

from __future__ import annotations

import re

from django.db import transaction
from django.utils import timezone

from webapp.domain.health import flips
from webapp.domain.locks import for_update
from webapp.domain.models import Checkpoint, Event, MetricPoint, Resume, Run
from webapp.domain.models.runs import RunStatus
from webapp.domain.recovery.resume import new_run_key

_ERROR_CLASS = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))\b")


def made_progress(run, checkpoint) -> bool:
    """The run reported a step past the checkpoint it was resumed from: in a heartbeat
    (Run.last_step), a metric or a checkpoint."""

    if run.last_step is not None and run.last_step > checkpoint.step:
        return True
    if MetricPoint.objects.filter(run=run, step__gt=checkpoint.step).exists():
        return True
    return run.checkpoints.filter(step__gt=checkpoint.step).exists()


def error_class(text: str) -> str:
    """The exception's name in a failure's text (the last one named), or ''."""
    found = _ERROR_CLASS.findall(text or "")
    return found[-1].rsplit(".", 1)[-1] if found else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def failed_resumes(checkpoint) -> list:
    """The runs of Lifeboat's resumes from `checkpoint` (its own launches: a job that only
    claims `resumed_from` in its events does not count) that failed before any progress,
    oldest first."""

    resumes = Resume.objects.filter(checkpoint=checkpoint).select_related("new_run")
    runs = [_resumed_run(resume) for resume in resumes.order_by("pk")]
    return [
        run
        for run in runs
        if run is not None and run.status == RunStatus.FAILED and not made_progress(run, checkpoint)
    ]


def evidence(runs) -> str:
    """One line per failed resume: its run, exit code, error class and last line."""
    lines = []
    for run in runs:
        cls = error_class(run.error)
        said = _last_line(run.error)
        lines.append(
            f"{run.key}: exit code {run.exit_code}"
            + (f", {cls}" if cls and cls not in said else "")
            + (f": {said}" if said else "")
        )
    return "\n".join(lines)


def note_failed_run(run) -> bool:
    """A run failed: if it was resumed from a checkpoint and made no progress, count it
    against that checkpoint, and quarantine the checkpoint once the project's number is
    reached. True when this quarantined it."""
    checkpoint = run.resumed_from
    if checkpoint is None or checkpoint.quarantined_at is not None:
        return False
    if made_progress(run, checkpoint):
        return False
    failures = failed_resumes(checkpoint)
    limit = max(run.project.quarantine_after, 1)
    if len(failures) < limit:
        return False
    reason = (
        f"{len(failures)} resumes from step {checkpoint.step} failed before any progress:\n"
        + evidence(failures)
    )
    return quarantine(checkpoint, reason)


def quarantine(checkpoint, reason: str, actor: str = "system") -> bool:
    """Set the checkpoint aside with `reason`, recorded and alerted once. False when it
    was already quarantined."""
    with transaction.atomic():
        locked = for_update(Checkpoint.objects).select_related("run").get(pk=checkpoint.pk)
        if locked.quarantined_at is not None:
            return False
        locked.quarantined_at = timezone.now()
        locked.quarantine_reason = reason[:4000]
        locked.save(update_fields=["quarantined_at", "quarantine_reason"])
        message = (
            f"Step {locked.step} of run {locked.run.key} is quarantined: no resume, "
            f"`latest` or automatic resume takes it until an operator releases it. {reason}"
        )
        Event.record(
            "checkpoint.quarantined", checkpoint=locked, actor=actor, message=message[:4000]
        )
        flips.record(
            "checkpoint.quarantined",
            f"checkpoint.quarantined:{locked.pk}:{locked.quarantined_at.isoformat()}",
            message[:2000],
            project_id=locked.project_id,
            run_id=locked.run_id,
            checkpoint_id=locked.pk,
        )
    checkpoint.quarantined_at, checkpoint.quarantine_reason = (
        locked.quarantined_at,
        locked.quarantine_reason,
    )
    return True


def release(checkpoint, actor: str) -> bool:
    """An operator takes the checkpoint out of quarantine; False if it was not in it."""

    with transaction.atomic():
        locked = for_update(Checkpoint.objects).select_related("run").get(pk=checkpoint.pk)
        if locked.quarantined_at is None:
            return False
        reason = locked.quarantine_reason
        locked.quarantined_at, locked.quarantine_reason = None, ""
        locked.save(update_fields=["quarantined_at", "quarantine_reason"])
        Event.record(
            "checkpoint.released",
            checkpoint=locked,
            actor=actor,
            message=f"Step {locked.step} of run {locked.run.key} released from quarantine "
            f"by {actor}; it was quarantined because: {reason}"[:4000],
        )
    checkpoint.quarantined_at, checkpoint.quarantine_reason = None, ""
    return True


def _resumed_run(resume):
    """The run a resume's job reported as: linked by the follower, else found by the
    key the job was given (resume.new_run_key)."""

    if resume.new_run is not None:
        return resume.new_run
    return Run.objects.filter(project_id=resume.project_id, key=new_run_key(resume)).first()


def restart_loop(chain, project) -> str | None:
    """Why the lineage `chain` (newest run first) is in a restart loop, or None: its last
    `project.loop_after` resumes each ended without progress. A person's resumes count
    too: one that got somewhere ends the streak, one that did not adds to it."""

    limit = max(project.loop_after, 1)
    attempts = list(
        Resume.objects.filter(run__in=chain)
        .select_related("new_run", "checkpoint__run")
        .order_by("-created_at", "-pk")[:limit]
    )
    if len(attempts) < limit:
        return None
    runs = [_resumed_run(attempt) for attempt in attempts]
    for attempt, run in zip(attempts, runs, strict=True):
        # Preempted counts too: a job the scheduler stops before it gets anywhere, every
        # time, would otherwise be relaunched forever (preemptions do not spend max_restarts).
        ended = run is not None and run.status in (RunStatus.FAILED, RunStatus.PREEMPTED)
        if not ended or made_progress(run, attempt.checkpoint):
            return None
    errors = {_last_line(run.error) for run in runs}
    same = (
        f"; each failed with the same error: {next(iter(errors))}"
        if len(errors) == 1 and errors != {""}
        else ""
    )
    steps = ", ".join(str(a.checkpoint.step) for a in reversed(attempts))
    return f"its last {limit} resumes (from steps {steps}) each ended before any progress{same}"
