"""Outbound requests are the deployment's choice (webapp/domain/outbound.py): webhooks and
S3 endpoints that a project admin types may not reach loopback, link-local or private
addresses unless LIFEBOAT_OUTBOUND_ALLOW names them; webhook deliveries are signed
(Standard Webhooks), go to the checked address, follow no redirect, and keep only the
status line; webhook URLs
are masked outside the admin's settings page; credentials_ref is limited to the names
the deployment granted the project. Real HTTP receivers on 127.0.0.1, the real S3."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest

from tests.support.dashboard import as_user
from tests.support.webhooks import BODY_SECRET, REFUSED
from webapp.domain.health import delivery
from webapp.domain.models import Event, StorageTarget
from webapp.domain.models.alerts import AlertChannel, Flip, Notification
from webapp.domain.replication import storage, storage_access, targets

pytestmark = pytest.mark.django_db


def legacy_signature_ok(secret: str, header: str, body: bytes, tolerance_s: int = 300) -> bool:
    """A receiver written for X-Lifeboat-Signature, the header sent before Standard
    Webhooks (still sent): t and v1 from the header, the hex HMAC of `<t>.<body>` under
    the secret string, compared in constant time, t recent."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    if "t" not in fields or "v1" not in fields or not secret:
        return False
    expected = hmac.new(secret.encode(), fields["t"].encode() + b"." + body, hashlib.sha256)
    fresh = abs(time.time() - int(fields["t"])) <= tolerance_s
    return fresh and hmac.compare_digest(expected.hexdigest(), fields["v1"])


def deliver_to(channel) -> Notification:
    """A new flip, processed as the alert worker does; its notification to `channel`
    delivered once."""
    flip = Flip.objects.create(
        project=channel.project,
        kind="run.failed",
        key=f"k-{channel.pk}-{time.monotonic_ns()}",
        message="Run r failed (exit code 1)",
    )
    delivery.process(flip.pk)
    notification = Notification.objects.get(flip=flip, channel=channel)
    delivery.deliver(notification.pk)
    notification.refresh_from_db()
    return notification


# --- Webhooks: signed, status line only ----------------------------------------------------


def test_a_delivery_is_signed_with_the_channel_secret_and_keeps_no_body(
    project, receivers, settings
):
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]  # the receiver's address, allowed explicitly
    ok, failing = receivers(status=200), receivers(status=500)
    for name, receiver in (("ok", ok), ("failing", failing)):
        channel = AlertChannel.objects.create(
            project=project, name=name, kind="webhook", target=receiver.url
        )
        receiver.secret = channel.secret
    assert ok.secret.startswith("whsec_") and ok.secret != failing.secret  # one per channel

    sent = deliver_to(AlertChannel.objects.get(name="ok"))
    assert sent.status == "sent"
    (request,) = ok.requests
    assert request["signature_ok"], "the receiver could not verify webhook-signature"
    assert json.loads(request["body"])["lifeboat"]["kind"] == "run.failed"
    assert request["host"] == f"127.0.0.1:{ok.port}"
    assert request["path"] == "/hooks/T0/B0/PATH-TOKEN?token=QUERY-TOKEN"
    # A receiver written for the header sent before Standard Webhooks still verifies.
    legacy = request["headers"]["X-Lifeboat-Signature"]
    assert legacy_signature_ok(ok.secret, legacy, request["body"])

    # The same headers do not verify under another channel's secret, nor another body,
    # nor another message id (the id is signed too).
    assert not ok.signature_ok(request["headers"], request["body"] + b" ")
    assert not legacy_signature_ok(ok.secret, legacy, request["body"] + b" ")
    assert not ok.signature_ok(request["headers"] | {"webhook-id": "msg_other"}, request["body"])
    ok.secret = failing.secret
    assert not ok.signature_ok(request["headers"], request["body"])
    assert not legacy_signature_ok(ok.secret, legacy, request["body"])

    failed = deliver_to(AlertChannel.objects.get(name="failing"))
    assert failing.requests and failing.requests[0]["signature_ok"]
    assert failed.status == "pending"  # a 500 is tried again later
    assert failed.last_error == "HTTP 500 Internal Server Error"
    stored = json.dumps([n.attempts for n in Notification.objects.all()]) + "".join(
        Notification.objects.values_list("last_error", flat=True)
    )
    assert BODY_SECRET not in stored


# --- Webhooks: refused addresses ----------------------------------------------------------


@pytest.mark.parametrize(("url", "kind"), REFUSED)
def test_a_webhook_to_an_internal_address_is_refused_in_the_form(project, admin, url, kind):
    response = as_user(admin).post(
        "/p/alpha/settings/alerts/", {"name": "x", "kind": "webhook", "target": url}
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert f"{kind} address" in page and "LIFEBOAT_OUTBOUND_ALLOW" in page
    assert not AlertChannel.objects.exists() and not Event.objects.exists()


def test_a_webhook_saved_earlier_is_refused_at_send_time_and_nothing_is_contacted(
    project, receivers, settings
):
    receiver = receivers()
    settings.OUTBOUND_ALLOW = []  # what a deployment has unless it says otherwise
    channel = AlertChannel.objects.create(
        project=project, name="old", kind="webhook", target=receiver.url
    )
    notification = deliver_to(channel)
    assert notification.status == "failed"  # permanent: another try would be refused too
    assert "loopback address" in notification.last_error
    assert receiver.requests == []


def test_a_redirect_is_not_followed_even_to_an_allowed_address(project, receivers, settings):
    inner = receivers()
    outer = receivers(status=302, location=f"http://127.0.0.1:{inner.port}/internal")
    settings.OUTBOUND_ALLOW = [f"127.0.0.1:{outer.port}"]  # only the first one
    channel = AlertChannel.objects.create(
        project=project, name="moved", kind="webhook", target=outer.url
    )
    notification = deliver_to(channel)
    assert len(outer.requests) == 1
    assert inner.requests == []
    assert notification.status == "failed"
    assert notification.last_error.startswith("HTTP 302 Found: redirects are not followed")


# --- Webhooks: masked outside the admin's settings page --------------------------------


def test_a_webhook_url_is_masked_in_the_audit_event_and_the_audit_page(
    project, admin, receivers, settings
):
    settings.OUTBOUND_ALLOW = ["127.0.0.1"]
    receiver = receivers()
    client = as_user(admin)
    response = client.post(
        "/p/alpha/settings/alerts/", {"name": "ops", "kind": "webhook", "target": receiver.url}
    )
    assert response.status_code == 302, response.content.decode()
    (audit,) = Event.objects.filter(type="alert_channel.created")
    assert f"http://127.0.0.1:{receiver.port}/…" in audit.message
    recorded = audit.message + json.dumps(audit.data)
    assert "PATH-TOKEN" not in recorded and "QUERY-TOKEN" not in recorded
    audit_page = client.get("/p/alpha/settings/audit/").content.decode()
    assert f"http://127.0.0.1:{receiver.port}/…" in audit_page
    assert "PATH-TOKEN" not in audit_page and "QUERY-TOKEN" not in audit_page
    # The admin's own settings page is the one place with the whole URL and the secret.
    channel = AlertChannel.objects.get()
    settings_page = client.get("/p/alpha/settings/alerts/")
    assert receiver.url.replace("&", "&amp;") in settings_page.content.decode()
    assert channel.secret in settings_page.content.decode()
    assert settings_page["Cache-Control"] == "no-store"


# --- S3 endpoints and credentials ------------------------------------------------------


@pytest.mark.parametrize(("url", "kind"), REFUSED[:5])
def test_an_s3_endpoint_on_an_internal_address_is_refused_in_the_form(project, admin, url, kind):
    response = as_user(admin).post(
        "/p/alpha/settings/storage/",
        {"name": "t", "bucket": "b", "region": "us-east-1", "endpoint_url": url},
    )
    page = response.content.decode()
    assert response.status_code == 200 and f"{kind} address" in page
    assert not StorageTarget.objects.exists()


def test_an_s3_endpoint_saved_earlier_is_refused_when_a_client_is_made(project, settings):
    settings.OUTBOUND_ALLOW = []
    target = StorageTarget.objects.create(
        project=project, name="meta", bucket="b", endpoint_url="http://169.254.169.254"
    )
    with pytest.raises(storage_access.TargetRefused, match="link-local address"):
        targets.client_for(target)
    with pytest.raises(storage_access.TargetRefused, match="link-local address"):
        storage.s3_client(project, "b")


def test_credentials_not_granted_to_the_project_are_refused_in_the_form_and_at_use(
    project, other_project, admin, s3, settings, monkeypatch
):
    settings.S3_CREDENTIALS_REFS = ["S3_BETA=beta", "S3_SHARED=*"]
    monkeypatch.setenv("S3_BETA_ACCESS_KEY_ID", s3.key)
    monkeypatch.setenv("S3_BETA_SECRET_ACCESS_KEY", s3.secret)
    client = as_user(admin)
    response = client.post(
        "/p/alpha/settings/storage/",
        {"name": "borrowed", "bucket": s3.bucket, "region": "us-east-1",
         "credentials_ref": "S3_BETA"},
    )  # fmt: skip
    page = response.content.decode()
    assert response.status_code == 200
    assert "not granted to this project" in page and "granted: S3_SHARED" in page
    assert not StorageTarget.objects.exists()

    # Saved some other way (an old row, the Django admin): refused when it is used.
    borrowed = StorageTarget.objects.create(
        project=project, name="borrowed", bucket=s3.bucket, credentials_ref="S3_BETA"
    )
    with pytest.raises(storage_access.TargetRefused, match="not granted to this project"):
        targets.client_for(borrowed)
    with pytest.raises(storage_access.TargetRefused, match="not granted to this project"):
        storage.s3_client(project, s3.bucket)
    # The project it was granted to uses it, against the real S3.
    own = StorageTarget.objects.create(
        project=other_project, name="own", bucket=s3.bucket, credentials_ref="S3_BETA"
    )
    targets.client_for(own).head_bucket(Bucket=s3.bucket)


def test_the_deployment_keys_can_be_kept_from_a_project(project, s3, settings):
    settings.S3_DEFAULT_CREDENTIALS_PROJECTS = ["gamma"]
    target = StorageTarget.objects.create(project=project, name="t", bucket=s3.bucket)
    with pytest.raises(storage_access.TargetRefused, match="deployment's own S3 keys"):
        targets.client_for(target)
    # A granted name whose keys this worker lacks does not fall back to them either.
    settings.S3_CREDENTIALS_REFS = ["S3_MISSING=alpha"]
    StorageTarget.objects.filter(pk=target.pk).update(credentials_ref="S3_MISSING")
    target.refresh_from_db()
    with pytest.raises(storage_access.TargetRefused, match="not configured on this worker"):
        targets.client_for(target)


def test_the_connection_goes_to_the_checked_address_with_the_host_name_kept(receivers):
    """No second DNS lookup after the check: the connection is made to the address the
    check returned, whatever the name would resolve to now (here: nothing at all, .invalid
    never resolves), and the name still goes in the Host header."""
    from webapp.domain import outbound
    from webapp.domain.channels import http_post

    receiver = receivers()
    checked = outbound.Destination(
        scheme="http",
        host="hook.lifeboat.invalid",
        port=receiver.port,
        address="127.0.0.1",
        target="/hooks/x",
    )
    conn = http_post.connection(checked, timeout=5)
    try:
        conn.request("POST", checked.target, body=b"{}")
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    (request,) = receiver.requests
    assert request["host"] == f"hook.lifeboat.invalid:{receiver.port}"
    assert request["path"] == "/hooks/x"


def test_a_copy_to_a_refused_endpoint_fails_at_once_with_a_clear_message(
    project, tmp_path, settings, queues
):
    """Through the real replicate task: no retry loop against an address that will be
    refused every time, and the reason is in the replica and the run's event log."""
    from tests.support.replication import make_checkpoint, replicate_now

    settings.OUTBOUND_ALLOW = []
    project.allowed_roots = [str(tmp_path)]
    project.save()
    StorageTarget.objects.create(
        project=project, name="meta", bucket="b", endpoint_url="http://169.254.169.254"
    )
    checkpoint = make_checkpoint(project, tmp_path, 1, {"model.pt": b"x" * 1000})
    (replica,) = replicate_now(checkpoint)
    assert (replica.status, replica.attempts) == ("failed", 1)
    assert replica.last_error.startswith("Not copied: The S3 endpoint URL points at ")
    assert "link-local address" in replica.last_error
    (failed,) = Event.objects.filter(type="replica.failed", run=checkpoint.run)
    assert "LIFEBOAT_OUTBOUND_ALLOW" in failed.message


def test_an_s3_location_without_a_target_uses_the_deployment_keys_only_where_granted(
    project, s3, settings
):
    """A checkpoint at s3://bucket/... in a bucket the project has no target for is read
    with the deployment's own keys: only for the projects granted them."""
    settings.S3_DEFAULT_CREDENTIALS_PROJECTS = ["*"]
    assert storage.s3_client(project, "some-bucket") is not None
    settings.S3_DEFAULT_CREDENTIALS_PROJECTS = ["gamma"]
    with pytest.raises(storage_access.TargetRefused, match="deployment's own S3 keys"):
        storage.s3_client(project, "some-bucket")
