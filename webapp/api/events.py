"""POST /api/v1/events, the endpoint every training job depends on (docs/api.md): its
steps and its description in the OpenAPI document. Its one door is the ASGI application
production serves (webapp/api/ingest_asgi.py), which takes these steps; no Django view
answers the route, so the document, the tests and production describe and run one
thing."""

from __future__ import annotations

import json
import zlib

import orjson
from django.conf import settings
from ninja import Schema

from webapp.api.errors import ApiError, ErrorOut
from webapp.domain.ingest.apply import ingest
from webapp.domain.ingest.event_schema import EventError, parse_event

PATH = "/api/v1/events"


class EventResult(Schema):
    id: str
    status: str


class IngestOut(Schema):
    accepted: int
    created: int
    duplicates: int
    results: list[EventResult]


class EventErrorOut(ErrorOut):
    """A 400 names the rejected event of a batch (index) and its field."""

    index: int | None = None
    field: str | None = None


_BATCH_SCHEMA = {
    "oneOf": [
        {"$ref": "#/components/schemas/AnyEvent"},
        {
            "type": "object",
            "required": ["events"],
            "properties": {
                # No maxItems: a batch over EVENTS_MAX_BATCH is answered 413 (the
                # clients split their batch on a 413), which a maxItems would promise
                # as a 400 or 422. The description says the limit.
                "events": {
                    "type": "array",
                    "minItems": 1,
                    "description": f"At most EVENTS_MAX_BATCH ({settings.EVENTS_MAX_BATCH}) "
                    "events; more is answered 413 and the client sends them in halves.",
                    "items": {"$ref": "#/components/schemas/AnyEvent"},
                }
            },
        },
    ]
}


def _json_answer(description: str, schema: str) -> dict:
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


def describe(schema: dict) -> dict:
    """Adds the route to the API's OpenAPI document `schema` (with the models of its
    answers; the event models are added beside the others'); returns `schema`."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (IngestOut, EventErrorOut, ErrorOut):
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components.setdefault(model.__name__, model_schema)
    operation = {
        "post": {
            "operationId": "post_events",
            "summary": "Send one event or a batch of up to EVENTS_MAX_BATCH (1000)",
            "description": "Idempotent by event id: a repeat is accepted and changes nothing. "
            "A bad event rejects the whole request (nothing is stored) with the index and "
            "field named.",
            "tags": ["events"],
            "security": [{"TokenAuth": []}],
            "parameters": [],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _BATCH_SCHEMA}},
            },
            "responses": {
                "202": _json_answer("Accepted", "IngestOut"),
                "400": _json_answer("Bad Request", "EventErrorOut"),
                "401": _json_answer("Unauthorized", "ErrorOut"),
                "403": _json_answer("Forbidden", "ErrorOut"),
                "413": _json_answer("Request Entity Too Large", "ErrorOut"),
                "415": _json_answer("Unsupported Media Type", "ErrorOut"),
            },
        }
    }
    schema["paths"] = {PATH: operation, **schema.get("paths", {})}  # first, as in docs/api.md
    return schema


def read_body(declared: str | None, encoding: str, read) -> bytes:
    """The request body, within EVENTS_MAX_BODY_BYTES before and after gzip.

    declared: the Content-Length header; encoding: Content-Encoding; read(n): the
    stream's read."""
    limit = settings.EVENTS_MAX_BODY_BYTES
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}")
    body = read(limit + 1)
    if len(body) > limit:
        raise ApiError(413, f"request body is over the limit of {limit} bytes")
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise ApiError(415, f"Content-Encoding {encoding!r} is not supported; use gzip")
    # Decompress at most limit+1 bytes so a small bomb cannot fill memory.
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        plain = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ApiError(400, f"body is not valid gzip: {exc}") from None
    if len(plain) > limit or decompressor.unconsumed_tail:
        raise ApiError(413, f"decompressed body is over the limit of {limit} bytes")
    return plain


def _decode(body: bytes) -> tuple[object, bool]:
    """The payload, and whether it is sure to hold no NaN or Infinity (orjson refuses
    them, so what it parsed has none)."""
    if not body.strip():
        raise ApiError(400, 'empty body: send one event or {"events": [...]}')
    finite = True
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        finite = False
        # orjson is about 4x faster, but refuses what the stdlib (and Python clients)
        # accept: NaN and Infinity, integers over 64 bits. The stdlib decides, and its
        # message is the one given.
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ApiError(400, f"body is not valid JSON: {exc}") from None
    if b"\\u0000" in body and _has_nul(payload):
        # PostgreSQL text and jsonb cannot hold NUL; refuse it here with a clear word.
        raise ApiError(400, "strings must not contain NUL (\\u0000)")
    return payload, finite


def _has_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _unwrap(payload) -> list:
    if isinstance(payload, dict) and "events" in payload and "type" not in payload:
        events = payload["events"]
        if not isinstance(events, list):
            raise ApiError(400, "events must be a list")
        if not events:
            raise ApiError(400, "events is empty")
        if len(events) > settings.EVENTS_MAX_BATCH:
            raise ApiError(
                413,
                f"a batch holds at most {settings.EVENTS_MAX_BATCH} events; got {len(events)}",
            )
        return events
    if isinstance(payload, dict):
        return [payload]
    raise ApiError(400, 'body must be one event object or {"events": [...]}')


def accept_events(token, declared: str | None, encoding: str, read) -> bytes:
    """The whole of POST /api/v1/events after authentication: read, check, store.

    Returns the 202 body; raises ApiError for anything refused. webapp/api/ingest_asgi.py
    calls it for a body it does not read on its event loop; for the others it takes the
    same steps (decode_events, parse_events, answer) with the group committer between."""
    raw_events, finite = decode_events(declared, encoding, read)
    return store_events(token, raw_events, finite)


def decode_events(declared: str | None, encoding: str, read) -> tuple[list, bool]:
    """The body's events as JSON values (one or a batch), and whether they are sure to
    hold no NaN or Infinity. Raises ApiError (400, 413, 415)."""
    payload, finite = _decode(read_body(declared, encoding, read))
    return _unwrap(payload), finite


def parse_events(raw_events: list) -> list:
    try:
        return [parse_event(i, raw) for i, raw in enumerate(raw_events)]
    except EventError as exc:
        raise ApiError(400, str(exc), index=exc.index, field=exc.field) from None


def store_events(token, raw_events: list, finite: bool) -> bytes:
    """Check and store decoded events; the 202 body."""
    events = parse_events(raw_events)
    result = ingest(token.project, token.actor, events, raw_events, finite=finite)
    return answer(events, result)


def answer(events: list, result) -> bytes:
    # Written directly (the shape is IngestOut's, which the OpenAPI document gives):
    # ninja's check of the response against the schema took a twelfth of the CPU of
    # a 1000-event batch.
    return orjson.dumps(
        {
            "accepted": len(events),
            "created": len(result.created),
            "duplicates": len(result.duplicates),
            "results": [
                {"id": str(event.id), "status": status}
                for event, status in zip(events, result.statuses, strict=True)
            ],
        }
    )
