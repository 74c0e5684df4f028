"""Storage targets: create, change, delete (kept, disabled, while replicas are on it).

The endpoint goes through the deployment's outbound policy (webapp/domain/outbound.py,
through replication/storage_access.check_endpoint: a private, loopback or link-local
address is refused unless LIFEBOAT_OUTBOUND_ALLOW names it) and the credentials' name
must be granted to the project, here whoever asks, and again on every use. Credentials
are named by reference: no key is ever entered, stored or shown."""

from __future__ import annotations

from webapp.domain.actions.admin import (
    Caller,
    SettingConflict,
    SettingInvalid,
    apply,
    audit,
    changed,
    checked,
    disable_or_delete,
    require_admin,
    saved,
    update_row,
)
from webapp.domain.models import StorageTarget
from webapp.domain.replication import storage_access
from webapp.domain.replication.spelling import normal_endpoint, normal_prefix

# What a change may touch, in the settings form's order (the audit message's order).
FIELDS = (
    "name", "bucket", "prefix", "endpoint_url", "region", "credentials_ref", "gb_month_price",
    "enabled", "storage_class", "policy", "policy_metric", "policy_mode", "policy_every_n",
)  # fmt: skip
# Where a replica is: fixed once copies exist, or they could no longer be found.
FIXED_FIELDS = ("bucket", "prefix", "endpoint_url")


def _clean(caller: Caller, row: StorageTarget) -> None:
    row.name = (row.name or "").strip()
    row.credentials_ref = (row.credentials_ref or "").strip()
    # The spelling save() stores, so that a change is compared as it will be stored.
    row.prefix = normal_prefix(row.prefix)
    row.endpoint_url = normal_endpoint(row.endpoint_url)
    row.bucket = (row.bucket or "").strip()
    checked(row)
    try:
        storage_access.check_endpoint(row.endpoint_url, saving=True)
    except storage_access.TargetRefused as exc:
        raise SettingInvalid("endpoint_url", str(exc)) from None
    try:
        storage_access.check_credentials_ref(caller.project.slug, row.credentials_ref)
    except storage_access.TargetRefused as exc:
        raise SettingInvalid("credentials_ref", str(exc)) from None


def create_target(caller: Caller, **fields) -> StorageTarget:
    """A new target of the project from `fields` (FIELDS; the model's defaults for the
    rest)."""
    require_admin(caller)
    target = StorageTarget(project=caller.project)
    apply(target, fields, FIELDS)
    _clean(caller, target)
    saved(target, "A storage target")
    audit(
        caller,
        "storage_target.created",
        f"storage target {target.name!r} (s3://{target.bucket}/{target.prefix}) created",
        storage_target=target.pk,
    )
    return target


def update_target(caller: Caller, target: StorageTarget, **changes) -> list[str]:
    """Change what `changes` names; bucket, prefix and endpoint are fixed once replicas
    are stored there. Returns the fields that changed."""

    def cleaned(fresh: StorageTarget, before: dict) -> list[str]:
        _clean(caller, fresh)
        fields = changed(fresh, before)
        fixed = [name for name in fields if name in FIXED_FIELDS]
        if fixed and (replicas := fresh.replicas.count()):
            raise SettingConflict(fixed[0], f"fixed: {replicas} replicas are stored there")
        return fields

    return update_row(caller, target, changes, "storage target", FIELDS, cleaned)


def _replicas_on(target: StorageTarget) -> str:
    replicas = target.replicas.count()
    return f"{replicas} replicas on it" if replicas else ""


def delete_target(caller: Caller, target: StorageTarget) -> str:
    """Delete, or keep disabled while replicas are on it (they stay restorable);
    "deleted" or "disabled"."""
    where = f"s3://{target.bucket}/{target.prefix}"
    return disable_or_delete(caller, target, "storage target", where, _replicas_on)
