"""Alert channels: create, change, enable or disable, delete (kept, disabled, once it has
been notified: its deliveries stay readable).

A target is checked by its kind's transport (webapp/domain/channels: a URL against the
outbound policy, addresses as addresses) here, whoever asks; audit messages show it
masked (AlertChannel.shown_target), and the signing secret is never part of one."""

from __future__ import annotations

from webapp.domain import channels
from webapp.domain.actions.admin import (
    Caller,
    SettingInvalid,
    audit,
    changed,
    checked,
    disable_or_delete,
    own,
    require_admin,
    saved,
    update_row,
)
from webapp.domain.models.alerts import AlertChannel, AlertKind

# What a change may touch, in the settings form's order (the audit message's order).
FIELDS = ("name", "kind", "target", "kinds", "enabled")
# A URL or a list of addresses; far longer is no target anyone means.
TARGET_MAX = 2000


def _clean(row: AlertChannel) -> None:
    """The model's checks, then the kind's own check of the target (which may rewrite
    it: the stored spelling)."""
    if not isinstance(row.kinds, list) or not all(isinstance(k, str) for k in row.kinds):
        raise SettingInvalid("kinds", "give a list of alert kinds")
    unknown = sorted(set(row.kinds) - set(AlertKind.values))
    if unknown:
        raise SettingInvalid(
            "kinds",
            f"unknown alert kind {unknown[0]!r}; the kinds are {', '.join(AlertKind.values)}",
        )
    row.target = (row.target or "").strip()
    if len(row.target) > TARGET_MAX:
        raise SettingInvalid("target", f"at most {TARGET_MAX} characters")
    checked(row)
    transport = channels.KINDS.get(row.kind)
    if transport is None:  # full_clean's choices said so already; kept for a new kind
        raise SettingInvalid("kind", f"the kinds are {', '.join(channels.KINDS)}")
    try:
        row.target = transport.clean_target(row.target)
    except channels.TargetInvalid as exc:
        raise SettingInvalid("target", str(exc)) from None


def create_channel(
    caller: Caller, name: str, kind: str, target: str, kinds: list[str] | None = None
) -> AlertChannel:
    require_admin(caller)
    channel = AlertChannel(
        project=caller.project, name=(name or "").strip(), kind=kind, target=target,
        kinds=list(kinds or []),
    )  # fmt: skip
    _clean(channel)
    saved(channel, "An alert channel")
    shown = ", ".join(channel.kinds) or "every kind"
    audit(
        caller,
        "alert_channel.created",
        f"alert channel {channel.name!r} ({channel.kind} to {channel.shown_target}) "
        f"created for {shown}",
        alert_channel=channel.pk,
    )
    return channel


def update_channel(caller: Caller, channel: AlertChannel, **changes) -> list[str]:
    """Change what `changes` names (FIELDS); returns the fields that changed."""

    def cleaned(fresh: AlertChannel, before: dict) -> list[str]:
        if "name" in changes:
            fresh.name = (fresh.name or "").strip()
        if "kinds" in changes:
            fresh.kinds = list(fresh.kinds or [])
        _clean(fresh)
        return changed(fresh, before)

    return update_row(caller, channel, changes, "alert channel", FIELDS, cleaned)


def set_channel_enabled(caller: Caller, channel: AlertChannel, enabled: bool) -> bool:
    """Enable or disable; False when it already was (no audit line)."""
    require_admin(caller)
    own(caller, channel)
    if (
        not AlertChannel.objects.filter(pk=channel.pk)
        .exclude(enabled=enabled)
        .update(enabled=enabled)
    ):
        return False
    channel.enabled = enabled
    verb = "enabled" if enabled else "disabled"
    audit(
        caller, f"alert_channel.{verb}", f"alert channel {channel.name!r} {verb}",
        alert_channel=channel.pk,
    )  # fmt: skip
    return True


def history(channel: AlertChannel) -> str:
    """What refers to the channel, in words; empty when nothing does."""
    sent = channel.notifications.count()
    return f"{sent} notifications" if sent else ""


def delete_channel(caller: Caller, channel: AlertChannel) -> str:
    """Delete, or keep disabled when it has been notified; "deleted" or "disabled"."""
    shown = f"{channel.kind} to {channel.shown_target}"
    return disable_or_delete(caller, channel, "alert channel", shown, history)
