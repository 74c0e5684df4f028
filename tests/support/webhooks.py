"""A real webhook receiver (`Receiver`, the `receivers` fixture) and the Standard Webhooks
signature check a receiver makes. Loaded by tests/conftest.py (pytest_plugins)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

BODY_SECRET = "ami-id-SECRET-FROM-THE-ANSWER"


def standard_webhooks_ok(secret: str, headers: dict, body: bytes, tolerance_s: int = 300) -> bool:
    """What a receiver does without a library (docs/alerts.md), written from the Standard
    Webhooks spec and nothing of Lifeboat's: the key is the base64 after `whsec_`; the
    signed content is `<webhook-id>.<webhook-timestamp>.<body>`; any of the
    space-separated `v1,<base64>` signatures may match; the timestamp must be recent."""
    headers = {k.lower(): v for k, v in headers.items()}
    msg_id, timestamp = headers.get("webhook-id"), headers.get("webhook-timestamp", "")
    if not (msg_id and timestamp.isdigit() and secret.startswith("whsec_")):
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    fresh = abs(time.time() - int(timestamp)) <= tolerance_s
    given = [s.split(",", 1) for s in headers.get("webhook-signature", "").split()]
    return fresh and any(
        version == "v1" and hmac.compare_digest(expected, sig) for version, sig in given
    )


class Receiver:
    """A real HTTP server on 127.0.0.1 that checks each request's Standard Webhooks
    signature with the channel's secret the way docs/alerts.md tells a receiver to, and
    answers with `status` (changeable between requests, and a body that must never reach
    Lifeboat's records)."""

    def __init__(self, status: int = 200, location: str | None = None):
        self.requests: list[dict] = []
        self.secret = ""
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = dict(self.headers.items())
                outer.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "host": self.headers.get("Host"),
                        "body": body,
                        "headers": headers,
                        "signature_ok": outer.signature_ok(headers, body),
                    }
                )
                self.send_response(outer.status)
                if location:
                    self.send_header("Location", location)
                self.end_headers()
                self.wfile.write(BODY_SECRET.encode())

            do_POST = _answer  # noqa: N815 (http.server's names)
            do_GET = _answer  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/T0/B0/PATH-TOKEN?token=QUERY-TOKEN"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def signature_ok(self, headers: dict, body: bytes) -> bool:
        return bool(self.secret) and standard_webhooks_ok(self.secret, headers, body)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers():
    made = []

    def make(**kwargs) -> Receiver:
        made.append(Receiver(**kwargs))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


REFUSED = [
    ("http://127.0.0.1:9/hook", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://10.1.2.3/hook", "private"),
    ("http://[::1]:9/hook", "loopback"),
    ("http://localhost:9/hook", "loopback"),  # a name that resolves to loopback
    ("http://[::ffff:169.254.169.254]/latest/meta-data/", "link-local"),
]
