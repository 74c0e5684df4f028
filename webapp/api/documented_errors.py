"""The error answers of each operation, in the OpenAPI document, by rule.

Which errors an operation can give follows from what it takes, so they are added here
to every operation rather than listed by hand (a list by hand is where one goes
missing): 400 when it has parameters or a body (a value out of range, a NUL, bad JSON),
401 and 403 when it needs a token (none or unknown; a scope it lacks), 404 when a path
parameter names something (not in the token's project), 413 when it takes a body. What
only some operations answer (409, and 404 for a named target or profile) is in their
own `response=`. Every one of them has the body {"error": "..."} (ErrorOut)."""

from __future__ import annotations

from http import HTTPStatus

from webapp.api.errors import ErrorOut

ERROR_REF = {"$ref": "#/components/schemas/ErrorOut"}
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def statuses_of(operation: dict) -> list[int]:
    parameters = operation.get("parameters", [])
    body = "requestBody" in operation
    codes = []
    if parameters or body:
        codes.append(400)
    if operation.get("security"):
        codes += [401, 403]
    if any(p.get("in") == "path" for p in parameters):
        codes.append(404)
    if body:
        codes.append(413)
    return codes


def declare_errors(schema: dict) -> dict:
    """Adds the errors above to each operation of `schema` (leaving any it declares
    itself, such as the events' 400 with `index` and `field`); returns `schema`."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.setdefault("ErrorOut", ErrorOut.model_json_schema())
    for item in schema.get("paths", {}).values():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            # ninja's keys are ints; JSON's are strings: one key per status.
            responses = {str(k): v for k, v in operation.get("responses", {}).items()}
            operation["responses"] = responses
            for code in statuses_of(operation):
                responses.setdefault(
                    str(code),
                    {
                        "description": HTTPStatus(code).phrase,
                        "content": {"application/json": {"schema": ERROR_REF}},
                    },
                )
    return schema
