"""The project's own settings: recovery (the storage quota, automatic resume, quarantine
and restart-loop limits, the GPU-hour price, the restore tests' deeper levels) and the
badge key.

Each recovery field that changes is one audit Event with the old and the new value,
whoever asks (the Recovery settings tab, PATCH /api/v1/settings/recovery)."""

from __future__ import annotations

import json
import math
import re

from django.db import transaction

from webapp.domain.actions.admin import Caller, SettingInvalid, audit, require_admin
from webapp.domain.confined_files import Refused, relative_parts
from webapp.domain.ingest.event_schema import INT64_MAX
from webapp.domain.locks import for_update
from webapp.domain.models import LaunchProfile, Project
from webapp.domain.recovery.reshard import MAX_WORLD_SIZE

# In the Recovery tab's order (the audit lines' order).
RECOVERY_FIELDS = (
    "storage_quota_bytes", "auto_resume_profile", "max_restarts", "quarantine_after",
    "loop_after", "gpu_hour_price", "restore_checks",
)  # fmt: skip
RESTORE_CHECK_KEYS = (
    *("forward", "replay", "replay_steps", "replay_rtol", "replay_metric", "file"),
    "reshard",
)
GPU_HOUR_PRICE_MAX = 10_000
LIMITS = {"max_restarts": (0, 100), "quarantine_after": (1, 100), "loop_after": (1, 100)}


def check_restore_checks(value: object) -> dict:
    """The project's restore_checks: an object with only the known keys, each of the
    right type (docs/restore.md, "Deeper levels"); SettingInvalid otherwise."""

    def refuse(message: str):
        return SettingInvalid("restore_checks", message)

    if not isinstance(value, dict):
        raise refuse('It must be a JSON object, like {"forward": "pkg.mod:fn"}.')
    unknown = sorted(set(value) - set(RESTORE_CHECK_KEYS))
    if unknown:
        raise refuse(f"Unknown key {unknown[0]!r}; the keys are {', '.join(RESTORE_CHECK_KEYS)}.")
    for key in ("forward", "replay"):
        if key in value and not (
            isinstance(value[key], str) and re.fullmatch(r"[\w.]+:\w+", value[key])
        ):
            raise refuse(f'{key} must name a function as "package.module:function".')
    for key in ("replay_metric", "file"):
        if key in value and not (isinstance(value[key], str) and value[key]):
            raise refuse(f"{key} must be a non-empty string.")
    if "file" in value:
        try:
            relative_parts(value["file"], "file")
        except Refused as exc:
            raise refuse(f"{exc}: it names one of the checkpoint's files.") from None
    reshard = value.get("reshard")
    if reshard is not None and not (
        isinstance(reshard, list)
        and 1 <= len(reshard) <= 4
        and all(type(m) is int and 1 <= m <= MAX_WORLD_SIZE for m in reshard)
    ):
        raise refuse(
            f"reshard must list one to four world sizes from 1 to {MAX_WORLD_SIZE}, like [2, 4]."
        )
    steps = value.get("replay_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise refuse("replay_steps must be a whole number of at least 1.")
    rtol = value.get("replay_rtol")
    if rtol is not None and (
        isinstance(rtol, bool) or not isinstance(rtol, int | float) or not 0 <= rtol < 1
    ):
        raise refuse("replay_rtol must be a number from 0 to 1, like 1e-4.")
    return value


def _whole(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SettingInvalid(name, f"a whole number from {low} to {high}")
    return value


def _checked(project: Project, changes: dict) -> dict:
    """`changes` checked; auto_resume_profile as a LaunchProfile of the project (or None)."""
    unknown = sorted(set(changes) - set(RECOVERY_FIELDS))
    if unknown:
        raise SettingInvalid(unknown[0], "cannot be changed")
    new = dict(changes)
    if (quota := new.get("storage_quota_bytes")) is not None:
        _whole("storage_quota_bytes", quota, 0, INT64_MAX)
    if "auto_resume_profile" in new and new["auto_resume_profile"] is not None:
        name = new["auto_resume_profile"]
        profile = LaunchProfile.objects.filter(project=project, name=name).first()
        if profile is None:
            raise SettingInvalid(
                "auto_resume_profile", f"no launch profile {name!r} in this project"
            )
        new["auto_resume_profile"] = profile
    for name, (low, high) in LIMITS.items():
        if name in new:
            _whole(name, new[name], low, high)
    price = new.get("gpu_hour_price")
    if price is not None and (
        isinstance(price, bool)
        or not isinstance(price, int | float)
        or not math.isfinite(price)
        or not 0 <= price <= GPU_HOUR_PRICE_MAX
    ):
        raise SettingInvalid("gpu_hour_price", f"a number from 0 to {GPU_HOUR_PRICE_MAX}")
    if price is not None:
        new["gpu_hour_price"] = float(price)
    if "restore_checks" in new:
        new["restore_checks"] = check_restore_checks(new["restore_checks"] or {})
    return new


def _shown(value) -> str:
    if value is None or value == {}:
        return "none"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _audited(value):
    """What the audit line stores of a value: a profile by its name."""
    return value.name if isinstance(value, LaunchProfile) else value


def update_recovery(caller: Caller, **changes) -> list[str]:
    """Change the recovery fields given (RECOVERY_FIELDS; auto_resume_profile by a
    profile's name, None for off); returns those that changed, each audited."""
    require_admin(caller)
    new = _checked(caller.project, changes)
    with transaction.atomic():
        project = for_update(Project.objects.select_related("auto_resume_profile")).get(
            pk=caller.project.pk
        )
        changed = []
        for name in RECOVERY_FIELDS:
            if name not in new:
                continue
            old, value = getattr(project, name), new[name]
            if _audited(old) == _audited(value):
                continue
            setattr(project, name, value)
            changed.append((name, _audited(old), _audited(value)))
        if changed:
            project.save(update_fields=[name for name, _, _ in changed])
        for name, old, value in changed:
            audit(
                caller,
                f"project.{name}_changed",
                f"{name.replace('_', ' ')}: {_shown(old)} → {_shown(value)}",
                setting=name,
                old=old,
                new=value,
            )
    for name, _, _ in changed:
        setattr(caller.project, name, getattr(project, name))
    return [name for name, _, _ in changed]


def regenerate_badge_key(caller: Caller) -> str:
    """A new badge key: every badge URL given out so far answers 404."""
    require_admin(caller)
    key = caller.project.regenerate_badge_key()
    audit(caller, "badges.key_regenerated", "Badge URLs regenerated; the old ones answer 404.")
    return key
