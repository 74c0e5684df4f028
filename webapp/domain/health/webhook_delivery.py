"""One signed webhook POST to a checked address (docs/alerts.md, "Checking a delivery").

* The URL is checked by webapp.domain.health.outbound at every delivery (the deployment's
  allowances may have changed since the channel was saved) and the connection goes to
  the very address that was checked, with the URL's host in the Host header and as the
  TLS server name: a DNS answer that changes after the check cannot redirect it.
* Redirects are not followed: a 3xx is a failure that names its status.
* Only the status line is kept: the answer's body is never read into an attempt, an
  error or a page (an internal service's answer is not shown to whoever set the URL).
* Each delivery carries `X-Lifeboat-Signature: t=<unix time>,v1=<hex>`, the
  HMAC-SHA256 of `<t>.<body>` under the channel's secret (Stripe's scheme), so a
  receiver can tell Lifeboat's posts from anyone else's and refuse old replays.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import secrets
import socket
import ssl
import time
from http import HTTPStatus

from webapp.domain.health import outbound

SIGNATURE_HEADER = "X-Lifeboat-Signature"


class DeliveryFailed(Exception):
    """The delivery did not succeed; `temporary` says whether another try may help."""

    def __init__(self, message: str, *, temporary: bool):
        super().__init__(message)
        self.temporary = temporary


def new_secret() -> str:
    return "whsec_" + secrets.token_hex(24)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The header's value: t=<timestamp>,v1=<hex HMAC-SHA256 of b"<timestamp>." + body>."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def status_line(status: int) -> str:
    """`HTTP 404 Not Found`: the code and its standard phrase, never the server's own
    words (a reason phrase is text the far end chose)."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def _connection(destination: outbound.Destination, timeout: float):
    if destination.scheme == "https":
        conn = http.client.HTTPSConnection(
            destination.host,
            destination.port,
            timeout=timeout,
            context=ssl.create_default_context(),
        )
    else:
        conn = http.client.HTTPConnection(destination.host, destination.port, timeout=timeout)

    # http.client opens its socket with self._create_connection((host, port), ...) and
    # then (https) wraps it with server_hostname=host: only the address is replaced.
    def pinned(_address, timeout=None, source_address=None):
        return socket.create_connection(
            (destination.address, destination.port), timeout, source_address
        )

    conn._create_connection = pinned
    return conn


def post(url: str, body: bytes, secret: str, *, timeout: float) -> int:
    """POST `body` (JSON) to `url`, signed with `secret`. Returns the 2xx status; raises
    DeliveryFailed (temporary for 5xx, 429, timeouts and unreachable hosts; permanent
    for a refused address, a redirect or another 4xx)."""
    try:
        destination = outbound.check(url, what="The webhook URL")
    except outbound.OutboundRefused as exc:
        raise DeliveryFailed(str(exc), temporary=False) from None
    except outbound.OutboundUnresolvable as exc:
        raise DeliveryFailed(str(exc), temporary=True) from None
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "lifeboat-alerts",
        SIGNATURE_HEADER: signature(secret, int(time.time()), body),
    }
    conn = _connection(destination, timeout)
    try:
        conn.request("POST", destination.target, body=body, headers=headers)
        status = conn.getresponse().status
    except ssl.SSLError as exc:
        raise DeliveryFailed(f"TLS: {exc.reason or type(exc).__name__}", temporary=True) from None
    except (OSError, http.client.HTTPException) as exc:
        what = (
            "timed out"
            if isinstance(exc, TimeoutError)
            else getattr(exc, "strerror", None) or type(exc).__name__
        )
        raise DeliveryFailed(f"could not deliver: {what}", temporary=True) from None
    finally:
        conn.close()
    if 200 <= status < 300:
        return status
    if 300 <= status < 400:
        raise DeliveryFailed(
            f"{status_line(status)}: redirects are not followed; give the final URL",
            temporary=False,
        )
    raise DeliveryFailed(status_line(status), temporary=status >= 500 or status == 429)
