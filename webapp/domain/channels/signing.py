"""Standard Webhooks signatures (https://www.standardwebhooks.com, spec 1.0), so that a
receiver verifies a delivery with a ready library (`standardwebhooks` for Python, Go,
JavaScript, Ruby, Java, ...) instead of code of its own.

* `webhook-id`: the message id, the same on every try of one notification, so a receiver
  can drop a repeat (message_id()).
* `webhook-timestamp`: integer Unix seconds of this try; receivers refuse old ones.
* `webhook-signature`: `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`, keyed with
  the base64-decoded part of the channel's `whsec_<base64>` secret.

Deliveries also keep carrying `X-Lifeboat-Signature: t=<timestamp>,v1=<hex>` (the HMAC of
`<t>.<body>` keyed with the whole secret string), the header Lifeboat sent before, so a
receiver written for it goes on working; docs/alerts.md shows both.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
LEGACY_HEADER = "X-Lifeboat-Signature"


def new_secret() -> str:
    """`whsec_` and 32 random bytes in base64, the form Standard Webhooks libraries read.
    (Secrets made before were `whsec_` and 48 hex digits: those are valid base64 too, of
    36 bytes, so they verify with the same libraries and need no change.)"""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def key(secret: str) -> bytes:
    """The HMAC key a secret stands for: its base64 part, decoded."""
    encoded = secret.removeprefix(PREFIX)
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise ValueError("the signing secret is not whsec_ and base64") from None


def message_id(secret: str, notification_id: int, flip_key: str) -> str:
    """`msg_` and 32 hex digits, fixed by the notification: every try of it sends the same
    id. Keyed with the channel's secret so that two deployments (or one whose database was
    reset and counts ids from 1 again) never send a receiver the same id for different
    alerts."""
    digest = hmac.new(
        secret.encode(), f"{notification_id}\n{flip_key}".encode(), hashlib.sha256
    ).hexdigest()
    return f"msg_{digest[:32]}"


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: `v1,` and the base64 HMAC-SHA256 of
    `<msg_id>.<timestamp>.<body>`."""
    mac = hmac.new(key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def legacy_signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-Lifeboat-Signature` value: t=<timestamp>,v1=<hex HMAC-SHA256 of
    b"<timestamp>." + body>, keyed with the secret string as it is."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Every signature header of one try."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
        LEGACY_HEADER: legacy_signature(secret, timestamp, body),
    }
