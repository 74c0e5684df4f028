"""Where the project's work goes, through the API (scope admin): storage targets, launch
profiles and alert channels. List, create (201), change (PATCH: only the fields sent),
delete.

Nothing secret is answered: a storage target names its credentials (a name granted by
the deployment, never a key); a launch profile's extra variables are listed by name, not
value; an alert channel's target is shown masked (scheme://host/…, its path is often the
secret) and its signing secret not at all. What history refers to is kept: a storage
target with replicas or a channel that has been notified is disabled instead of deleted
("outcome": "disabled"); a launch profile that resumes used is 409."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Router, Schema, Status
from pydantic import Field

from webapp.api.auth import admin_auth
from webapp.api.errors import ErrorOut
from webapp.api.params import Name
from webapp.api.settings_common import ChangeIn, SettingId, Text, carry_out, in_project, sent
from webapp.domain import actions, channels
from webapp.domain.models import LaunchProfile, StorageTarget
from webapp.domain.models.alerts import AlertChannel, AlertKind
from webapp.domain.models.projects import LaunchKind, ReplicationPolicy

router = Router(tags=["settings"])


class DeletedOut(Schema):
    id: int
    # "deleted", or "disabled": kept because history refers to it.
    outcome: Literal["deleted", "disabled"]


# --- Storage targets -----------------------------------------------------------------------


class TargetOut(Schema):
    id: int
    name: str
    bucket: str
    prefix: str
    endpoint_url: str
    region: str
    storage_class: str
    credentials_ref: str
    gb_month_price: float | None
    enabled: bool
    policy: str
    policy_metric: str
    policy_mode: str
    policy_every_n: int
    created_at: datetime


class TargetChangeIn(ChangeIn):
    """Every field of a storage target; a change sends only those it changes."""

    name: Name = None
    bucket: Text(255, 1) = None
    prefix: Text(500) = None
    # http(s) on an address the deployment's outbound policy allows; "" for its own store.
    endpoint_url: Text(200) = None
    region: Text(50, 1) = None
    storage_class: Text(50) = None
    credentials_ref: Text(100) = None
    gb_month_price: float | None = Field(None, ge=0, le=1000, allow_inf_nan=False)
    enabled: bool = None
    policy: Literal[tuple(ReplicationPolicy.values)] = None
    policy_metric: Text(100) = None
    policy_mode: Literal["min", "max"] = None
    policy_every_n: int = Field(None, ge=1, le=2**31 - 1)


class TargetIn(TargetChangeIn):
    name: Name
    bucket: Text(255, 1)


@router.get("/settings/storage-targets", auth=admin_auth, response={200: list[TargetOut]})
def list_targets(request):
    return list(request.auth.project.storage_targets.order_by("name"))


@router.post("/settings/storage-targets", auth=admin_auth, response={201: TargetOut, 409: ErrorOut})
def create_target(request, body: TargetIn):
    """Add a storage target. The endpoint must be one the deployment's outbound policy
    allows (no private, loopback or link-local address unless LIFEBOAT_OUTBOUND_ALLOW
    names it), the credentials a name granted to the project (S3_CREDENTIALS_REFS)."""
    return Status(201, carry_out(request, lambda c: actions.create_target(c, **sent(body))))


@router.patch(
    "/settings/storage-targets/{target_id}",
    auth=admin_auth,
    response={200: TargetOut, 409: ErrorOut},
)
def update_target(request, target_id: SettingId, body: TargetChangeIn):
    """Change the fields sent. Bucket, prefix and endpoint are fixed once replicas are
    stored there (409)."""
    target = in_project(request, StorageTarget, target_id, "storage target")
    carry_out(request, lambda c: actions.update_target(c, target, **sent(body)))
    return target


@router.delete("/settings/storage-targets/{target_id}", auth=admin_auth, response={200: DeletedOut})
def delete_target(request, target_id: SettingId):
    """Delete a storage target, or, while replicas are on it, disable it: they stay
    restorable, nothing new is copied there."""
    target = in_project(request, StorageTarget, target_id, "storage target")
    pk = target.pk
    return {"id": pk, "outcome": carry_out(request, lambda c: actions.delete_target(c, target))}


# --- Launch profiles -----------------------------------------------------------------------


class ProfileOut(Schema):
    id: int
    name: str
    kind: str
    host: str
    command_template: str
    workdir: str
    # The names of the job's extra variables; their values may be secrets.
    env_names: list[str]
    created_at: datetime


def _profile(profile: LaunchProfile) -> dict:
    options = profile.options or {}
    return {
        "id": profile.pk, "name": profile.name, "kind": profile.kind, "host": profile.host,
        "command_template": profile.command_template, "workdir": options.get("workdir", ""),
        "env_names": sorted(options.get("env") or {}), "created_at": profile.created_at,
    }  # fmt: skip


EnvName = Text(100, 1)


class ProfileChangeIn(ChangeIn):
    name: Name = None
    kind: Literal[tuple(LaunchKind.values)] = None
    host: Text(255) = None
    # {{placeholders}} become references to $LIFEBOAT_* variables (docs/slurm.md); a
    # placeholder where no reference is safe is refused (400).
    command_template: Text(10_000, 1) = None
    workdir: Text(1000) = None
    # Replaces every extra variable of the job; {} removes them. A name that changes how
    # programs load (LD_PRELOAD, PYTHONPATH, PATH, ...) is refused.
    env: dict[EnvName, Text(10_000)] = Field(None, max_length=100)


class ProfileIn(ProfileChangeIn):
    name: Name
    command_template: Text(10_000, 1)


@router.get("/settings/launch-profiles", auth=admin_auth, response={200: list[ProfileOut]})
def list_profiles(request):
    return [_profile(p) for p in request.auth.project.launch_profiles.order_by("name")]


@router.post(
    "/settings/launch-profiles", auth=admin_auth, response={201: ProfileOut, 409: ErrorOut}
)
def create_profile(request, body: ProfileIn):
    """Add a launch profile: how a resumed job is started (a local process or sbatch)."""
    fields = sent(body)
    profile = carry_out(request, lambda c: actions.create_profile(c, **fields))
    return Status(201, _profile(profile))


@router.patch(
    "/settings/launch-profiles/{profile_id}",
    auth=admin_auth,
    response={200: ProfileOut, 409: ErrorOut},
)
def update_profile(request, profile_id: SettingId, body: ProfileChangeIn):
    profile = in_project(request, LaunchProfile, profile_id, "launch profile")
    fields = sent(body)
    carry_out(request, lambda c: actions.update_profile(c, profile, **fields))
    return _profile(profile)


@router.delete(
    "/settings/launch-profiles/{profile_id}",
    auth=admin_auth,
    response={200: DeletedOut, 409: ErrorOut},
)
def delete_profile(request, profile_id: SettingId):
    """Delete a launch profile; 409 while resumes or automatic resume name it."""
    profile = in_project(
        request, LaunchProfile.objects.select_related("project"), profile_id, "launch profile"
    )
    pk = profile.pk
    carry_out(request, lambda c: actions.delete_profile(c, profile))
    return {"id": pk, "outcome": "deleted"}


# --- Alert channels ------------------------------------------------------------------------


class ChannelOut(Schema):
    id: int
    name: str
    kind: str
    # Masked: scheme://host/… for a URL (its path is often the secret).
    target: str
    kinds: list[str]
    enabled: bool
    signed: bool
    created_at: datetime


def _channel(channel: AlertChannel) -> dict:
    return {
        "id": channel.pk, "name": channel.name, "kind": channel.kind,
        "target": channel.shown_target, "kinds": channel.kinds, "enabled": channel.enabled,
        "signed": channel.signed, "created_at": channel.created_at,
    }  # fmt: skip


class ChannelChangeIn(ChangeIn):
    name: Name = None
    kind: Literal[tuple(channels.KINDS)] = None
    # What the kind sends to: a URL for webhook, json and slack (checked against the
    # outbound policy), addresses for email.
    target: Text(2000, 1) = None
    # The alert kinds it wants; [] for every kind.
    kinds: list[Literal[tuple(AlertKind.values)]] = Field(None, max_length=len(AlertKind.values))
    enabled: bool = None


class ChannelIn(ChannelChangeIn):
    name: Name
    kind: Literal[tuple(channels.KINDS)]
    target: Text(2000, 1)


@router.get("/settings/alert-channels", auth=admin_auth, response={200: list[ChannelOut]})
def list_channels(request):
    return [_channel(c) for c in request.auth.project.alert_channels.order_by("name")]


@router.post("/settings/alert-channels", auth=admin_auth, response={201: ChannelOut, 409: ErrorOut})
def create_channel(request, body: ChannelIn):
    """Add an alert channel; its target is checked by its kind (a URL against the
    deployment's outbound policy). Enabled from the start."""
    fields = sent(body)
    enabled = fields.pop("enabled", True)
    channel = carry_out(request, lambda c: actions.create_channel(c, **fields))
    if not enabled:
        carry_out(request, lambda c: actions.set_channel_enabled(c, channel, False))
    return Status(201, _channel(channel))


@router.patch(
    "/settings/alert-channels/{channel_id}",
    auth=admin_auth,
    response={200: ChannelOut, 409: ErrorOut},
)
def update_channel(request, channel_id: SettingId, body: ChannelChangeIn):
    channel = in_project(request, AlertChannel, channel_id, "alert channel")
    carry_out(request, lambda c: actions.update_channel(c, channel, **sent(body)))
    return _channel(channel)


@router.delete("/settings/alert-channels/{channel_id}", auth=admin_auth, response={200: DeletedOut})
def delete_channel(request, channel_id: SettingId):
    """Delete an alert channel, or, once it has been notified, disable it (its
    deliveries stay in the record)."""
    channel = in_project(request, AlertChannel, channel_id, "alert channel")
    pk = channel.pk
    return {"id": pk, "outcome": carry_out(request, lambda c: actions.delete_channel(c, channel))}
