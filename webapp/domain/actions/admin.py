"""What every settings action shares: who asks (a Caller), the admin check, the one audit
path, and the refusals.

A settings change (tokens, storage targets, launch profiles, alert channels, members) is a
function in this package, called by the dashboard's settings pages and by the API's
/settings/ routes alike. Each takes a Caller, checks there that it is a project admin
(a member with role admin, or a token with the `admin` scope), validates every value as
hostile, saves, and writes its audit Event through audit() below, so both audiences
leave the same row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from webapp.domain.models import Event, Project
from webapp.domain.models.projects import Role, Scope


class NotAllowed(Exception):
    """The caller is not an admin of the project (the API answers 403, a page 403)."""


class SettingInvalid(Exception):
    """A value is refused: `field` names it (None: the request as a whole), `message`
    says why in words fit for a form error and an API answer (400)."""

    def __init__(self, field: str | None, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


class SettingConflict(SettingInvalid):
    """The value is fine but the project's state refuses it: a name in use, the last
    admin, a profile that history names (the API answers 409)."""


class NotInProject(LookupError):
    """The row is not the caller's project's (the callers look rows up in their own
    project first, so this only guards against a caller that did not)."""


@dataclass(frozen=True)
class Caller:
    """Who asks for a settings change: the project, the audit log's name for them
    (user:<name> or token:<name>), whether they are its admin, and the person, if any
    (a token's creator)."""

    project: Project
    actor: str
    is_admin: bool
    user: object | None = None
    token_id: int | None = None

    @classmethod
    def of_user(cls, project: Project, user) -> Caller:
        """A signed-in person; their role is read here, not taken from the caller."""
        return cls(
            project=project,
            actor=f"user:{user.get_username()}",
            is_admin=project.role_of(user) == Role.ADMIN,
            user=user,
        )

    @classmethod
    def of_token(cls, token) -> Caller:
        return cls(
            project=token.project,
            actor=token.actor,
            is_admin=token.allows(Scope.ADMIN),
            token_id=token.pk,
        )


def require_admin(caller: Caller) -> None:
    if not caller.is_admin:
        raise NotAllowed(
            "only admins of this project can change its settings "
            "(a member with role admin, or a token with the 'admin' scope)"
        )


def own(caller: Caller, row) -> None:
    """Refuse a row of another project, as if it did not exist."""
    if row.project_id != caller.project.pk:
        raise NotInProject(f"no such {type(row).__name__} in this project")


def audit(caller: Caller, type_: str, message: str, **data) -> Event:
    """The one audit path of every settings change, whoever asks."""
    return Event.record(
        type_, project=caller.project, actor=caller.actor, message=message, data=data
    )


def checked(row, *, exclude: tuple[str, ...] = ()) -> None:
    """The model's own checks (lengths, choices, its clean()) as SettingInvalid naming
    the first field refused. Uniqueness is left to the database (saved() below): a
    lookup first would race a second request."""
    try:
        row.full_clean(
            exclude=["project", *exclude], validate_unique=False, validate_constraints=False
        )
    except ValidationError as exc:
        raise invalid(exc) from None


def invalid(exc: ValidationError) -> SettingInvalid:
    if hasattr(exc, "error_dict"):
        field: str | None
        field, errors = next(iter(exc.error_dict.items()))
        field = None if field == "__all__" else field
        return SettingInvalid(field, " ".join(e for err in errors for e in err.messages))
    return SettingInvalid(None, " ".join(exc.messages))


def saved(row, what: str, **fields) -> None:
    """Save `row`; SettingConflict on the name when the project already has one (the
    unique constraint decides, not a racy lookup). `fields`: update_fields."""
    try:
        with transaction.atomic():
            row.save(**fields)
    except IntegrityError:
        raise SettingConflict("name", f"{what} of this project already has this name.") from None


def disable_or_delete(caller: Caller, row, kind: str, gone: str, uses: Callable[[Any], str]) -> str:
    """One rule for what history refers to, for an admin of the row's project: when
    `uses(row)` says what refers to it (e.g. "3 replicas on it") the row is kept,
    disabled; when it says nothing, the row is deleted (`gone`: what the audit message
    calls it). Audited either way; returns "disabled" or "deleted"."""
    require_admin(caller)
    own(caller, row)
    key = kind.replace(" ", "_")
    if used := uses(row):
        type(row).objects.filter(pk=row.pk).update(enabled=False)
        row.enabled = False
        audit(
            caller,
            f"{key}.disabled",
            f"{kind} {row.name!r} disabled, not deleted: {used}",
            **{key: row.pk},
        )
        return "disabled"
    pk = row.pk
    row.delete()
    audit(caller, f"{key}.deleted", f"{kind} {row.name!r} ({gone}) deleted", **{key: pk})
    return "deleted"


def update_row(
    caller: Caller,
    row,
    changes: dict,
    kind: str,
    order: tuple[str, ...],
    clean: Callable[[Any, dict], list[str]],
    copy: tuple[str, ...] = (),
) -> list[str]:
    """The one way a settings row changes, for an admin of its project. The row is read
    again as stored (a form's instance already holds the new values) and `changes` are
    set on it (only the fields in `order`); `clean(fresh, before)` checks it, may refuse,
    and returns the fields that changed. Then it is saved, the one audit Event names
    those fields, and `row` takes the values stored (`order` and `copy`). Returns the
    fields that changed."""
    require_admin(caller)
    own(caller, row)
    fresh = type(row).objects.get(pk=row.pk)
    fields = clean(fresh, apply(fresh, changes, order))
    saved(fresh, f"{'An' if kind[0] in 'aeiou' else 'A'} {kind}")
    key = kind.replace(" ", "_")
    audit(
        caller,
        f"{key}.changed",
        f"{kind} {fresh.name!r} changed: {', '.join(fields) or 'nothing'}",
        **{key: row.pk},
    )
    for name in (*order, *copy):
        setattr(row, name, getattr(fresh, name))
    return fields


def apply(row, changes: dict, order: tuple[str, ...]) -> dict:
    """Set `changes` on `row` (only the fields in `order` may change); returns what the
    fields were, for changed()."""
    unknown = set(changes) - set(order)
    if unknown:
        raise SettingInvalid(sorted(unknown)[0], "cannot be changed")
    before = {name: getattr(row, name) for name in order}
    for name, value in changes.items():
        setattr(row, name, value)
    return before


def changed(row, before: dict) -> list[str]:
    """The fields that differ from `before` once cleaned (a target respelled the same is
    no change), in `before`'s order (the settings form's)."""
    return [name for name, value in before.items() if getattr(row, name) != value]
