"""Alert channel kinds (webapp/domain/channels): one transport class per kind in one table,
each delivering to a real HTTP receiver on 127.0.0.1; the signed kinds verify with the
`standardwebhooks` library, the way docs/alerts.md tells a receiver to, with the same
webhook-id on every try of a notification; Slack gets its own message, unsigned."""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from datetime import datetime
from http.server import ThreadingHTTPServer

import pytest
from django.utils import timezone
from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.dashboard import as_user, make_run
from tests.support.servers import ROOT, wait_for
from tests.support.webhooks import REFUSED, standard_webhooks_ok
from webapp.domain import channels
from webapp.domain.channels import signing
from webapp.domain.channels.http_post import post
from webapp.domain.health import delivery
from webapp.domain.models.alerts import AlertChannel, Flip, Notification

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def local_receivers_allowed(settings):
    """The receivers listen on 127.0.0.1, which the deployment must allow
    (webapp/domain/outbound.py)."""
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]


def flip_for(project, message="Run r failed (exit code 1)", kind="run.failed", run=None):
    return Flip.objects.create(
        project=project,
        run=run,
        kind=kind,
        key=f"k-{time.monotonic_ns()}",
        message=message,
    )


def notify(channel, flip) -> Notification:
    """What the alert worker does: process the flip, deliver its notification once."""
    delivery.process(flip.pk)
    notification = Notification.objects.get(flip=flip, channel=channel)
    delivery.deliver(notification.pk)
    notification.refresh_from_db()
    return notification


# --- The table ------------------------------------------------------------------------------


def test_every_kind_is_one_class_in_the_table_and_the_form_and_model_offer_it(project, admin):
    assert list(channels.KINDS) == ["webhook", "slack", "json", "email"]
    for kind, transport in channels.KINDS.items():
        assert issubclass(transport, channels.Transport) and transport.kind == kind
        assert transport.label and transport.target_help
    # The model's choices are the table itself (a callable): a new kind needs no migration.
    field = AlertChannel._meta.get_field("kind")
    assert list(field.choices) == channels.choices()
    assert field.deconstruct()[3]["choices"] is channels.choices
    page = as_user(admin).get("/p/alpha/settings/alerts/").content.decode()
    for kind, transport in channels.KINDS.items():
        assert f'value="{kind}"' in page and transport.label in page


@pytest.mark.parametrize("kind", ["slack", "json"])
@pytest.mark.parametrize(("url", "refused"), REFUSED[:3])
def test_every_url_kind_refuses_an_internal_address_in_the_form(
    project, admin, settings, kind, url, refused
):
    settings.OUTBOUND_ALLOW = []
    response = as_user(admin).post(
        "/p/alpha/settings/alerts/", {"name": "x", "kind": kind, "target": url}
    )
    assert response.status_code == 200 and f"{refused} address" in response.content.decode()
    assert not AlertChannel.objects.exists()


def test_a_channel_of_a_kind_this_server_lacks_fails_at_once_and_shows_no_target(
    project, receivers
):
    receiver = receivers()
    channel = AlertChannel.objects.create(
        project=project, name="pager", kind="webhook", target=receiver.url
    )
    AlertChannel.objects.filter(pk=channel.pk).update(kind="pager")  # a newer version's row
    channel.refresh_from_db()
    assert channel.shown_target == "…" and not channel.signed
    notification = notify(channel, flip_for(project))
    assert notification.status == "failed"
    assert notification.last_error == "this server has no alert channel kind 'pager'"
    assert receiver.requests == []


# --- Standard Webhooks ----------------------------------------------------------------------


def test_the_signature_matches_the_specs_own_example():
    """The example of the Standard Webhooks spec (and its libraries' tests)."""
    assert (
        signing.sign(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            b'{"test": 2432232314}',
        )
        == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


def test_a_json_delivery_verifies_with_the_standardwebhooks_library(project, receivers):
    receiver = receivers()
    channel = AlertChannel.objects.create(
        project=project, name="mine", kind="json", target=receiver.url
    )
    other = AlertChannel.objects.create(
        project=project, name="other", kind="json", target=receiver.url, kinds=["run.up"]
    )
    assert channel.signed and channel.secret.startswith("whsec_")
    flip = flip_for(project)
    assert notify(channel, flip).status == "sent"
    (request,) = receiver.requests
    headers, body = request["headers"], request["body"]

    payload = Webhook(channel.secret).verify(body, headers)
    assert payload["type"] == "run.failed"
    assert payload["timestamp"] == flip.created_at.isoformat()
    assert payload["data"]["message"] == "Run r failed (exit code 1)"
    assert payload["data"]["project"] == "alpha" and payload["data"]["resume_url"] is None
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    assert headers["webhook-id"].startswith("msg_")
    # The test's own reading of the spec agrees with the library.
    assert standard_webhooks_ok(channel.secret, headers, body)

    for forged in (
        (channel.secret, body + b" ", headers),
        (other.secret, body, headers),
        (channel.secret, body, headers | {"webhook-id": "msg_replayed_as_another"}),
        (channel.secret, body, headers | {"webhook-timestamp": str(int(time.time()) - 3600)}),
    ):
        secret, forged_body, forged_headers = forged
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(forged_body, forged_headers)


def test_a_secret_made_before_standard_webhooks_still_verifies(project, receivers):
    """Secrets were `whsec_` and 48 hex digits: valid base64 as they are, so a channel
    keeps its secret and its receiver switches to a library without a new one."""
    receiver = receivers()
    channel = AlertChannel.objects.create(
        project=project, name="old", kind="webhook", target=receiver.url
    )
    AlertChannel.objects.filter(pk=channel.pk).update(secret="whsec_" + secrets.token_hex(24))
    channel.refresh_from_db()
    assert notify(channel, flip_for(project)).status == "sent"
    (request,) = receiver.requests
    verified = Webhook(channel.secret).verify(request["body"], request["headers"])
    assert verified["lifeboat"]["kind"] == "run.failed"


def test_every_try_of_a_notification_carries_the_same_webhook_id(project, receivers):
    receiver = receivers(status=503)
    channel = AlertChannel.objects.create(
        project=project, name="flaky", kind="webhook", target=receiver.url
    )
    receiver.secret = channel.secret
    first = notify(channel, flip_for(project))
    assert first.status == "pending"
    receiver.status = 200
    Notification.objects.filter(pk=first.pk).update(next_attempt_at=timezone.now())
    assert delivery.deliver(first.pk) == "sent"
    notify(channel, flip_for(project))  # another alert
    ids = [r["headers"]["webhook-id"] for r in receiver.requests]
    assert ids[0] == ids[1] != ids[2]  # a retry is the same message; another alert is not
    assert all(r["signature_ok"] for r in receiver.requests)
    for request in receiver.requests:  # each try signed at its own time
        Webhook(channel.secret).verify(request["body"], request["headers"])


# --- Slack --------------------------------------------------------------------------------


def test_a_slack_channel_gets_slacks_own_message_unsigned_and_escaped(project, receivers):
    receiver = receivers()
    channel = AlertChannel.objects.create(
        project=project, name="slack", kind="slack", target=receiver.url
    )
    run = make_run(project, "train")
    flip = flip_for(project, message="Run train failed: <!channel> & <https://evil|click>", run=run)
    assert notify(channel, flip).status == "sent"
    (request,) = receiver.requests
    assert "webhook-signature" not in {k.lower() for k in request["headers"]}
    sent = json.loads(request["body"])
    assert set(sent) == {"text", "blocks"}
    assert sent["text"].startswith("🔴 [alpha] Run train failed: &lt;!channel&gt; &amp; ")
    section, context, links = sent["blocks"]
    assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
    assert "&lt;https://evil|click&gt;" in section["text"]["text"]
    assert "<!channel>" not in json.dumps(sent)
    assert context["elements"][0]["text"] == "*alpha* · `run.failed` · run `train`"
    assert "/p/alpha/runs/train/|Open in Lifeboat>" in links["text"]["text"]
    assert (
        "/p/alpha/runs/train/#recover|Resume from the latest verified checkpoint>"
        in (links["text"]["text"])
    )
    # Its URL's path is the secret: masked everywhere but the admin's settings page.
    assert channel.shown_target == f"http://127.0.0.1:{receiver.port}/…"


def test_the_webhook_kind_keeps_its_body_for_existing_receivers(project, receivers):
    receiver = receivers()
    channel = AlertChannel.objects.create(
        project=project, name="hook", kind="webhook", target=receiver.url
    )
    flip = flip_for(project, kind="storage.over_quota", message="Project alpha is over quota")
    notify(channel, flip)
    sent = json.loads(receiver.requests[0]["body"])
    assert set(sent) == {"text", "lifeboat"}
    assert set(sent["lifeboat"]) == {
        "kind", "project", "run", "checkpoint", "message", "url", "resume_url", "time", "data",
    }  # fmt: skip
    assert sent["text"].startswith("🟠 [alpha] Project alpha is over quota <")
    assert datetime.fromisoformat(sent["lifeboat"]["time"]) == flip.created_at


# --- docs/alerts.md's receivers, run as written -------------------------------------------


def documented_receivers() -> tuple[str, str]:
    """The two Python blocks of docs/alerts.md's "Checking a delivery": the receiver with
    the library, and the check without one."""
    text = (ROOT / "docs" / "alerts.md").read_text()
    section = text.split("## Checking a delivery", 1)[1].split("\n## ", 1)[0]
    library, plain = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert "standardwebhooks" in library and "standardwebhooks" not in plain
    return library, plain


def test_the_documented_receivers_accept_a_delivery_and_refuse_a_forgery(project):
    library, plain = documented_receivers()
    received: list[dict] = []
    documented: dict = {"__name__": "documented_receiver"}  # not __main__: no port 8080
    exec(library, documented)  # noqa: S102 (the docs' own code, run as a reader would)
    documented["handle"] = received.append
    server = ThreadingHTTPServer(("127.0.0.1", 0), documented["Receiver"])
    server.RequestHandlerClass.log_message = lambda *args: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/lifeboat"
    try:
        channel = AlertChannel.objects.create(project=project, name="own", kind="json", target=url)
        documented["SECRET"] = channel.secret
        assert notify(channel, flip_for(project)).status == "sent"  # the receiver said 204
        # The receiver answers 204 first and handles the alert after: wait for it.
        (alert,) = wait_for(lambda: received, timeout=10)
        assert alert["type"] == "run.failed" and alert["data"]["project"] == "alpha"

        # A forgery: the body changed after signing. The documented receiver says 401,
        # which Lifeboat itself would record as a permanent failure.
        body = json.dumps({"type": "run.up", "data": {}}).encode()
        headers = signing.headers(channel.secret, "msg_x", int(time.time()), b"{}")
        with pytest.raises(channels.PermanentError, match="HTTP 401 Unauthorized"):
            post(url, body, headers, timeout=5)
        assert len(received) == 1
    finally:
        server.shutdown()
        server.server_close()

    checks: dict = {}
    exec(plain, checks)  # noqa: S102
    ok = checks["lifeboat_delivery_ok"]
    body = b'{"type": "run.failed"}'
    now = int(time.time())
    headers = signing.headers(channel.secret, "msg_1", now, body)
    assert ok(channel.secret, headers, body)
    assert not ok(channel.secret, headers, body + b" ")
    assert not ok(channel.secret, headers | {"webhook-id": "msg_2"}, body)
    assert not ok(signing.new_secret(), headers, body)
    stale = signing.headers(channel.secret, "msg_1", now - 3600, body)
    assert not ok(channel.secret, stale, body)
