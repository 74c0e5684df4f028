"""The findings about tensor values (NaN, Inf, all zero), from what the scan saw and where
each value lives (tensor_places): one finding per kind of problem, not one per tensor,
so that a person reads one line per problem."""

from __future__ import annotations

from dataclasses import dataclass

from webapp.domain.child_payloads import Finding
from webapp.domain.validation.tensor_places import BOOKKEEPING, MODEL, ROLE_WORDS

MESSAGE_NAMES = 5  # tensors named in a message; the finding's "tensors" holds them all


@dataclass(frozen=True)
class NonFinite:
    name: str
    nan: int
    inf: int
    role: str = MODEL


@dataclass(frozen=True)
class AllZero:
    name: str
    shape: list[int]
    role: str = MODEL


def value_findings(nonfinite: list[NonFinite], zero: list[AllZero]) -> list[Finding]:
    """NaN/Inf in model weights or optimizer state: corrupt. NaN/Inf in bookkeeping
    values: info. An all-zero matrix of model weights or optimizer state: suspicious
    (bookkeeping values never reach `zero`: they are single numbers)."""
    findings: list[Finding] = []
    broken = [v for v in nonfinite if v.role != BOOKKEEPING]
    kept = [v for v in nonfinite if v.role == BOOKKEEPING]
    if broken:
        parts = [_describe(v, with_role=True) for v in broken]
        findings.append(
            _finding(
                "corrupt",
                "nan_or_inf",
                f"{plural(len(parts), 'tensor holds', 'tensors hold')} NaN or Inf values: "
                + named_list(parts),
                [v.name for v in broken],
            )
        )
    if kept:
        parts = [_describe(v, with_role=False) for v in kept]
        findings.append(
            _finding(
                "info",
                "bookkeeping_not_finite",
                f"{plural(len(parts), 'bookkeeping value is', 'bookkeeping values are')} "
                "NaN or Inf, as trainers and callbacks keep them (a best or k-th score "
                "starts at inf), not model weights or optimizer state: " + named_list(parts),
                [v.name for v in kept],
            )
        )
    if zero:
        parts = [f"{z.name} ({'×'.join(map(str, z.shape))}, {ROLE_WORDS[z.role]})" for z in zero]
        findings.append(
            _finding(
                "suspicious",
                "all_zero",
                f"{plural(len(parts), 'weight tensor is', 'weight tensors are')} entirely "
                "zero: "
                + named_list(parts)
                + " (zero vectors such as biases are not counted: they often start at zero)",
                [z.name for z in zero],
            )
        )
    return findings


def _finding(severity: str, code: str, message: str, tensors: list[str]) -> Finding:
    return {"severity": severity, "code": code, "message": message, "tensors": tensors}


def _describe(value: NonFinite, *, with_role: bool) -> str:
    counts = [f"{value.nan} NaN" if value.nan else "", f"{value.inf} Inf" if value.inf else ""]
    words = [c for c in counts if c] + ([ROLE_WORDS[value.role]] if with_role else [])
    return f"{value.name} ({', '.join(words)})"


def plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def named_list(parts: list[str]) -> str:
    shown = ", ".join(parts[:MESSAGE_NAMES])
    if len(parts) > MESSAGE_NAMES:
        shown += f" and {len(parts) - MESSAGE_NAMES} more"
    return shown
