"""Every answer under /api/ is JSON, whoever makes it.

The API's own views answer {"error": ...} (webapp/api/errors.py); what answers before
or around them does not: Django's CSRF page, the 405 of a route asked with another
method, a 400 for a bad Host header, the 403 and 404 pages. JsonErrorsUnderApi, the
outermost middleware, replaces any such answer under /api/ by {"error": ...} with the
same status (and the Allow header of a 405), so a client never has to parse HTML.

Unknown paths under /api/ reach api_not_found, which is exempt from CSRF: the API
authenticates with bearer tokens, never cookies, so a POST to a mistyped URL is a 404,
not a CSRF failure."""

from __future__ import annotations

from http import HTTPStatus

from django.views.decorators.csrf import csrf_exempt

from webapp.api.errors import error_response

PREFIX = "/api/"


def _message(request, response) -> str:
    status = response.status_code
    if status == 404:
        return f"no API endpoint at {request.path}"
    if status == 405:
        allowed = response.get("Allow", "")
        return f"{request.method} is not allowed at {request.path}; allowed: {allowed}"
    if status == 403:
        return "forbidden"
    if status == 413:
        return "request body too large"
    if status >= 500:
        return "internal error; the server log has the details"
    try:
        return HTTPStatus(status).phrase.lower()
    except ValueError:
        return "request refused"


def is_json(response) -> bool:
    return response.get("Content-Type", "").split(";")[0].strip() == "application/json"


class JsonErrorsUnderApi:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            response.status_code < 400
            or not request.path_info.startswith(PREFIX)
            or is_json(response)
        ):
            return response
        replaced = error_response(response.status_code, _message(request, response))
        if "Allow" in response:
            replaced["Allow"] = response["Allow"]
        return replaced


@csrf_exempt
def api_not_found(request, *args, **kwargs):
    """Any path under /api/ that no route matches, with any method."""
    return error_response(404, f"no API endpoint at {request.path}")
