"""The parameters of the API, with their ranges: one type per kind of value, used by
every endpoint that takes it.

Each range is part of the OpenAPI document (minimum, maximum, maxLength, pattern), and a
value outside it is refused before the view runs with 400 {"error": "<parameter>: ..."}
(webapp/api/errors.py), never passed to the database, where it could fail the query (an
offset below 0, an id over 64 bits, a NUL in a string: 500 before)."""

from __future__ import annotations

from typing import Annotated, Literal

from ninja import Path, Query, Schema
from ninja.parser import Parser
from pydantic import ConfigDict, Field

from webapp.domain.health.run_health import API_STATES
from webapp.domain.ingest.event_schema import INT64_MAX
from webapp.domain.models.checkpoints import CheckpointStatus
from webapp.domain.models.runs import RunStatus

# Pages: at most this many rows per answer; offsets beyond this many rows are refused
# (a deeper page is what before_step, or a filter, is for).
MAX_LIMIT = 1000
MAX_OFFSET = 1_000_000
# The project's MTBF an analytics query may assume, in hours: 36 s to about 114 years.
MTBF_HOURS_MIN, MTBF_HOURS_MAX = 0.01, 1_000_000.0

# PostgreSQL text cannot hold NUL. As a pattern it is in the document, so a client (or a
# fuzzer) knows; errors.py words its refusal.
NO_NUL = "^[^\\x00]*$"

# A database id: 1 .. 2**63 - 1 (a bigint).
CheckpointId = Annotated[int, Path(ge=1, le=INT64_MAX)]
ResumeId = Annotated[int, Path(ge=1, le=INT64_MAX)]
AuditId = Annotated[int, Path(ge=1, le=INT64_MAX)]
# A run key, as POST /events takes it: 1-200 characters (it may contain "/").
RunKeyPath = Annotated[str, Path(min_length=1, max_length=200, pattern=NO_NUL)]
RunKeyQuery = Annotated[str | None, Query(max_length=200, pattern=NO_NUL)]
# The name of a launch profile or a storage target (their model fields' max_length).
Name = Annotated[str, Field(min_length=1, max_length=100, pattern=NO_NUL)]

Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
# Checkpoints below this step; a step is 0 .. 2**63 - 1, as in the events.
BeforeStep = Annotated[int | None, Query(ge=0, le=INT64_MAX)]
# GET /runs/<key>/latest?checkpoint=<id>: that verified checkpoint, not the newest.
CheckpointQuery = Annotated[int | None, Query(ge=1, le=INT64_MAX)]
MtbfHours = Annotated[float | None, Query(ge=MTBF_HOURS_MIN, le=MTBF_HOURS_MAX)]
RunStatusFilter = Annotated[Literal[tuple(RunStatus.values)] | None, Query()]
HealthFilter = Annotated[Literal[API_STATES] | None, Query()]
CheckpointStatusFilter = Annotated[Literal[tuple(CheckpointStatus.values)] | None, Query()]


class ObjectBodies(Parser):
    """A JSON body is an object (or null, or absent): ninja alone would read `[1, 2]` or
    `"x"` as an empty object, and an action with an optional body would go ahead."""

    def parse_body(self, request):
        data = super().parse_body(request)
        if data is not None and not isinstance(data, dict):
            # ninja answers 400 "Cannot parse request body" (webapp/api/errors.py).
            raise ValueError("the body must be a JSON object")
        return data


class BodyIn(Schema):
    """The base of every request body: types are strict, as in the events (`"pinned": 0`
    is not false, a name is not a number)."""

    model_config = ConfigDict(strict=True)
