"""Alerts end to end: overdue and failed runs, bad checkpoints, slow saves and quotas are
recorded once, and delivered to a real local HTTP receiver and Django's e-mail outbox,
with retries for temporary errors and every attempt kept."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from django.utils import timezone

from tests.support.events import event, saved
from webapp.domain.health import alerts, delivery
from webapp.domain.models import Checkpoint, Run
from webapp.domain.models.alerts import AlertChannel, Flip, Notification

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def local_receivers_allowed(settings):
    """The receivers here listen on 127.0.0.1, which webhooks may reach only when the
    deployment allows it (webapp/domain/outbound.py)."""
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]


class Receiver:
    """A webhook endpoint on 127.0.0.1 that answers with the given statuses in turn."""

    def __init__(self, statuses=(200,)):
        self.statuses = list(statuses)
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append(json.loads(body))
                status = outer.statuses.pop(0) if len(outer.statuses) > 1 else outer.statuses[0]
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status < 400 else b"no")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    hook = Receiver()
    yield hook
    hook.close()


def deliver_all(flips) -> list[Notification]:
    """What the alert worker does for each flip: process it, deliver each notification."""
    ids = []
    for flip in flips:
        ids += delivery.process(flip.pk)
    for notification_id in ids:
        delivery.deliver(notification_id)
    return list(Notification.objects.filter(pk__in=ids))


def overdue_run(api, token, minutes_ago: float, interval_s: float = 600) -> Run:
    started = timezone.now() - timedelta(minutes=minutes_ago + 1)
    checkpoint_time = timezone.now() - timedelta(minutes=minutes_ago)
    body = {
        "events": [
            {
                **event("run.started", run="train"),
                "time": started.isoformat(),
                "expected_interval_s": interval_s,
            },
            {**saved(run="train", step=10), "time": checkpoint_time.isoformat()},
        ]
    }
    assert api.post_events(token, body).status_code == 202
    return Run.objects.get(key="train")


def test_an_overdue_run_is_recorded_once_even_by_concurrent_sweeps(
    api, token, project, receiver, queues
):
    AlertChannel.objects.create(project=project, name="hook", kind="webhook", target=receiver.url)
    overdue_run(api, token, minutes_ago=30)  # 10 min interval + 5 min grace: overdue
    found, barrier = [], threading.Barrier(4)

    def sweep():
        from django.db import connection

        barrier.wait()
        try:
            found.extend(alerts.check_runs())
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [f.kind for f in found] == ["run.overdue"]
    assert Flip.objects.count() == 1
    assert alerts.check_runs() == []  # still overdue: nothing new
    # Two sweeps that read the run before either moved it: only the first one moves it.
    seen = Run.objects.get(key="train")
    seen.alert_state = "up"
    Run.objects.filter(pk=seen.pk).update(alert_state="up")
    assert alerts.claim_state(seen, "overdue") is True
    assert alerts.claim_state(seen, "overdue") is False

    (notification,) = deliver_all(Flip.objects.all())
    assert notification.status == "sent" and notification.attempts[0]["status"] == 200
    (sent,) = receiver.received
    assert sent["text"].startswith("🔴 [alpha] Run train is overdue: no checkpoint for 30 min")
    assert "(expected every 10 min)" in sent["text"]
    assert sent["lifeboat"]["kind"] == "run.overdue" and sent["lifeboat"]["run"] == "train"
    assert sent["lifeboat"]["url"].endswith("/p/alpha/runs/train/")
    # The alert links to the run page's "Resume from the latest verified checkpoint".
    assert sent["lifeboat"]["resume_url"].endswith("/p/alpha/runs/train/#recover")
    assert "#recover|Resume from the latest verified checkpoint>" in sent["text"]
    # Processing the same flip again sends nothing more.
    assert delivery.process(Flip.objects.get().pk) == []


def test_a_run_that_checkpoints_again_is_up_and_a_failed_run_is_reported(
    api, token, project, receiver, queues
):
    AlertChannel.objects.create(project=project, name="hook", kind="webhook", target=receiver.url)
    overdue_run(api, token, minutes_ago=30)
    assert [f.kind for f in alerts.check_runs()] == ["run.overdue"]
    assert (
        api.post_events(
            token, saved(run="train", step=20, t=0) | {"time": timezone.now().isoformat()}
        ).status_code
        == 202
    )
    assert [f.kind for f in alerts.check_runs()] == ["run.up"]
    failed = event("run.failed", run="train", exit_code=137, error="Traceback\nCUDA error: OOM")
    assert api.post_events(token, failed | {"time": timezone.now().isoformat()}).status_code == 202
    (flip,) = alerts.check_runs()
    assert flip.kind == "run.failed" and "exit code 137): CUDA error: OOM" in flip.message
    assert alerts.check_runs() == []


def test_a_run_without_an_interval_learns_it_from_its_history(api, token, project, queues):
    now = timezone.now()
    events = [event("run.started", run="quiet") | {"time": (now - timedelta(hours=5)).isoformat()}]
    for i in range(4):  # every 20 min, the last one 2 h ago
        at = now - timedelta(hours=2, minutes=20 * (3 - i))
        events.append(saved(run="quiet", step=i) | {"time": at.isoformat()})
    assert api.post_events(token, {"events": events}).status_code == 202
    (flip,) = alerts.check_runs()
    run = Run.objects.get(key="quiet")
    assert run.interval_learned and run.expected_interval_s == pytest.approx(1200)
    assert flip.kind == "run.overdue" and "expected every 20 min" in flip.message


def test_heartbeats_that_stop_make_a_run_overdue(api, token, project, queues, settings):
    settings.ALERT_HEARTBEAT_GRACE_S = 600
    beat = event("run.heartbeat", run="hb", step=5) | {
        "time": (timezone.now() - timedelta(minutes=15)).isoformat()
    }
    assert api.post_events(token, beat).status_code == 202
    (flip,) = alerts.check_runs()
    assert "no heartbeat for 15 min" in flip.message


def test_a_corrupt_checkpoint_is_mailed_and_a_bad_webhook_is_retried_then_given_up(
    api, token, project, tmp_path, queues, settings
):
    from workers.validate import validate_checkpoint

    settings.ALERT_MAX_ATTEMPTS = 3
    flaky = Receiver(statuses=[503, 200])
    broken = Receiver(statuses=[404])
    try:
        AlertChannel.objects.create(
            project=project, name="mail", kind="email", target="oncall@example.com, ml@example.com"
        )
        AlertChannel.objects.create(project=project, name="flaky", kind="webhook", target=flaky.url)
        AlertChannel.objects.create(
            project=project, name="broken", kind="webhook", target=broken.url
        )
        AlertChannel.objects.create(
            project=project,
            name="only-overdue",
            kind="webhook",
            target=flaky.url,
            kinds=["run.overdue"],
        )
        project.allowed_roots = [str(tmp_path)]
        project.save()
        (tmp_path / "model.bin").write_bytes(b"short")
        body = saved(
            run="r",
            step=1,
            location=str(tmp_path),
            files=[{"path": "model.bin", "size": 100, "sha256": "ab" * 32}],
        )
        assert api.post_events(token, body).status_code == 202
        validate_checkpoint(Checkpoint.objects.get().pk)
        (flip,) = Flip.objects.all()
        assert flip.kind == "checkpoint.corrupt"

        notifications = {n.channel.name: n for n in deliver_all([flip])}
        assert sorted(notifications) == ["broken", "flaky", "mail"]
        assert notifications["mail"].status == "sent"
        (message,) = mail.outbox
        assert message.to == ["oncall@example.com", "ml@example.com"]
        assert message.subject == "[Lifeboat alpha] Checkpoint corrupt"
        assert "model.bin is truncated: 5 bytes on disk" in message.body
        # 404: permanent, given up at once, with the answer kept.
        assert notifications["broken"].status == "failed"
        assert "HTTP 404" in notifications["broken"].last_error
        # 503: temporary, tried again when due, then sent; both attempts kept.
        flaky_one = notifications["flaky"]
        assert flaky_one.status == "pending" and "HTTP 503" in flaky_one.last_error
        assert isinstance(delivery.deliver(flaky_one.pk), float)  # not due yet: nothing sent
        Notification.objects.filter(pk=flaky_one.pk).update(next_attempt_at=timezone.now())
        assert delivery.deliver(flaky_one.pk) == "sent"
        flaky_one.refresh_from_db()
        assert [a["status"] for a in flaky_one.attempts] == [None, 200]
        assert [a["ok"] for a in flaky_one.attempts] == [False, True]
        assert len(flaky.received) == 2
    finally:
        flaky.close()
        broken.close()


def test_a_slow_save_and_storage_over_quota_are_flagged(api, token, project, queues):
    events = [saved(run="s", step=i, t=i, save_seconds=10.0) for i in range(1, 5)]
    events.append(saved(run="s", step=5, t=5, save_seconds=95.0))
    assert api.post_events(token, {"events": events}).status_code == 202
    alerts.check_slow_save(Checkpoint.objects.get(step=4))
    assert not Flip.objects.exists()
    alerts.check_slow_save(Checkpoint.objects.get(step=5))
    (flip,) = Flip.objects.all()
    assert flip.kind == "save.slow" and "took 95.0 s, against a usual 10.0 s" in flip.message

    project.storage_quota_bytes = 6000  # five checkpoints of 1,500 bytes
    project.save()
    (over,) = alerts.check_quotas()
    assert over.kind == "storage.over_quota" and "7,500 bytes" in over.message
    assert alerts.check_quotas() == []  # still over: said once
