"""Alert channels: one transport class per kind, one module each, and the table that maps
a channel's `kind` to its class.

Adding a kind (CONTRIBUTING.md, "Adding an alert channel") is a module here with a
Transport subclass, one entry in KINDS and its tests. The model's choices read this
table (AlertChannel.kind, choices=choices), so no migration is needed; delivery
(webapp/domain/health/delivery.py) and the settings form look the kind up here.
"""

from __future__ import annotations

from webapp.domain.channels.base import PermanentError, TargetInvalid, TemporaryError, Transport
from webapp.domain.channels.json_webhook import JsonWebhook
from webapp.domain.channels.mail import Email
from webapp.domain.channels.slack import Slack
from webapp.domain.channels.webhook import Webhook

# The first is the form's default.
KINDS: dict[str, type[Transport]] = {
    transport.kind: transport for transport in (Webhook, Slack, JsonWebhook, Email)
}


def choices() -> list[tuple[str, str]]:
    """The model's and the form's choices: (kind, label) in KINDS' order."""
    return [(kind, transport.label) for kind, transport in KINDS.items()]


def transport_class(kind: str) -> type[Transport]:
    """The class of `kind`; PermanentError for a kind this version does not have (a row
    saved by a newer version, a module removed)."""
    try:
        return KINDS[kind]
    except KeyError:
        raise PermanentError(f"this server has no alert channel kind {kind!r}") from None


def transport(channel) -> Transport:
    """The transport bound to `channel`."""
    return transport_class(channel.kind)(channel)


__all__ = [
    "KINDS",
    "PermanentError",
    "TargetInvalid",
    "TemporaryError",
    "Transport",
    "choices",
    "transport",
    "transport_class",
]
