"""When something is wrong, or nothing happens: find the status changes worth an alert,
record each once, and send it to the project's channels.

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
has a unique key, so a repeat inserts nothing. A flip is processed once (claimed with a
conditional UPDATE of processed_at); each channel gets one Notification (unique), whose
delivery is retried for temporary errors with backoff, every attempt stored.
"""

from __future__ import annotations

import json
import logging
import statistics
from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from lifeboat.units import format_seconds
from webapp.domain.locks import for_update

log = logging.getLogger(__name__)

SEVERITY_ICON = {
    "run.overdue": "🔴",
    "run.failed": "🔴",
    "checkpoint.corrupt": "🔴",
    "checkpoint.missing": "🔴",
    "replica.failed": "🔴",
    "restore.failed": "🔴",
    "checkpoint.suspicious": "🟠",
    "save.slow": "🟠",
    "storage.over_quota": "🟠",
    "checkpoint.incomplete": "🔴",
    "host.no_worker": "🔴",
    "checkpoint.quarantined": "🔴",
    "run.restart_loop": "🔴",
    "storage.delete_unconfirmed": "🟠",
    "storage.orphans": "🟠",
    "run.up": "🟢",
}


def record(
    kind: str, key: str, message: str, *, project_id, run_id=None, checkpoint_id=None, data=None
):
    """Insert the flip unless one with `key` exists; enqueue its processing after commit.
    Returns the new Flip, or None if it was recorded before."""
    from webapp.domain.models.alerts import Flip

    try:
        with transaction.atomic():
            flip = Flip.objects.create(
                project_id=project_id,
                run_id=run_id,
                checkpoint_id=checkpoint_id,
                kind=kind,
                key=key[:200],
                message=message,
                data=data or {},
            )
    except IntegrityError:
        return None
    transaction.on_commit(lambda: _enqueue_processing(flip.pk))
    return flip


def _enqueue_processing(flip_id: int) -> None:
    from webapp.domain import publish

    try:
        publish.send("workers.alerts.process_flip", (flip_id,))
    except Exception:  # noqa: BLE001 (the beat sweep processes it within a minute)
        log.warning("could not enqueue flip %s; the sweep will process it", flip_id)


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
    from webapp.domain.models import Run
    from webapp.domain.models.runs import Health, RunStatus

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
    from webapp.domain.recovery import auto_resume, quarantine

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
    from webapp.domain.models import Run

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
    from webapp.domain.models import Checkpoint

    if not checkpoint.save_seconds:
        return
    usual = list(
        Checkpoint.objects.filter(run_id=checkpoint.run_id, save_seconds__isnull=False)
        .exclude(pk=checkpoint.pk)
        .order_by("-step")
        .values_list("save_seconds", flat=True)[:20]
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
    from webapp.domain.models import Checkpoint, Project

    flips = []
    for project in Project.objects.filter(storage_quota_bytes__isnull=False):
        used = (
            Checkpoint.objects.filter(project=project)
            .exclude(status="deleted")
            .aggregate(total=Sum("total_size"))["total"]
            or 0
        )
        over = used > project.storage_quota_bytes
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


# -- processing and delivery --------------------------------------------------------------------


def process(flip_id: int) -> list[int]:
    """Claim the flip and create one notification per channel that wants it; returns the
    notification ids to deliver. A second call finds it claimed and does nothing."""
    from webapp.domain.models.alerts import AlertChannel, Flip, Notification

    now = timezone.now()
    if Flip.objects.filter(pk=flip_id, processed_at__isnull=True).update(processed_at=now) != 1:
        return []
    flip = Flip.objects.get(pk=flip_id)
    ids = []
    for channel in AlertChannel.objects.filter(project_id=flip.project_id, enabled=True):
        if not channel.wants(flip.kind):
            continue
        notification, _ = Notification.objects.get_or_create(
            flip=flip, channel=channel, defaults={"next_attempt_at": now}
        )
        ids.append(notification.pk)
    return ids


class TemporaryError(Exception):
    """Worth another try later (a timeout, a 5xx, a refused connection)."""


class PermanentError(Exception):
    """Another try would fail the same way (a 4xx, a malformed address)."""


# The flips whose run the page offers to resume (dashboard recovery_views.recovery_offer).
RECOVERABLE = ("run.failed", "run.overdue")


def payload(flip) -> dict:
    """Slack-compatible: Slack (and Mattermost, Discord's /slack endpoint) show `text`;
    anything else can read the `lifeboat` object."""
    base = settings.SITE_URL.rstrip("/")
    link = f"{base}/p/{flip.project.slug}/"
    if flip.run_id:
        link += f"runs/{flip.run.key}/"
    if flip.checkpoint_id:
        link = f"{base}/p/{flip.project.slug}/checkpoints/{flip.checkpoint_id}/"
    icon = SEVERITY_ICON.get(flip.kind, "")
    text = f"{icon} [{flip.project.slug}] {flip.message} <{link}|Open in Lifeboat>"
    # Recovery where the trouble shows: the run page's "Resume from the latest verified
    # checkpoint" (templates/dashboard/run_detail.html, #recover).
    resume_url = f"{link}#recover" if flip.kind in RECOVERABLE and flip.run_id else None
    if resume_url:
        text += f" · <{resume_url}|Resume from the latest verified checkpoint>"
    return {
        "text": text,
        "lifeboat": {
            "kind": flip.kind,
            "project": flip.project.slug,
            "run": flip.run.key if flip.run_id else None,
            "checkpoint": flip.checkpoint_id,
            "message": flip.message,
            "url": link,
            "resume_url": resume_url,
            "time": flip.created_at.isoformat(),
            "data": flip.data,
        },
    }


def _send_webhook(channel, body: dict) -> int:
    """One signed POST to the channel's URL, checked against the deployment's outbound
    policy at this very moment (webapp/domain/health/webhook_delivery.py)."""
    from webapp.domain.health import webhook_delivery

    try:
        return webhook_delivery.post(
            channel.target,
            json.dumps(body).encode(),
            channel.secret,
            timeout=settings.ALERT_TIMEOUT_S,
        )
    except webhook_delivery.DeliveryFailed as exc:
        raise (TemporaryError if exc.temporary else PermanentError)(str(exc)) from None


def _send_email(addresses: str, flip) -> int:
    import smtplib

    to = [a.strip() for a in addresses.split(",") if a.strip()]
    if not to:
        raise PermanentError("the channel has no address")
    smtp = settings.EMAIL_BACKEND == "django.core.mail.backends.smtp.EmailBackend"
    if smtp and not settings.EMAIL_HOST:
        raise PermanentError("no EMAIL_HOST is configured: this server cannot send e-mail")
    subject = f"[Lifeboat {flip.project.slug}] {flip.get_kind_display()}"
    body = payload(flip)
    text = f"{flip.message}\n\n{body['lifeboat']['url']}\n"
    if body["lifeboat"]["resume_url"]:
        text += f"\nResume from the latest verified checkpoint: {body['lifeboat']['resume_url']}\n"
    try:
        send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, to, fail_silently=False)
    except (smtplib.SMTPException, OSError) as exc:
        raise TemporaryError(f"{type(exc).__name__}: {exc}") from None
    return 0


def deliver(notification_id: int) -> str | float:
    """One attempt. Returns the final status, or the seconds to wait before the next
    attempt. Safe to call twice: a settled notification is left alone."""
    from webapp.domain.models.alerts import Notification, NotificationStatus

    now = timezone.now()
    with transaction.atomic():
        notification = (
            for_update(Notification.objects, skip_locked=True)
            .filter(pk=notification_id, status=NotificationStatus.PENDING)
            .first()
        )
        if notification is None:
            return "settled"
        # Lease it: another delivery of the same id waits for next_attempt_at.
        if notification.next_attempt_at and notification.next_attempt_at > now:
            return (notification.next_attempt_at - now).total_seconds()
        notification.next_attempt_at = now + timedelta(seconds=settings.ALERT_TIMEOUT_S * 3)
        notification.save(update_fields=["next_attempt_at"])
    channel, flip = notification.channel, notification.flip
    attempt = {"at": now.isoformat(), "ok": False, "status": None, "error": ""}
    outcome: str | float
    try:
        if channel.kind == "webhook":
            attempt["status"] = _send_webhook(channel, payload(flip))
        else:
            _send_email(channel.target, flip)
        attempt["ok"] = True
        notification.status = NotificationStatus.SENT
        notification.sent_at = timezone.now()
        notification.last_error = ""
        outcome = "sent"
    except (TemporaryError, PermanentError) as exc:
        attempt["error"] = str(exc)
        notification.last_error = str(exc)
        tries = len(notification.attempts) + 1
        if isinstance(exc, PermanentError) or tries >= settings.ALERT_MAX_ATTEMPTS:
            notification.status = NotificationStatus.FAILED
            outcome = "failed"
        else:
            delay = settings.ALERT_RETRY_BASE_S * 4 ** (tries - 1)
            notification.next_attempt_at = timezone.now() + timedelta(seconds=delay)
            outcome = float(delay)
    notification.attempts = [*notification.attempts, attempt]
    notification.save(
        update_fields=["status", "attempts", "last_error", "next_attempt_at", "sent_at"]
    )
    return outcome
