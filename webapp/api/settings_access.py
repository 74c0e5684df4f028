"""Who reaches the project, through the API (scope admin): its API tokens and its members.

A new token's secret is in the answer to its creation and nowhere else: only its SHA-256
is stored, lists show the first characters (`prefix`). A token cannot revoke itself."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Router, Schema, Status
from pydantic import Field

from webapp.api.auth import admin_auth
from webapp.api.errors import ErrorOut
from webapp.api.params import BodyIn, Name
from webapp.api.settings_common import ChangeIn, SettingId, Text, carry_out, in_project
from webapp.domain import actions
from webapp.domain.models import ApiToken, Membership
from webapp.domain.models.projects import Role, Scope

router = Router(tags=["settings"])


class TokenOut(Schema):
    id: int
    name: str
    prefix: str
    scopes: list[str]
    created_by: str | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class NewTokenOut(TokenOut):
    # The only time it is shown: store it now.
    secret: str


def _token(token: ApiToken, **extra) -> dict:
    return {
        "id": token.pk, "name": token.name, "prefix": token.prefix, "scopes": token.scopes,
        "created_by": token.created_by.get_username() if token.created_by else None,
        "created_at": token.created_at, "last_used_at": token.last_used_at,
        "revoked_at": token.revoked_at, **extra,
    }  # fmt: skip


class TokenIn(BodyIn):
    name: Name
    scopes: list[Literal[tuple(Scope.values)]] = Field(min_length=1, max_length=len(Scope.values))


@router.get("/settings/tokens", auth=admin_auth, response={200: list[TokenOut]})
def list_tokens(request):
    """The project's tokens, those in use first, newest first; never a secret."""
    rows = request.auth.project.tokens.select_related("created_by")
    return [_token(t) for t in rows.order_by("revoked_at", "-created_at")]


@router.post("/settings/tokens", auth=admin_auth, response={201: NewTokenOut, 409: ErrorOut})
def create_token(request, body: TokenIn):
    """Issue a token. Its `secret` is in this answer only: it is not stored (only its
    SHA-256), so no later request can show it again. A name in use is 409."""
    issued = carry_out(request, lambda c: actions.create_token(c, body.name, list(body.scopes)))
    return Status(201, _token(issued.token, secret=issued.secret))


@router.delete(
    "/settings/tokens/{token_id}", auth=admin_auth, response={200: TokenOut, 409: ErrorOut}
)
def revoke_token(request, token_id: SettingId):
    """Revoke a token: requests with it get 401 from then on (within
    API_TOKEN_CACHE_SECONDS in other processes). Revoking a revoked token changes
    nothing; a token cannot revoke itself (409)."""
    token = in_project(request, ApiToken, token_id, "token")
    carry_out(request, lambda c: actions.revoke_token(c, token))
    token.refresh_from_db()
    return _token(token)


class MemberOut(Schema):
    id: int
    username: str
    role: str


def _member(membership: Membership) -> dict:
    return {
        "id": membership.pk,
        "username": membership.user.get_username(),
        "role": membership.role,
    }


class MemberIn(BodyIn):
    username: Text(150, 1)
    role: Literal[tuple(Role.values)] = "viewer"


class RoleIn(ChangeIn):
    role: Literal[tuple(Role.values)]


@router.get("/settings/members", auth=admin_auth, response={200: list[MemberOut]})
def list_members(request):
    rows = request.auth.project.memberships.select_related("user").order_by("user__username")
    return [_member(m) for m in rows]


@router.post("/settings/members", auth=admin_auth, response={201: MemberOut, 409: ErrorOut})
def add_member(request, body: MemberIn):
    """Add an existing user by name (accounts are made by the deployment's admin). An
    unknown name is 400, and written to the audit log (member.lookup_failed)."""
    membership = carry_out(request, lambda c: actions.add_member(c, body.username, body.role))
    return Status(201, _member(membership))


def _membership(request, membership_id: int) -> Membership:
    return in_project(request, Membership.objects.select_related("user"), membership_id, "member")


@router.patch(
    "/settings/members/{membership_id}",
    auth=admin_auth,
    response={200: MemberOut, 409: ErrorOut},
)
def change_role(request, membership_id: SettingId, body: RoleIn):
    """Change a member's role; demoting the last admin is 409."""
    membership = _membership(request, membership_id)
    carry_out(request, lambda c: actions.change_role(c, membership, body.role))
    return _member(membership)


@router.delete(
    "/settings/members/{membership_id}",
    auth=admin_auth,
    response={200: MemberOut, 409: ErrorOut},
)
def remove_member(request, membership_id: SettingId):
    """Remove a member; the last admin is 409."""
    membership = _membership(request, membership_id)
    answer = _member(membership)  # before the row, and its id, are gone
    carry_out(request, lambda c: actions.remove_member(c, membership))
    return answer
