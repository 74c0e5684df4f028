"""`slack`: a Slack incoming webhook's own message, `text` (the notification and the
fallback) and Block Kit `blocks` (the message, the project and kind, the links). Slack's
incoming webhooks check nothing but their URL, whose path is the secret, so it is not
signed."""

from __future__ import annotations

from webapp.domain.channels import message
from webapp.domain.channels.http_post import JsonPost, summary

# A section block's text holds at most 3,000 characters (Slack's Block Kit reference).
SECTION_LIMIT = 3000


def escape(text: str) -> str:
    """Slack's mrkdwn escapes: without them a message holding `<!channel>` or `<url|x>`
    (a run key, an error a job wrote) would ping a channel or forge a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Slack(JsonPost):
    kind = "slack"
    label = "Slack (incoming webhook)"
    target_help = "a Slack incoming webhook's URL (https://hooks.slack.com/services/…)"

    def body(self, flip) -> dict:
        icon = message.SEVERITY_ICON.get(flip.kind, "")
        links = [f"<{message.url(flip)}|Open in Lifeboat>"]
        resume = message.resume_url(flip)
        if resume:
            links.append(f"<{resume}|{message.RESUME_LABEL}>")
        text = f"{icon} {escape(flip.message)}".strip()
        if len(text) > SECTION_LIMIT:
            text = text[: SECTION_LIMIT - 1] + "…"
        context = f"*{escape(flip.project.slug)}* · `{flip.kind}`"
        if flip.run_id:
            context += f" · run `{escape(flip.run.key)}`"
        return {
            "text": summary(flip, escape=escape),
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": text}},
                {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
                {"type": "section", "text": {"type": "mrkdwn", "text": " · ".join(links)}},
            ],
        }
