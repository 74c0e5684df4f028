"""API tokens: issue (the secret is returned once, never stored) and revoke."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from django.db import IntegrityError, transaction

from webapp.domain.actions.admin import (
    Caller,
    SettingConflict,
    SettingInvalid,
    audit,
    own,
    require_admin,
)
from webapp.domain.models import ApiToken
from webapp.domain.models.projects import Scope

# The name is a CharField: it has a max_length.
NAME_MAX = cast(int, ApiToken._meta.get_field("name").max_length)


@dataclass(frozen=True)
class Issued:
    """A new token and its secret: the only time the secret exists outside the caller's
    hands (only its SHA-256 is stored)."""

    token: ApiToken
    secret: str


def create_token(caller: Caller, name: str, scopes: list[str]) -> Issued:
    require_admin(caller)
    name = (name or "").strip()
    if not name or len(name) > NAME_MAX or "\0" in name:
        raise SettingInvalid("name", f"give 1 to {NAME_MAX} characters, without NUL")
    unknown = sorted(set(scopes) - set(Scope.values))
    if unknown or not scopes:
        raise SettingInvalid("scopes", f"choose one or more of {', '.join(Scope.values)}")
    user = caller.user if getattr(caller.user, "pk", None) else None
    try:
        with transaction.atomic():
            token, secret = caller.project.issue_token(name, scopes, created_by=user)
    except IntegrityError:
        # The unique constraint decides, not a lookup that a second request would race.
        raise SettingConflict(
            "name", "A token in use already has this name: choose another or revoke it."
        ) from None
    audit(
        caller,
        "token.created",
        f"token {token.name!r} ({token.prefix}…) created with {', '.join(token.scopes)}",
        token=token.pk,
    )
    return Issued(token, secret)


def revoke_token(caller: Caller, token: ApiToken) -> bool:
    """Revoke; False when it already was (no second audit line). A token cannot revoke
    itself: the request that does it would lose the project's API on the spot."""
    require_admin(caller)
    own(caller, token)
    if caller.token_id == token.pk:
        raise SettingConflict(
            None, "a token cannot revoke itself: revoke it with another token or on the page"
        )
    if not token.revoke():
        return False
    audit(
        caller, "token.revoked", f"token {token.name!r} ({token.prefix}…) revoked", token=token.pk
    )
    return True
