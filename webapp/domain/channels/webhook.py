"""`webhook`: a signed POST whose `text` Slack, Mattermost and Discord's /slack endpoint
show, and whose `lifeboat` object carries the details for anything else. The kind every
channel had before there were others: its body stays as it was."""

from __future__ import annotations

from webapp.domain.channels import message
from webapp.domain.channels.http_post import JsonPost, summary


class Webhook(JsonPost):
    kind = "webhook"
    label = "Webhook (JSON, Slack-compatible)"
    target_help = "a webhook's http(s) URL (Slack, Mattermost, or your own)"
    signed = True

    def body(self, flip) -> dict:
        return {"text": summary(flip), "lifeboat": message.facts(flip)}
