"""Moved: signing is webapp/domain/channels/signing.py, the POST to a checked address
webapp/domain/channels/http_post.py. Kept for one name: migration 0009 (which gave every
channel its secret) refers to webapp.domain.health.webhook_delivery.new_secret, and a
migration must go on importing what it named."""

from __future__ import annotations

from webapp.domain.channels.signing import new_secret

__all__ = ["new_secret"]
