"""What every per-format inspector shares: the Report of one checkpoint's check, the NaN/Inf
and all-zero scan of a tensor, the out-of-memory rule and path helpers. Runs in the
inspection child (inspect_child.py): torch, never Django."""

from __future__ import annotations

import contextlib
import errno
import math
import mmap
import pickletools
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import cast

import torch

from webapp.domain.child_payloads import Finding, InspectResult, InspectValues
from webapp.domain.validation import torch_files
from webapp.domain.validation.content_findings import AllZero, NonFinite, value_findings
from webapp.domain.validation.content_findings import plural as plural
from webapp.domain.validation.tensor_places import BOOKKEEPING, MODEL

# Must match inspector.EXIT_OUT_OF_MEMORY (a test checks that they agree).
EXIT_OUT_OF_MEMORY = 3

# The torch-file rule is webapp/domain/validation/torch_files.py's, for the loader and here alike.
TORCH_SUFFIXES = torch_files.SUFFIXES
TORCH_BIN_NAMES = torch_files.BIN_NAMES
ZIP_MAGIC = torch_files.ZIP_MAGIC
LEGACY_TORCH_MAGIC = torch_files.LEGACY_MAGIC
SAFETENSORS_HEADER_LIMIT = 100_000_000  # the safetensors library refuses larger headers
CHUNK_ELEMENTS = 1 << 24  # for dtypes scanned through a float32 copy, a bounded one


# --------------------------------------------------------------------------- report


@dataclass
class Report:
    """What the check found, accumulated over the files of one checkpoint."""

    formats: set[str] = field(default_factory=set)
    tensors: int = 0
    parameters: int = 0
    dtypes: Counter = field(default_factory=Counter)
    keys: dict[str, list] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    nonfinite: list[NonFinite] = field(default_factory=list)
    zero: list[AllZero] = field(default_factory=list)
    # Tensors with a value that is not zero, where a tensor's chunks may be scanned by
    # several parts (DCP): another part's AllZero of the same tensor does not hold.
    nonzero: list[str] = field(default_factory=list)
    # inspect_deepspeed: model states file -> what it says about its folder's ranks
    deepspeed: dict[str, dict] = field(default_factory=dict)
    load_s: float = 0.0
    scan_s: float = 0.0

    def add(
        self, severity: str, code: str, message: str, file: str = "", tensors: list | None = None
    ) -> None:
        finding: Finding = {"severity": severity, "code": code, "message": message}
        if file:
            finding["file"] = file
        if tensors:
            finding["tensors"] = tensors
        self.findings.append(finding)

    def count(self, name: str, dtype: str, shape: list[int]) -> None:
        self.tensors += 1
        self.parameters += math.prod(shape)
        self.dtypes[dtype] += 1
        self.keys[name] = [dtype, shape]

    def as_dict(self, detected: str, raw_values: bool = False) -> InspectResult:
        """The result, for a checkpoint whose format is `detected` (the strongest of
        `formats`: webapp/domain/formats). With `raw_values` (one part of a checkpoint
        checked in parts) the NaN/Inf and all-zero tensors are listed under "values" for
        the parent to summarise over all parts (inspect_parts.merge_parts), not
        summarised here."""
        values: InspectValues | None
        if raw_values:
            values = {
                "nonfinite": [asdict(v) for v in self.nonfinite],
                "zero": [asdict(z) for z in self.zero],
                "nonzero": self.nonzero,
            }
        else:
            self._summarise_content()
            values = None
        result: InspectResult = {
            "format": detected,
            "tensors": self.tensors,
            "parameters": self.parameters,
            "dtypes": dict(sorted(self.dtypes.items())),
            "keys": self.keys,
            "findings": self.findings,
            "timings": {"load_s": round(self.load_s, 6), "scan_s": round(self.scan_s, 6)},
        }
        if values is not None:
            result["values"] = values
        return result

    def _summarise_content(self) -> None:
        """NaN/Inf and all-zero findings, by where each value lives (content_findings)."""
        self.findings.extend(value_findings(self.nonfinite, self.zero))


# --------------------------------------------------------------------------- scanning


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _float_views(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The tensor as views that aminmax/isnan/isinf accept, without copying when the
    dtype allows it: complex numbers as their real and imaginary parts, float8 and other
    exotic dtypes as bounded float32 copies."""
    if t.is_complex():
        yield torch.view_as_real(t)
    elif t.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        yield t
    else:
        flat = t.reshape(-1)
        for start in range(0, flat.numel(), CHUNK_ELEMENTS):
            yield flat[start : start + CHUNK_ELEMENTS].float()


def scan_values(t: torch.Tensor) -> tuple[int, int, bool]:
    """NaN count, Inf count, and whether every element is zero, for a floating tensor.

    One vectorised pass (aminmax) settles the common case: a finite min and max mean no
    NaN or Inf, and min == max == 0 means all zero. Only a tensor that fails is counted
    element by element."""
    nan = inf = 0
    all_zero = True
    low: torch.Tensor | float  # a tensor from aminmax, then its float
    high: torch.Tensor | float
    for view in _float_views(t):
        low, high = torch.aminmax(view)
        low, high = float(low), float(high)
        if math.isfinite(low) and math.isfinite(high):
            all_zero = all_zero and low == 0.0 and high == 0.0
            continue
        nan += int(torch.isnan(view).sum())
        inf += int(torch.isinf(view).sum())
        all_zero = False
    return nan, inf, all_zero


def scannable(t: torch.Tensor) -> bool:
    return (
        t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.is_quantized
        and t.numel() > 0
        and (t.is_floating_point() or t.is_complex())
    )


class Scanner:
    """Counts and scans tensors into a Report; a storage shared by several names (tied
    weights) is scanned once."""

    def __init__(self, report: Report):
        self.report = report
        self._seen: dict[tuple, tuple[int, int, bool]] = {}

    def tensor(self, name: str, t: torch.Tensor, role: str = MODEL) -> None:
        shape = list(t.shape)
        self.report.count(name, dtype_name(t.dtype), shape)
        if scannable(t):
            self.values(name, t, role)

    def values(self, name: str, t: torch.Tensor, role: str = MODEL) -> None:
        """Scans `t` and records NaN/Inf with the value's role (tensor_places); an all-zero
        matrix (two or more dimensions) only for model weights and optimizer state."""
        started = time.perf_counter()
        identity = (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            t.stride(),
            t.dtype,
        )
        if identity not in self._seen:
            self._seen[identity] = scan_values(t)
        nan, inf, all_zero = self._seen[identity]
        if nan or inf:
            self.report.nonfinite.append(NonFinite(name, nan, inf, role))
        if all_zero and role != BOOKKEEPING and t.dim() >= 2 and t.numel() > 1:
            self.report.zero.append(AllZero(name, list(t.shape), role))
        self.report.scan_s += time.perf_counter() - started


# How an allocation failure reads when it arrives as another exception: torch's
# RuntimeError from its allocator or from mmap, OSError ENOMEM from mmap.mmap.
MEMORY_SIGNS = ("can't allocate memory", "Cannot allocate memory", "bad_alloc", "out of memory")


def raise_if_out_of_memory(exc: BaseException) -> None:
    """An allocation that failed under the memory limit says nothing about the file: it
    must end the check as out of memory, never become a "corrupt" finding."""
    if isinstance(exc, MemoryError):
        raise exc
    if (isinstance(exc, OSError) and exc.errno == errno.ENOMEM) or any(
        sign in str(exc) for sign in MEMORY_SIGNS
    ):
        raise MemoryError(str(exc)) from exc


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def close_quietly(mapped: mmap.mmap | None) -> None:
    if mapped is None:
        return
    # A tensor that still views the mapping keeps it open; it goes when that tensor does.
    with contextlib.suppress(BufferError):
        mapped.close()


def join(root: str, rel: str) -> str:
    return str(PurePosixPath(root, rel)) if root else rel


def stays_inside(rel: str) -> bool:
    path = PurePosixPath(rel)
    return not path.is_absolute() and ".." not in path.parts


def parent_dir(rel: str) -> str:
    parent = str(PurePosixPath(rel).parent)
    return "" if parent == "." else parent


def pickle_globals(data: bytes) -> list[str]:
    """Every global a pickle names, read statically (pickletools never executes it).

    Protocol 4 names a global by pushing two strings, often fetched back from the memo,
    then STACK_GLOBAL; so the strings pushed and memoised are followed along the way."""
    names: list[str] = []
    pushed: list[str | None] = []  # what each opcode pushed: a string, or None for other values
    memo: dict[int, str | None] = {}
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
                pushed.append(None)
            elif opcode.name == "STACK_GLOBAL":
                module, name = (pushed[-2], pushed[-1]) if len(pushed) >= 2 else (None, None)
                if isinstance(module, str) and isinstance(name, str):
                    names.append(f"{module}.{name}")
                pushed.append(None)
            elif opcode.name == "MEMOIZE":
                memo[len(memo)] = pushed[-1] if pushed else None
            # The memo opcodes' argument is an int (pickletools reads it as one).
            elif opcode.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(cast(int, arg))] = pushed[-1] if pushed else None
            elif opcode.name in ("GET", "BINGET", "LONG_BINGET"):
                pushed.append(memo.get(int(cast(int, arg))))
            else:
                pushed.append(arg if isinstance(arg, str) else None)
    except Exception as exc:  # a broken pickle: keep what was read
        raise_if_out_of_memory(exc)
    return sorted(set(names))
