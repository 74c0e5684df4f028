"""Every API error is JSON: {"error": "<what is wrong>", ...details}."""

from __future__ import annotations

import logging

from django.http import JsonResponse

log = logging.getLogger(__name__)


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
    from ninja.errors import AuthenticationError, HttpError
    from ninja.errors import ValidationError as NinjaValidationError

    @api.exception_handler(ApiError)
    def on_api_error(request, exc: ApiError):
        return error_response(exc.status, exc.message, **exc.details)

    @api.exception_handler(AuthenticationError)
    def on_auth_error(request, exc):
        from webapp.api.auth import MISSING_TOKEN

        return error_response(401, MISSING_TOKEN)

    @api.exception_handler(NinjaValidationError)
    def on_validation_error(request, exc):
        first = exc.errors[0] if exc.errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ())[1:])
        return error_response(400, f"{loc or 'request'}: {first.get('msg', 'invalid')}")

    @api.exception_handler(HttpError)
    def on_http_error(request, exc):
        return error_response(exc.status_code, str(exc))

    from django.http import Http404

    @api.exception_handler(Http404)
    def on_not_found(request, exc):
        return error_response(404, str(exc) or "not found")

    @api.exception_handler(Exception)
    def on_crash(request, exc):
        log.exception("API error on %s %s", request.method, request.path)
        return error_response(500, "internal error; the server log has the details")
