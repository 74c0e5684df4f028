"""Every API error is JSON: {"error": "<what is wrong>", ...details}."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, JsonResponse
from ninja import Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError

from webapp.api.params import NO_NUL

log = logging.getLogger(__name__)

MISSING_TOKEN = "missing API token: send 'Authorization: Bearer <token>'"  # noqa: S105  (a message, not a secret)


class ErrorOut(Schema):
    """What every error answer holds; some add details (events: index and field)."""

    error: str


class ApiError(Exception):
    def __init__(self, status: int, message: str, **details):
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details


def error_response(status: int, message: str, **details) -> JsonResponse:
    response = JsonResponse({"error": message, **details}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="lifeboat"'
    return response


def install_handlers(api) -> None:

    @api.exception_handler(ApiError)
    def on_api_error(request, exc: ApiError):
        return error_response(exc.status, exc.message, **exc.details)

    @api.exception_handler(AuthenticationError)
    def on_auth_error(request, exc):
        return error_response(401, MISSING_TOKEN)

    @api.exception_handler(NinjaValidationError)
    def on_validation_error(request, exc):
        return error_response(400, validation_message(exc.errors))

    @api.exception_handler(RequestDataTooBig)
    def on_body_too_big(request, exc):
        return error_response(413, f"request body too large: {exc}")

    @api.exception_handler(SuspiciousOperation)
    def on_suspicious(request, exc):
        return error_response(400, f"bad request: {exc}")

    @api.exception_handler(HttpError)
    def on_http_error(request, exc):
        return error_response(exc.status_code, str(exc))

    @api.exception_handler(Http404)
    def on_not_found(request, exc):
        return error_response(404, str(exc) or "not found")

    @api.exception_handler(Exception)
    def on_crash(request, exc):
        log.exception("API error on %s %s", request.method, request.path)
        return error_response(500, "internal error; the server log has the details")


def validation_message(errors: list) -> str:
    """The first error of a parameter or body, with the parameter named: "limit: Input
    should be less than or equal to 1000"."""

    first = errors[0] if errors else {}
    loc = ".".join(str(p) for p in first.get("loc", ())[1:])
    message = first.get("msg", "invalid")
    ctx = first.get("ctx") or {}
    if ctx.get("pattern") == NO_NUL:
        message = "must not contain NUL (\\u0000)"
    elif first.get("type") == "literal_error":
        message = f"must be one of {ctx.get('expected', '').replace(' or ', ', ')}"
    return f"{loc or 'request'}: {message}"
