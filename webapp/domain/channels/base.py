"""What every alert channel kind is: a transport class that checks its target when an
admin saves the channel, renders what a flip becomes for its receiver, and sends it.

One class per kind, one module each (healthchecks' hc/integrations/<kind>/transport.py);
webapp/domain/channels/__init__.py maps each kind to its class. Finding what to alert
about (webapp/domain/health/alerts.py) knows nothing of them, and delivering
(webapp/domain/health/delivery.py) only looks a kind up in that table, so a new kind is
one module and its tests.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TemporaryError(Exception):
    """Worth another try later (a timeout, a 5xx, a refused connection)."""


class PermanentError(Exception):
    """Another try would fail the same way (a 4xx, a malformed address)."""


class TargetInvalid(ValueError):
    """The target does not fit the kind; the message is fit for a form error."""


class Transport:
    """One kind of channel. Class attributes describe the kind (for the form, the pages and
    the docs); an instance is bound to one channel and delivers to it."""

    kind: ClassVar[str]
    label: ClassVar[str]
    # What the target is, in the form's words.
    target_help: ClassVar[str]
    # Its deliveries carry Standard Webhooks headers signed with the channel's secret
    # (webapp/domain/channels/signing.py), so the settings page shows the secret.
    signed: ClassVar[bool] = False

    def __init__(self, channel) -> None:
        self.channel = channel

    @classmethod
    def clean_target(cls, target: str) -> str:
        """The target as it is stored, or TargetInvalid. Called when an admin saves the
        channel; whatever can change later (DNS, the deployment's allowances) is checked
        again by notify()."""
        raise NotImplementedError

    @classmethod
    def shown_target(cls, target: str) -> str:
        """What pages, audit messages and events may show of the target."""
        return target

    def render(self, flip) -> Any:
        """What this kind sends for `flip` (the body of a POST, a mail's subject and text)."""
        raise NotImplementedError

    def notify(self, flip, *, message_id: str) -> int | None:
        """Send `flip` once. `message_id` is the same for every try of one notification
        (a receiver drops a repeat by it). Returns the HTTP status, if any; raises
        TemporaryError or PermanentError."""
        raise NotImplementedError
