"""The v1 event contract (docs/api.md): one pydantic model per event type.

Types are strict (a step is an integer, not "5" nor 5.5; JSON's 5.0 is the integer 5, as
JSON Schema has it). Fields this version does not
know are kept in the stored event, not rejected, so a newer client can talk to an older
server. Every string is bounded; limits match the database columns.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

EVENT_TYPES = (
    "run.started",
    "run.heartbeat",
    "checkpoint.started",
    "checkpoint.saved",
    "checkpoint.failed",
    "run.finished",
    "run.failed",
    "run.preempted",
    "metrics",
)
CHECKPOINT_TYPES = ("checkpoint.started", "checkpoint.saved", "checkpoint.failed")
# The fields every event has; the rest is its own data (the event row's `data`).
ENVELOPE = ("id", "type", "run", "time")

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


# Every number a job sends meets arithmetic somewhere (deadlines, durations, charts,
# sums): each is bounded here, so that one event cannot overflow a read for its whole
# project. The bounds are far beyond any real job's.
EARLIEST_TIME = datetime(2000, 1, 1, tzinfo=UTC)
# How far ahead of the server's clock an event's time may be (a job's clock a little
# fast); a time further ahead is a broken clock, refused rather than believed.
MAX_CLOCK_AHEAD_S = 24 * 3600
MAX_INTERVAL_S = 366 * 24 * 3600  # checkpoint intervals and save durations: a year
MAX_STEP = 2**53 - 1  # exact in every JSON reader, JavaScript's charts included
MAX_FILE_SIZE = 2**50  # 1 PiB a file
MAX_WORLD_SIZE = 2**20
MAX_TAGS = 100
MAX_METRICS = 1000  # names in one metrics object


def _zoned_time(value: Any) -> datetime:
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 string such as 2026-01-31T12:00:00Z")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise ValueError("must carry a time zone (Z or +00:00)")
    if parsed < EARLIEST_TIME:
        raise ValueError("is before 2000: the job's clock is wrong")
    if parsed > datetime.now(UTC) + timedelta(seconds=MAX_CLOCK_AHEAD_S):
        raise ValueError(
            f"is more than {MAX_CLOCK_AHEAD_S // 3600} hours ahead of the server's clock: "
            "the job's clock is wrong"
        )
    return parsed


def _integer(value: Any) -> int:
    """An integer, also when JSON spells it 2314.0 (JSON Schema's integer admits it);
    never a bool, a string or a fraction."""
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise ValueError("must be an integer")
    return value


def _run_key(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters")
    if value != value.strip():
        raise ValueError("must not start or end with white space")
    return value


def _relative_path(value: str) -> str:
    # String tests, not PurePosixPath: the same answers at a tenth of the cost, which
    # was a twentieth of a 1000-event batch.
    if value.startswith("/") or ".." in value.split("/") or "\x00" in value or value in ("", "."):
        raise ValueError("must be a path relative to the checkpoint location, without '..'")
    return value


def _location(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL")
    if value.startswith("s3://"):
        if len(value) <= 5 or value[5] == "/":
            raise ValueError("an s3:// location needs a bucket: s3://bucket/prefix")
        return value
    if not value.startswith("/"):
        raise ValueError("must be an absolute path or an s3:// URI")
    return value


def _host(value: str) -> str:
    # A host name becomes a queue name (validate.<host>) and a label on pages.
    if value and not _HOST.match(value):
        raise ValueError("a host is letters, digits, '.', '-' and '_'")
    return value


def _sha256(value: str) -> str:
    if not _SHA256.match(value):
        raise ValueError("must be 64 hexadecimal characters")
    return value.lower()


def _number(value: Any) -> float:
    # bool is an int in Python; a metric of `true` is a client bug, not 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return value


def _event_id(value: Any) -> uuid.UUID:
    if not isinstance(value, str):
        raise ValueError("must be a UUID string")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a UUID") from None


RunKey = Annotated[StrictStr, Field(min_length=1, max_length=200), AfterValidator(_run_key)]
EventId = Annotated[uuid.UUID, BeforeValidator(_event_id)]
ZonedTime = Annotated[datetime, BeforeValidator(_zoned_time)]
# The largest values the database columns hold: a larger one is refused here, with the
# field named, instead of failing the transaction.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
Integer = Annotated[int, BeforeValidator(_integer)]
Int32 = Annotated[Integer, Field(ge=-INT32_MAX - 1, le=INT32_MAX)]
Step = Annotated[Integer, Field(ge=0, le=MAX_STEP)]
Number = Annotated[float, BeforeValidator(_number)]
# A duration in seconds: finite, at most a year.
Seconds = Annotated[float, BeforeValidator(_number), Field(allow_inf_nan=False, le=MAX_INTERVAL_S)]
Metrics = Annotated[
    dict[Annotated[StrictStr, Field(max_length=200)], Number], Field(max_length=MAX_METRICS)
]


class _Event(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: EventId = Field(description="Client-made UUID; a repeat is accepted and changes nothing.")
    run: RunKey = Field(description="The client's run key, unique within the project.")
    time: ZonedTime = Field(description="When it happened, ISO 8601 with a zone.")


class RunStarted(_Event):
    type: Literal["run.started"]
    name: Annotated[StrictStr, Field(max_length=200)] = ""
    host: Annotated[StrictStr, Field(max_length=255)] = ""
    framework: Annotated[StrictStr, Field(max_length=100)] = ""
    world_size: Annotated[Integer, Field(ge=1, le=MAX_WORLD_SIZE)] | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    expected_interval_s: Annotated[Seconds, Field(gt=0)] | None = None
    resumed_from: (
        Annotated[StrictStr, Field(max_length=100)]
        | Annotated[StrictInt, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
        | None
    ) = None
    tags: Annotated[
        list[Annotated[StrictStr, Field(max_length=200)]], Field(max_length=MAX_TAGS)
    ] = Field(default_factory=list)


class RunHeartbeat(_Event):
    type: Literal["run.heartbeat"]
    step: Step | None = None
    metrics: Metrics = Field(default_factory=dict)


class CheckpointStarted(_Event):
    type: Literal["checkpoint.started"]
    step: Step


class CheckpointFileIn(BaseModel):
    path: Annotated[StrictStr, Field(max_length=1000), AfterValidator(_relative_path)]
    size: Annotated[Integer, Field(ge=0, le=MAX_FILE_SIZE)]
    sha256: Annotated[StrictStr, AfterValidator(_sha256)]


class CheckpointPartIn(BaseModel):
    """The share of a checkpoint that one rank of a distributed job wrote (docs/api.md,
    "Checkpoints written by many ranks"): the event's files are this rank's only, and the
    checkpoint is complete once every rank of world_size has reported its part."""

    rank: Annotated[Integer, Field(ge=0, lt=MAX_WORLD_SIZE)]
    world_size: Annotated[Integer, Field(ge=1, le=MAX_WORLD_SIZE)]
    host: Annotated[StrictStr, Field(max_length=255), AfterValidator(_host)] = ""

    @model_validator(mode="after")
    def _rank_in_world(self) -> CheckpointPartIn:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        return self


class CheckpointSaved(_Event):
    type: Literal["checkpoint.saved"]
    step: Step
    epoch: Annotated[Integer, Field(ge=0, le=INT32_MAX)] | None = None
    location: Annotated[StrictStr, Field(min_length=1, max_length=4096), AfterValidator(_location)]
    files: Annotated[list[CheckpointFileIn], Field(min_length=1, max_length=100_000)]
    save_seconds: Annotated[Seconds, Field(ge=0)] | None = None
    metrics: Metrics = Field(default_factory=dict)
    format: Annotated[StrictStr, Field(max_length=50)] = ""
    part: CheckpointPartIn | None = None

    @field_validator("files")
    @classmethod
    def _total_size_fits(cls, files: list[CheckpointFileIn]) -> list[CheckpointFileIn]:
        if sum(f.size for f in files) > MAX_STEP:
            raise ValueError(f"the files' sizes add up to more than {MAX_STEP} bytes")
        return files


class CheckpointFailed(_Event):
    type: Literal["checkpoint.failed"]
    step: Step
    error: Annotated[StrictStr, Field(max_length=10_000)] = ""


class RunFinished(_Event):
    type: Literal["run.finished"]
    exit_code: Int32 | None = None
    error: Annotated[StrictStr, Field(max_length=10_000)] = ""


class RunFailed(_Event):
    type: Literal["run.failed"]
    exit_code: Int32 | None = None
    error: Annotated[StrictStr, Field(max_length=10_000)] = ""


class RunPreempted(_Event):
    """The scheduler stopped the job (a preemption, the time limit near, a requeue):
    not a failure; the client sends it on SIGTERM and SIGUSR1."""

    type: Literal["run.preempted"]
    signal: Annotated[StrictStr, Field(max_length=32)] = ""
    exit_code: Int32 | None = None
    error: Annotated[StrictStr, Field(max_length=10_000)] = ""


class MetricPointIn(BaseModel):
    step: Step
    values: Metrics


class MetricsEvent(_Event):
    type: Literal["metrics"]
    points: Annotated[list[MetricPointIn], Field(min_length=1, max_length=10_000)]


MODELS: dict[str, type[_Event]] = {
    "run.started": RunStarted,
    "run.heartbeat": RunHeartbeat,
    "checkpoint.started": CheckpointStarted,
    "checkpoint.saved": CheckpointSaved,
    "checkpoint.failed": CheckpointFailed,
    "run.finished": RunFinished,
    "run.failed": RunFailed,
    "run.preempted": RunPreempted,
    "metrics": MetricsEvent,
}

AnyEvent = Annotated[
    RunStarted
    | RunHeartbeat
    | CheckpointStarted
    | CheckpointSaved
    | CheckpointFailed
    | RunFinished
    | RunFailed
    | RunPreempted
    | MetricsEvent,
    Field(discriminator="type"),
]


class EventError(ValueError):
    """A rejected event: names the event's index in the batch and the field."""

    def __init__(self, index: int, field: str | None, message: str):
        self.index = index
        self.field = field
        self.message = message
        prefix = f"events[{index}]" + (f".{field}" if field else "")
        super().__init__(f"{prefix}: {message}")


def _field_path(loc: tuple) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _friendly(error: Mapping) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is required"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    message = error["msg"]
    return message[0].lower() + message[1:]


def parse_event(index: int, raw: Any) -> _Event:
    """Validate one decoded JSON event, or raise EventError naming the first problem."""

    if not isinstance(raw, dict):
        raise EventError(index, None, "an event must be a JSON object")
    kind = raw.get("type")
    if kind is None:
        raise EventError(index, "type", "is required")
    model = MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise EventError(
            index, "type", f"unknown event type {kind!r}; expected one of {', '.join(EVENT_TYPES)}"
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise EventError(index, _field_path(first["loc"]) or None, _friendly(first)) from None


def json_safe(value: Any) -> Any:
    """JSON has no NaN or Infinity, and PostgreSQL's jsonb refuses them, but Python
    clients send them (a diverged loss is NaN). Keep them visible as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
