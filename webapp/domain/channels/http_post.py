"""Kinds that POST JSON to a URL (webhook, json, slack): the URL checked against the
deployment's outbound policy, one POST to the checked address (docs/alerts.md, "Where a
webhook may point").

* The URL is checked by webapp.domain.outbound when the channel is saved and again at
  every delivery (the deployment's allowances may have changed), and the connection goes
  to the very address that was checked, with the URL's host in the Host header and as the
  TLS server name: a DNS answer that changes after the check cannot redirect it.
* Redirects are not followed: a 3xx is a failure that names its status.
* Only the status line is kept: the answer's body is never read into an attempt, an
  error or a page (an internal service's answer is not shown to whoever set the URL).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from http import HTTPStatus

from django.conf import settings

from webapp.domain import outbound
from webapp.domain.channels import message, signing
from webapp.domain.channels.base import PermanentError, TargetInvalid, TemporaryError, Transport


def status_line(status: int) -> str:
    """`HTTP 404 Not Found`: the code and its standard phrase, never the server's own
    words (a reason phrase is text the far end chose)."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def connection(destination: outbound.Destination, timeout: float):
    """An HTTP(S) connection to `destination.address`, naming `destination.host`."""
    conn: http.client.HTTPConnection
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

    # A private hook of http.client (not in its stubs), replaced on purpose (above).
    conn._create_connection = pinned  # type: ignore[attr-defined]
    return conn


def post(url: str, body: bytes, headers: dict[str, str], *, timeout: float) -> int:
    """POST `body` (JSON) to `url`. Returns the 2xx status; raises TemporaryError (5xx,
    429, timeouts, unreachable or unresolvable hosts) or PermanentError (a refused
    address, a redirect, another 4xx)."""
    try:
        destination = outbound.check(url, what="The webhook URL")
    except outbound.OutboundRefused as exc:
        raise PermanentError(str(exc)) from None
    except outbound.OutboundUnresolvable as exc:
        raise TemporaryError(str(exc)) from None
    headers = {"Content-Type": "application/json", "User-Agent": "lifeboat-alerts", **headers}
    conn = connection(destination, timeout)
    try:
        conn.request("POST", destination.target, body=body, headers=headers)
        status = conn.getresponse().status
    except ssl.SSLError as exc:
        raise TemporaryError(f"TLS: {exc.reason or type(exc).__name__}") from None
    except (OSError, http.client.HTTPException) as exc:
        what = (
            "timed out"
            if isinstance(exc, TimeoutError)
            else getattr(exc, "strerror", None) or type(exc).__name__
        )
        raise TemporaryError(f"could not deliver: {what}") from None
    finally:
        conn.close()
    if 200 <= status < 300:
        return status
    if 300 <= status < 400:
        raise PermanentError(
            f"{status_line(status)}: redirects are not followed; give the final URL"
        )
    if status >= 500 or status == 429:
        raise TemporaryError(status_line(status))
    raise PermanentError(status_line(status))


class JsonPost(Transport):
    """A kind whose target is an http(s) URL and whose delivery is one JSON POST; a
    subclass says what the JSON is (body())."""

    target_help = "an http(s) URL"

    @classmethod
    def clean_target(cls, target: str) -> str:
        # Not Django's URLValidator: it refuses single-label hosts, and a self-hosted
        # chat server is often one (http://mattermost:8065/hooks/...).
        # A host DNS cannot resolve now is accepted: every delivery checks again.
        target = (target or "").strip()
        try:
            outbound.check(target, what="The webhook URL")
        except outbound.OutboundRefused as exc:
            raise TargetInvalid(str(exc)) from None
        except outbound.OutboundUnresolvable:
            pass
        return target

    @classmethod
    def shown_target(cls, target: str) -> str:
        # scheme://host/…: a URL's path often is its secret (a Slack hook's token).
        return outbound.masked(target)

    def body(self, flip) -> dict:
        raise NotImplementedError

    def render(self, flip) -> bytes:
        return json.dumps(self.body(flip)).encode()

    def notify(self, flip, *, message_id: str) -> int | None:
        body = self.render(flip)
        headers = {}
        if self.signed:
            try:
                headers = signing.headers(self.channel.secret, message_id, int(time.time()), body)
            except ValueError as exc:
                raise PermanentError(str(exc)) from None
        return post(self.channel.target, body, headers, timeout=settings.ALERT_TIMEOUT_S)


def summary(flip, *, escape=lambda text: text) -> str:
    """One line in Slack's mrkdwn: icon, [project], the message, and its links."""
    icon = message.SEVERITY_ICON.get(flip.kind, "")
    link = f"<{message.url(flip)}|Open in Lifeboat>"
    text = f"{icon} [{flip.project.slug}] {escape(flip.message)} {link}"
    resume = message.resume_url(flip)
    if resume:
        text += f" · <{resume}|{message.RESUME_LABEL}>"
    return text
