"""What the worker and its child processes send each other, as JSON over a pipe: the
inspection child (validation/inspect_child.py) and the resharded load
(recovery/reshard_load.py). Typed here once, so that both sides are checked against the
same shape (mypy, make lint). Standard library only: the children import no Django."""

from __future__ import annotations

from typing import Any, Required, TypedDict


class Finding(TypedDict, total=False):
    severity: Required[str]  # "corrupt" | "suspicious" | "info" | "error"
    code: Required[str]
    message: Required[str]
    file: str
    tensors: list[str]


class InspectRequest(TypedDict, total=False):
    base: Required[str]  # the local directory holding the checkpoint
    files: Required[list[str]]  # every file of it, relative to base
    single_file: Required[bool]
    format_hint: Required[str]  # what the job said, hostile: only compared
    only: list[str]  # one part of a checkpoint checked in parts: the files it reads
    raw_values: bool  # leave the NaN/Inf summary to the parent's merge
    threads: int


class InspectTimings(TypedDict):
    load_s: float
    scan_s: float


class InspectValues(TypedDict):
    nonfinite: list[dict[str, Any]]
    zero: list[dict[str, Any]]
    nonzero: list[str]  # tensors with a value that is not zero (Report.nonzero)


class InspectResult(TypedDict, total=False):
    format: Required[str]
    tensors: Required[int]
    parameters: Required[int]
    dtypes: Required[dict[str, int]]
    keys: Required[dict[str, list]]  # "<file>:<dotted.key>" -> [dtype, [shape...]]
    findings: Required[list[Finding]]
    timings: Required[InspectTimings]
    values: InspectValues  # with raw_values only


class ReshardRequest(TypedDict, total=False):
    base: Required[str]
    root: Required[str]  # the DCP folder inside base ("" when base is it)
    files: Required[list[str]]
    world_sizes: Required[list[int]]
    timeout_s: float


class ReshardOutcome(TypedDict):
    world_size: int
    ok: bool
    seconds: float
    message: str


class ReshardResult(TypedDict):
    saved_world_size: int | None
    tensors: int
    bytes: int
    results: list[ReshardOutcome]
    # [fqn, offsets, relative_path, offset, length, sha256] of every saved chunk
    chunks: list[list]
    error: str | None
