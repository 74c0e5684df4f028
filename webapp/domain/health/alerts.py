"""When something is wrong, or nothing happens: find the status changes worth an alert,
record each once, and hand it to delivery.

* Runs (check_runs, every minute from beat): a running run whose last checkpoint is
  older than its expected interval plus grace (Run.health(): the same rule the dashboard
  shows), or whose heartbeats stopped for ALERT_HEARTBEAT_GRACE_S, becomes overdue; when
  it checkpoints again it is up. A run that failed is reported once. A run that never
  said how often it checkpoints gets an interval learned from its history (the median
  gap between its checkpoints, once it has three).
* Checkpoints (the validation verdict): corrupt, suspicious or missing; a save that took
  far longer than the run's usual (ALERT_SLOW_SAVE_FACTOR times the median of its last
  saves).
* Replicas that failed after their retries; restore tests that failed.
* Storage over the project's quota.

"Recorded once" holds with any number of workers: a run's state moves with a conditional
UPDATE (only the worker whose UPDATE changed the row records the flip), and every flip
has a unique key, so a repeat inserts nothing.

This module finds problems; sending them is webapp/domain/health/delivery.py (process,
deliver) through the channel kinds of webapp/domain/channels.
"""

from __future__ import annotations

import logging
import statistics
from datetime import timedelta
from typing import cast

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from lifeboat.units import format_seconds
from webapp.domain.health.flips import record
from webapp.domain.models import Checkpoint, Project, Run
from webapp.domain.models.runs import Health, RunStatus
from webapp.domain.recovery import auto_resume, quarantine

log = logging.getLogger(__name__)

# Names other modules know from here (see the docstring).
__all__ = [
    "check_quotas",
    "check_runs",
    "check_slow_save",
    "claim_state",
    "learn_interval",
    "on_replica_failed",
    "on_verdict",
    "record",
]


# -- runs ---------------------------------------------------------------------------------


def learn_interval(run) -> float | None:
    """The median gap between the run's last 20 checkpoints, once there are three."""
    times = list(
        run.checkpoints.exclude(saved_at__isnull=True)
        .order_by("-saved_at")
        .values_list("saved_at", flat=True)[:20]
    )
    if len(times) < 3:
        return None
    gaps = [(a - b).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    gap = statistics.median(gaps)
    return gap if gap > 0 else None


def check_runs(now=None) -> list:
    """One sweep over the runs that can change state; returns the flips it recorded."""

    now = now or timezone.now()
    flips = []
    heartbeat_grace = settings.ALERT_HEARTBEAT_GRACE_S

    # Runs that never said how often they checkpoint: learn it from their history.
    for run in Run.objects.filter(status=RunStatus.RUNNING, expected_interval_s__isnull=True):
        learned = learn_interval(run)
        if learned:
            Run.objects.filter(pk=run.pk, expected_interval_s__isnull=True).update(
                expected_interval_s=learned, interval_learned=True
            )

    running = (
        Run.objects.filter(status=RunStatus.RUNNING)
        .with_dashboard_stats()
        .with_health(now)
        .select_related("project")
    )
    for run in running:
        silent = (
            run.last_heartbeat_at is not None
            and (now - run.last_heartbeat_at).total_seconds() > heartbeat_grace
        )
        overdue = run.health == Health.OVERDUE or silent
        if overdue and run.alert_state != "overdue":
            if claim_state(run, "overdue"):
                flips.append(_overdue_flip(run, now, silent))
                _auto_resume(run, "silent")
        elif run.alert_state == "preempted":
            claim_state(run, "")  # back by itself (a requeue): a later preemption counts
        elif not overdue and run.alert_state == "overdue" and claim_state(run, "up"):
            flips.append(
                record(
                    "run.up",
                    f"run.up:{run.pk}:{now.isoformat()}",
                    f"Run {run.key} is checkpointing on time again.",
                    project_id=run.project_id,
                    run_id=run.pk,
                )
            )
    for run in Run.objects.filter(status=RunStatus.FAILED).exclude(alert_state="failed"):
        if claim_state(run, "failed"):
            error = (run.error or "no error given").strip().splitlines()
            flips.append(
                record(
                    "run.failed",
                    f"run.failed:{run.pk}:{run.ended_at.isoformat() if run.ended_at else ''}",
                    f"Run {run.key} failed (exit code {run.exit_code}): "
                    f"{error[-1][:300] if error else ''}",
                    project_id=run.project_id,
                    run_id=run.pk,
                )
            )
            _auto_resume(run, "failed")
    # Preempted and not back by itself (a requeue starts the same key again): resumed,
    # without an alert (not a failure) and not counted against max_restarts.
    settled = now - timedelta(seconds=settings.AUTO_RESUME_PREEMPTED_AFTER_S)
    preempted = Run.objects.filter(status=RunStatus.PREEMPTED, ended_at__lte=settled)
    for run in preempted.exclude(alert_state="preempted"):
        if claim_state(run, "preempted"):
            _auto_resume(run, "preempted")
    Run.objects.filter(status=RunStatus.FINISHED).exclude(alert_state="ended").update(
        alert_state="ended"
    )
    return [f for f in flips if f is not None]


def _auto_resume(run, reason: str) -> None:
    try:
        if reason == "failed":
            # Before the resume: a checkpoint quarantined now is not the one it takes.
            quarantine.note_failed_run(run)
        auto_resume.maybe_auto_resume(run, reason)
    except Exception:  # noqa: BLE001 (the alert stands even if the resume cannot start)
        log.exception("automatic resume of run %s failed", run.pk)


def claim_state(run, state: str) -> bool:
    """Move the run's alert state from what this worker saw: a conditional UPDATE, so of
    two sweeps that saw the same state only one moves it (and records the flip)."""

    return Run.objects.filter(pk=run.pk, alert_state=run.alert_state).update(alert_state=state) == 1


def _overdue_flip(run, now, silent: bool):
    since = run.last_checkpoint_at or run.started_at or run.created_at
    if silent:
        why = f"no heartbeat for {format_seconds((now - run.last_heartbeat_at).total_seconds())}"
    else:
        why = (
            f"no checkpoint for {format_seconds((now - since).total_seconds())} "
            f"(expected every {format_seconds(run.expected_interval_s)})"
        )
    return record(
        "run.overdue",
        f"run.overdue:{run.pk}:{now.isoformat()}",
        f"Run {run.key} is overdue: {why}.",
        project_id=run.project_id,
        run_id=run.pk,
        data={"last_checkpoint_at": since.isoformat() if since else None},
    )


# -- checkpoints ----------------------------------------------------------------------------


def on_verdict(checkpoint, validation, previous_status: str) -> None:
    """Called inside record()'s transaction when a validation decided a status."""
    status = checkpoint.status
    if status in ("corrupt", "suspicious", "missing") and previous_status != status:
        record(
            f"checkpoint.{status}",
            f"checkpoint.{status}:{checkpoint.pk}:{validation.pk}",
            f"Checkpoint at step {checkpoint.step} of run {checkpoint.run.key} is {status}: "
            f"{checkpoint.status_message[:500]}",
            project_id=checkpoint.project_id,
            run_id=checkpoint.run_id,
            checkpoint_id=checkpoint.pk,
        )
    check_slow_save(checkpoint)


def check_slow_save(checkpoint) -> None:
    if not checkpoint.save_seconds:
        return
    usual = cast(  # save_seconds__isnull=False: every one is a float
        list[float],
        list(
            Checkpoint.objects.filter(run_id=checkpoint.run_id, save_seconds__isnull=False)
            .exclude(pk=checkpoint.pk)
            .order_by("-step")
            .values_list("save_seconds", flat=True)[:20]
        ),
    )
    if len(usual) < 3:
        return
    median = statistics.median(usual)
    if median > 0 and checkpoint.save_seconds > settings.ALERT_SLOW_SAVE_FACTOR * median:
        record(
            "save.slow",
            f"save.slow:{checkpoint.pk}",
            f"Saving step {checkpoint.step} of run {checkpoint.run.key} took "
            f"{checkpoint.save_seconds:.1f} s, against a usual {median:.1f} s: a slow or "
            "full file system?",
            project_id=checkpoint.project_id,
            run_id=checkpoint.run_id,
            checkpoint_id=checkpoint.pk,
        )


def on_replica_failed(replica) -> None:
    checkpoint = replica.checkpoint
    record(
        "replica.failed",
        f"replica.failed:{replica.pk}:{replica.attempts}:{timezone.now().isoformat()}",
        f"Copying step {checkpoint.step} of run {checkpoint.run.key} to {replica.target.name} "
        f"failed after {replica.attempts} attempts: {replica.last_error[:500]}",
        project_id=checkpoint.project_id,
        run_id=checkpoint.run_id,
        checkpoint_id=checkpoint.pk,
    )


# -- storage --------------------------------------------------------------------------------


def check_quotas() -> list:
    flips = []
    for project in Project.objects.filter(storage_quota_bytes__isnull=False):
        used = (
            Checkpoint.objects.filter(project=project)
            .exclude(status="deleted")
            .aggregate(total=Sum("total_size"))["total"]
            or 0
        )
        # storage_quota_bytes__isnull=False above: the quota is set.
        over = used > cast(int, project.storage_quota_bytes)
        if over == project.over_quota:
            continue
        changed = Project.objects.filter(pk=project.pk, over_quota=project.over_quota).update(
            over_quota=over
        )
        if changed and over:
            flips.append(
                record(
                    "storage.over_quota",
                    f"storage.over_quota:{project.pk}:{timezone.now().isoformat()}",
                    f"Project {project.slug} keeps {used:,} bytes of checkpoints, over its "
                    f"quota of {project.storage_quota_bytes:,} bytes: tighten retention.",
                    project_id=project.pk,
                    data={"used": used, "quota": project.storage_quota_bytes},
                )
            )
    return [f for f in flips if f is not None]
