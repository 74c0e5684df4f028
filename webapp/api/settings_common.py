"""What the /settings/ routes share (scope admin): the caller, the lookup of a row in
the token's project, and the answers to a refusal.

Each route is a thin caller of the action the dashboard's settings pages call
(webapp.domain.actions), so both audiences check, save and audit alike. A refused value
is 400 naming the field, a refusal by the project's state 409 (a name in use, the last
admin, a profile that resumes used), a caller who is not an admin 403."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from ninja import Path
from pydantic import ConfigDict, Field

from webapp.api.errors import ApiError
from webapp.api.params import NO_NUL, BodyIn
from webapp.domain import actions
from webapp.domain.ingest.event_schema import INT64_MAX

T = TypeVar("T")

# The id of a token, storage target, launch profile, alert channel or membership.
SettingId = Annotated[int, Path(ge=1, le=INT64_MAX)]


def Text(max_length: int, min_length: int = 0):  # noqa: N802 (a type, spelled as one)
    """A string of at most `max_length` characters (the model field's), without NUL."""
    return Annotated[str, Field(min_length=min_length, max_length=max_length, pattern=NO_NUL)]


class ChangeIn(BodyIn):
    """A change (PATCH): only the fields sent change, and at least one is sent (sent()
    refuses `null` and `{}`, which would change nothing, rather than answer a success)."""

    model_config = ConfigDict(strict=True, json_schema_extra={"minProperties": 1})


def sent(body: BodyIn | None) -> dict:
    """The fields the body sent. A change must send one: ninja reads `null` and `{}` as
    a body of defaults, which would answer a change that changed nothing."""
    fields = body.model_dump(exclude_unset=True) if body is not None else {}
    if not fields:  # a creation always sends its required fields
        raise ApiError(400, "body: send at least one field to change")
    return fields


def caller(request) -> actions.Caller:
    return actions.Caller.of_token(request.auth)


def in_project(request, model, pk: int, what: str):
    """The row of the token's project; 404 for one of another project, as for none."""
    rows = getattr(model, "objects", model)  # a model or a queryset of it
    row = rows.filter(project=request.auth.project, pk=pk).first()
    if row is None:
        raise ApiError(404, f"no {what} {pk} in this project")
    return row


def carry_out(request, action: Callable[[actions.Caller], T]) -> T:
    """`action(caller)`, its refusals as the API's answers."""
    try:
        return action(caller(request))
    except actions.NotAllowed as exc:
        raise ApiError(403, str(exc)) from None
    except actions.NotInProject as exc:
        raise ApiError(404, str(exc)) from None
    except actions.SettingConflict as exc:
        raise ApiError(409, _named(exc)) from None
    except actions.SettingInvalid as exc:
        raise ApiError(400, _named(exc)) from None


def _named(exc: actions.SettingInvalid) -> str:
    # Named as the body's own checks name a field (webapp/api/errors.validation_message).
    return f"body.{exc.field}: {exc.message}" if exc.field else exc.message
