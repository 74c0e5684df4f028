"""Bearer-token authentication with scopes.

Each endpoint names the scope it needs; a token from one project only ever sees that
project (request.auth.project), which every query in this package filters on."""

from __future__ import annotations

from ninja.security import HttpBearer

from webapp.api.errors import ApiError
from webapp.domain.models import ApiToken


class TokenAuth(HttpBearer):
    def __init__(self, scope: str):
        super().__init__()
        self.scope = scope

    def authenticate(self, request, token: str) -> ApiToken:
        return token_with_scope(token, self.scope)


def bearer_secret(header: str | None) -> str | None:
    """The secret of an 'Authorization: Bearer <secret>' header, read as ninja's
    HttpBearer reads it; None when there is none."""
    if not header:
        return None
    scheme, _, secret = header.partition(" ")
    return secret if scheme.lower() == "bearer" else None


def token_with_scope(secret: str, scope: str) -> ApiToken:
    api_token = ApiToken.authenticate(secret)
    if api_token is None:
        raise ApiError(401, "unknown or revoked API token")
    if not api_token.allows(scope):
        raise ApiError(
            403,
            f"this token lacks the '{scope}' scope (it has: {', '.join(api_token.scopes)})",
        )
    return api_token


ingest_auth = TokenAuth("ingest")
read_auth = TokenAuth("read")
operate_auth = TokenAuth("operate")
# A project admin's powers: the /settings/ routes (settings_*.py).
admin_auth = TokenAuth("admin")
