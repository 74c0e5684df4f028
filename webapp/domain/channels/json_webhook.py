"""`json`: a signed POST of the flip alone, in the payload shape Standard Webhooks
recommends (`type`, `timestamp`, `data`), for a receiver of one's own that wants no chat
text in the way."""

from __future__ import annotations

from webapp.domain.channels import message
from webapp.domain.channels.http_post import JsonPost


class JsonWebhook(JsonPost):
    kind = "json"
    label = "JSON (Standard Webhooks event)"
    target_help = "your receiver's http(s) URL"
    signed = True

    def body(self, flip) -> dict:
        data = message.facts(flip)
        return {"type": data.pop("kind"), "timestamp": data.pop("time"), "data": data}
