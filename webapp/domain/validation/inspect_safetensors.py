"""safetensors files in the inspection child: the header validated against the format
and the file's length, then the data mapped (never read into memory) and scanned."""

from __future__ import annotations

import json
import math
import mmap
import struct
import time
from collections import Counter
from dataclasses import dataclass

import torch

from webapp.domain.validation.content_findings import plural as plural
from webapp.domain.validation.inspect_common import (
    SAFETENSORS_HEADER_LIMIT,
    Report,
    Scanner,
    close_quietly,
    dtype_name,
    scannable,
)
from webapp.domain.validation.tensor_places import role_of

# --------------------------------------------------------------------------- safetensors

# name: (bits per element, torch dtype or None when torch cannot scan it)
SAFETENSORS_DTYPES: dict[str, tuple[int, torch.dtype | None]] = {
    "BOOL": (8, torch.bool),
    "U8": (8, torch.uint8),
    "I8": (8, torch.int8),
    "F8_E5M2": (8, getattr(torch, "float8_e5m2", None)),
    "F8_E4M3": (8, getattr(torch, "float8_e4m3fn", None)),
    "F8_E8M0": (8, getattr(torch, "float8_e8m0fnu", None)),
    "I16": (16, torch.int16),
    "U16": (16, getattr(torch, "uint16", None)),
    "F16": (16, torch.float16),
    "BF16": (16, torch.bfloat16),
    "I32": (32, torch.int32),
    "U32": (32, getattr(torch, "uint32", None)),
    "F32": (32, torch.float32),
    "F64": (64, torch.float64),
    "I64": (64, torch.int64),
    "U64": (64, getattr(torch, "uint64", None)),
    "C64": (64, torch.complex64),
    "F4": (4, None),
    "F6_E2M3": (6, None),
    "F6_E3M2": (6, None),
}


class HeaderError(ValueError):
    """A safetensors header that breaks the format; the message says how."""


@dataclass
class SafetensorsEntry:
    name: str
    dtype: str
    shape: list[int]
    begin: int
    end: int


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict:
    result = dict(pairs)
    if len(result) < len(pairs):
        twice = next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise HeaderError(f"the header names {twice!r} twice")
    return result


def read_safetensors_header(full: str, size: int) -> tuple[int, list[SafetensorsEntry]]:
    """Validates the header against the format and the file's length. Returns where the
    data area starts and the entries sorted by offset; raises HeaderError."""
    if size < 8:
        raise HeaderError(f"the file is {size} bytes, too short for the 8-byte header length")
    with open(full, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > size - 8:
            raise HeaderError(
                f"the header length is {length} bytes but the file has only {size - 8} "
                "bytes after it (truncated?)"
            )
        if length > SAFETENSORS_HEADER_LIMIT:
            raise HeaderError(f"the header length {length} exceeds the 100 MB the format allows")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except UnicodeDecodeError as exc:
        raise HeaderError(f"the header is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise HeaderError(f"the header is not valid JSON ({exc.msg} at byte {exc.pos})") from exc
    if not isinstance(header, dict):
        raise HeaderError("the header is JSON but not an object")
    data_size = size - 8 - length
    headed = [_header_entry(name, spec, data_size) for name, spec in header.items()]
    entries = [e for e in headed if e is not None]
    entries.sort(key=lambda e: (e.begin, e.end))
    _check_layout(entries, data_size)
    return 8 + length, entries


def _header_entry(name: str, spec, data_size: int) -> SafetensorsEntry | None:
    if name == "__metadata__":
        if not isinstance(spec, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in spec.items()
        ):
            raise HeaderError("__metadata__ must map strings to strings")
        return None
    if not isinstance(spec, dict):
        raise HeaderError(f"the entry for {name} is not an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPES:
        raise HeaderError(f"{name} has an unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise HeaderError(f"{name} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise HeaderError(f"{name} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    bits = math.prod(shape) * SAFETENSORS_DTYPES[dtype][0]
    if bits % 8 or end - begin != bits // 8:
        raise HeaderError(
            f"{name} spans {end - begin} bytes but its shape {shape} of {dtype} needs "
            f"{bits / 8:g} bytes"
        )
    if end > data_size:
        raise HeaderError(
            f"{name} ends at byte {end} of the data area, which has only {data_size} bytes "
            "(truncated?)"
        )
    return SafetensorsEntry(name, dtype, shape, begin, end)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_layout(entries: list[SafetensorsEntry], data_size: int) -> None:
    """Tensors must tile the data area exactly: no overlap, no gap, nothing after."""
    position = 0
    previous: SafetensorsEntry | None = None
    for entry in entries:
        if entry.begin < position:
            assert previous is not None  # position > 0: an entry came before
            raise HeaderError(
                f"{entry.name} (bytes {entry.begin}-{entry.end}) overlaps {previous.name} "
                f"(bytes {previous.begin}-{previous.end})"
            )
        if entry.begin > position:
            raise HeaderError(
                f"bytes {position}-{entry.begin} of the data area belong to no tensor"
            )
        position, previous = entry.end, entry
    if position != data_size:
        raise HeaderError(
            f"the data area has {data_size} bytes but its tensors cover only {position}"
        )


def inspect_safetensors_file(full: str, rel: str, size: int, report: Report) -> None:
    started = time.perf_counter()
    try:
        data_start, entries = read_safetensors_header(full, size)
    except HeaderError as exc:
        report.load_s += time.perf_counter() - started
        report.add(
            "corrupt",
            "bad_safetensors_header",
            f"{rel} has a broken safetensors header: {exc}",
            rel,
        )
        return
    scanner = Scanner(report)
    with open(full, "rb") as f:
        # ACCESS_COPY: a private mapping, so torch.frombuffer gets a writable buffer
        # (no warning) while nothing can ever be written back to the checkpoint.
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > 0 else None
    report.load_s += time.perf_counter() - started
    try:
        for entry in entries:
            _scan_safetensors_entry(entry, mapped, data_start, rel, scanner)
    finally:
        close_quietly(mapped)


def _scan_safetensors_entry(entry, mapped, data_start: int, rel: str, scanner: Scanner) -> None:
    name = f"{rel}:{entry.name}"
    torch_dtype = SAFETENSORS_DTYPES[entry.dtype][1]
    scanner.report.count(
        name, dtype_name(torch_dtype) if torch_dtype else entry.dtype.lower(), entry.shape
    )
    if torch_dtype is None or entry.end == entry.begin:
        return
    tensor = torch.frombuffer(
        mapped, dtype=torch_dtype, count=math.prod(entry.shape), offset=data_start + entry.begin
    ).view(entry.shape)
    if scannable(tensor):
        scanner.values(name, tensor, role_of(rel, (entry.name,), tensor.numel()))
    del tensor
