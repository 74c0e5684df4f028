"""A project's members: add a person by user name, change a role, remove someone.

The last admin cannot be removed or demoted (Membership refuses it, so the Django admin
is held to the same rule). The answer to an unknown name tells whether such a user
exists (docs/security.md, known limits): every miss is audited, so a project admin (or
an admin token) probing names is seen doing it."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from webapp.domain.actions.admin import (
    Caller,
    SettingConflict,
    SettingInvalid,
    audit,
    own,
    require_admin,
)
from webapp.domain.models import Membership
from webapp.domain.models.projects import LastAdmin, Role

USERNAME_MAX = 150


def _role(role: str) -> str:
    if role not in Role.values:
        raise SettingInvalid(
            "role", f"Unknown role {role!r}; the roles are {', '.join(Role.values)}."
        )
    return role


def add_member(caller: Caller, username: str, role: str) -> Membership:
    require_admin(caller)
    _role(role)
    name = str(username or "").strip()
    if not name or len(name) > USERNAME_MAX or "\0" in name:
        raise SettingInvalid("username", f"give 1 to {USERNAME_MAX} characters, without NUL")
    user = get_user_model().objects.filter(username=name, is_active=True).first()
    if user is None:
        audit(caller, "member.lookup_failed", f"no active user {name!r} to add")
        raise SettingInvalid(
            "username",
            f"No active user is called {name!r}: accounts are created by the "
            "deployment's administrator (Django admin, /admin/).",
        )
    try:
        with transaction.atomic():
            membership = Membership.objects.create(project=caller.project, user=user, role=role)
    except IntegrityError:
        raise SettingConflict(
            "username", f"{user} is already a member; change the role above."
        ) from None
    audit(caller, "member.added", f"{user} added as {role}", user=user.pk)
    return membership


def change_role(caller: Caller, membership: Membership, role: str) -> bool:
    """Give the member `role`; False when they had it. SettingConflict for the last admin."""
    require_admin(caller)
    own(caller, membership)
    _role(role)
    old = membership.role
    if role == old:
        return False
    membership.role = role
    try:
        membership.save(update_fields=["role"])
    except LastAdmin as exc:
        membership.role = old
        raise SettingConflict("role", exc.messages[0]) from None
    audit(
        caller,
        "member.role_changed",
        f"{membership.user}: {old} → {role}",
        user=membership.user_id,
        old=old,
        new=role,
    )
    return True


def remove_member(caller: Caller, membership: Membership) -> None:
    """SettingConflict for the last admin."""
    require_admin(caller)
    own(caller, membership)
    try:
        membership.delete()
    except LastAdmin as exc:
        raise SettingConflict(None, exc.messages[0]) from None
    audit(
        caller,
        "member.removed",
        f"{membership.user} ({membership.role}) removed",
        user=membership.user_id,
    )
