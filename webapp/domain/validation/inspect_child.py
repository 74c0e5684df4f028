"""The load check of one checkpoint, run in a child process (see inspector.py).

Reads one request as JSON on stdin: {"base": dir, "files": [relative paths],
"single_file": bool, "format_hint": str}; writes one JSON object on stdout (the shape is
documented in inspector.inspect_checkpoint). Exits with EXIT_OUT_OF_MEMORY when it runs
out of memory, so that the parent can say so. With `--serve` it is the warm helper
instead: torch imported once, one forked child per request (see serve()).

This module imports torch but never Django, and never unpickles anything with arbitrary
globals: torch files go through torch's weights_only unpickler, DCP metadata through a
restricted unpickler that turns DCP's own classes into inert stand-ins. Any other global
is named in an `unsafe_pickle` finding and never imported, let alone called.

Per file: torch files (.pt .pth .bin .ckpt, or zip / legacy torch magic) get their zip
directory checked, then torch.load(weights_only=True, mmap=True); safetensors files get
their header validated against the format and the file length, then are mapped; DCP
directories get their .metadata read and every shard it names checked for presence and
length; HF Trainer indexes and trainer_state.json are parsed and every indexed shard
must be present. Every tensor read is counted and scanned for NaN, Inf and all-zero, and
what a finding means depends on where the tensor lives (tensor_places).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import json
import math
import mmap
import os
import pickle
import pickletools
import re
import struct
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import torch

from webapp.domain.validation.checkpoint_walk import walk
from webapp.domain.validation.content_findings import AllZero, NonFinite, value_findings
from webapp.domain.validation.content_findings import plural as _plural
from webapp.domain.validation.pickle_policy import numpy_data_objects, split_globals
from webapp.domain.validation.tensor_places import BOOKKEEPING, MODEL, dcp_roles, role_of

# Must match inspector.EXIT_OUT_OF_MEMORY (a test checks that they agree).
EXIT_OUT_OF_MEMORY = 3

TORCH_SUFFIXES = (".pt", ".pth", ".ckpt")
# `.bin` is any binary (DeepSpeed, custom formats); only these names promise torch.save.
TORCH_BIN_NAMES = ("pytorch_model", "training_args")
ZIP_MAGIC = b"PK\x03\x04"
# A legacy (pre-1.6) torch.save file starts with the pickled magic number 0x1950a86a20f9469cfc6c.
LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
SAFETENSORS_HEADER_LIMIT = 100_000_000  # the safetensors library refuses larger headers
CHUNK_ELEMENTS = 1 << 24  # for dtypes scanned through a float32 copy, a bounded one
# What a job may write as its format hint, and the format name it means.
FORMAT_ALIASES = {
    "torch": "torch",
    "pytorch": "torch",
    "lightning": "lightning",
    "pytorch-lightning": "lightning",
    "safetensors": "safetensors",
    "dcp": "dcp",
    "torch.distributed.checkpoint": "dcp",
    "hf-trainer": "hf-trainer",
    "hf": "hf-trainer",
    "huggingface": "hf-trainer",
    "transformers": "hf-trainer",
}


# --------------------------------------------------------------------------- report


@dataclass
class Report:
    """What the check found, accumulated over the files of one checkpoint."""

    formats: set[str] = field(default_factory=set)
    tensors: int = 0
    parameters: int = 0
    dtypes: Counter = field(default_factory=Counter)
    keys: dict[str, list] = field(default_factory=dict)
    findings: list[dict] = field(default_factory=list)
    nonfinite: list[NonFinite] = field(default_factory=list)
    zero: list[AllZero] = field(default_factory=list)
    load_s: float = 0.0
    scan_s: float = 0.0

    def add(
        self, severity: str, code: str, message: str, file: str = "", tensors: list | None = None
    ) -> None:
        finding = {"severity": severity, "code": code, "message": message}
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

    def as_dict(self, format_hint: str) -> dict:
        self._summarise_content()
        detected = self._format()
        hinted = FORMAT_ALIASES.get(format_hint.strip().lower(), "")
        if hinted and detected != "unknown" and hinted != detected:
            self.add(
                "info",
                "format_differs",
                f"the job reported the format {format_hint!r}, but the files are {detected}",
            )
        return {
            "format": detected,
            "tensors": self.tensors,
            "parameters": self.parameters,
            "dtypes": dict(sorted(self.dtypes.items())),
            "keys": self.keys,
            "findings": self.findings,
            "timings": {"load_s": round(self.load_s, 6), "scan_s": round(self.scan_s, 6)},
        }

    def _format(self) -> str:
        for name in ("dcp", "hf-trainer", "lightning", "torch", "safetensors"):
            if name in self.formats:
                return name
        return "unknown"

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


# --------------------------------------------------------------------------- torch files


class Placeholder:
    """Stands in for a global that weights_only refuses, so that the tensors around it can
    still be scanned. It is our own inert class: whatever the pickle asks of it (call,
    construct, set state) does nothing, and the real global is never imported."""

    global_name = ""

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class DictPlaceholder(Placeholder):
    """For dict subclasses (Lightning's AttributeDict): torch lets a pickle add items only
    to a plain dict, so constructing this yields an empty plain dict."""

    def __new__(cls, *args, **kwargs):
        return {}


def placeholders_for(names: list[str], kind: type[Placeholder]) -> list[tuple[type, str]]:
    return [(type(kind.__name__, (kind,), {"global_name": n}), n) for n in names]


def is_torch_candidate(path: str, head: bytes) -> tuple[bool, bool]:
    """(looks like a torch file, claimed to be one by its name)."""
    name = PurePosixPath(path).name
    claimed = path.endswith(TORCH_SUFFIXES) or (
        name.endswith(".bin") and name.startswith(TORCH_BIN_NAMES)
    )
    looks = head.startswith(ZIP_MAGIC) or head.startswith(LEGACY_TORCH_MAGIC)
    return looks or claimed, claimed


def check_zip_directory(full: str, rel: str, size: int, report: Report) -> bool:
    """The zip central directory is at the end of the file: a file cut short has none.
    Returns whether the zip structure is whole and holds a torch pickle."""
    try:
        with zipfile.ZipFile(full) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        report.add(
            "corrupt",
            "truncated_zip",
            f"{rel} is truncated or not a torch file: no zip central directory (what torch "
            f"reports as 'PytorchStreamReader failed finding central directory'; {exc})",
            rel,
        )
        return False
    for info in infos:
        end = info.header_offset + 30 + len(info.filename.encode()) + info.compress_size
        if end > size:
            report.add(
                "corrupt",
                "truncated_zip",
                f"{rel} is truncated: its zip directory places {info.filename} at bytes "
                f"up to {end}, past the end of the {size}-byte file",
                rel,
            )
            return False
    if any(info.filename.endswith("constants.pkl") for info in infos):
        # torch.load would hand it to torch.jit.load, which weights_only forbids.
        report.add(
            "suspicious",
            "torchscript_archive",
            f"{rel} is a TorchScript archive (torch.jit.save), not a checkpoint that "
            "torch.load can read safely; its tensors were not inspected",
            rel,
        )
        return False
    if not any(info.filename.endswith("data.pkl") for info in infos):
        report.add(
            "corrupt",
            "not_a_torch_file",
            f"{rel} is a zip file without the data.pkl record that torch.save writes",
            rel,
        )
        return False
    return True


def unsafe_globals(full: str, is_zip: bool, error: Exception) -> list[str]:
    """The globals weights_only refuses, read statically from the pickle (never executed):
    by torch's own disassembler, else by ours (torch's stops at opcodes it does not know,
    such as protocol 4's STACK_GLOBAL), else the one torch's error names."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(full)
    except Exception as exc:  # any other failure here only loses the names
        raise_if_out_of_memory(exc)
        names = []
    if not names and is_zip:
        allowed = _torch_allowed_globals()
        names = [n for n in pickle_globals(_torch_pickle_bytes(full)) if n not in allowed]
    if not names:
        names = re.findall(r"GLOBAL ([\w.]+)", str(error))[:1]
    return sorted(set(names))


def _torch_allowed_globals() -> set[str]:
    """What weights_only allows by default (a private torch API: empty if it moves)."""
    try:
        return set(torch._weights_only_unpickler._get_allowed_globals())
    except Exception:  # an unknown torch: every global counts as unsafe
        return set()


def _torch_pickle_bytes(full: str) -> bytes:
    try:
        with zipfile.ZipFile(full) as archive:
            name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            return archive.read(name)
    except Exception as exc:
        raise_if_out_of_memory(exc)
        return b""


def weights_only_reason(error: Exception) -> str:
    """The useful line of torch's long weights_only message."""
    text = str(error)
    _, found, after = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in after.splitlines() if line.strip()] if found else []
    return lines[0][:300] if lines else _first_line(error)


def load_torch(full: str, is_zip: bool, safe_globals: list | None = None):
    kwargs = {"weights_only": True, "map_location": "cpu", "mmap": is_zip}
    if safe_globals is None:
        return torch.load(full, **kwargs)
    with torch.serialization.safe_globals(safe_globals):
        return torch.load(full, **kwargs)


def inspect_torch_file(full: str, rel: str, size: int, head: bytes, report: Report) -> None:
    report.formats.add("torch")
    is_zip = head.startswith(ZIP_MAGIC)
    if is_zip:
        if not check_zip_directory(full, rel, size, report):
            return
    elif not head.startswith(LEGACY_TORCH_MAGIC):
        report.add(
            "corrupt",
            "not_a_torch_file",
            f"{rel} is not a torch file: it starts with neither the zip signature nor the "
            "legacy torch.save signature",
            rel,
        )
        return
    started = time.perf_counter()
    try:
        obj = load_torch(full, is_zip)
    except pickle.UnpicklingError as exc:
        report.load_s += time.perf_counter() - started
        names = unsafe_globals(full, is_zip, exc)
        if not names:  # refused for its bytes, not for its globals: a damaged pickle
            report.add(
                "corrupt",
                "load_failed",
                f"{rel} could not be loaded: its pickle is damaged ({weights_only_reason(exc)})",
                rel,
            )
            return
        obj = load_around_unsafe_globals(full, rel, is_zip, names, report)
        if obj is None:
            return
    except Exception as exc:  # torch raises RuntimeError, EOFError, ...
        raise_if_out_of_memory(exc)
        report.load_s += time.perf_counter() - started
        report.add("corrupt", "load_failed", f"{rel} could not be loaded: {_first_line(exc)}", rel)
        return
    else:
        report.load_s += time.perf_counter() - started
    if is_lightning(obj):
        report.formats.add("lightning")
    scanner = Scanner(report)
    for found in walk(obj, rel):
        scanner.tensor(found.name, found.tensor, found.role)


def load_around_unsafe_globals(full: str, rel: str, is_zip: bool, names: list[str], report):
    """weights_only refused the file for the globals `names`. Load it once more as
    pickle_policy says: numpy's data globals as the real numpy objects (arrays are data),
    every other global replaced by an inert Placeholder, so that the tensors are still
    scanned; report the replaced ones (info for library classes, suspicious for the
    rest). Returns the loaded object, or None when even that is refused."""
    numpy_data, library, other = split_globals(names)
    real = numpy_data_objects(numpy_data)
    stubbed = library + other
    started = time.perf_counter()
    obj = None
    for kind in (Placeholder, DictPlaceholder):
        try:
            obj = load_torch(full, is_zip, real + placeholders_for(stubbed, kind))
            break
        except Exception as exc:  # the finding below says it was not scanned
            raise_if_out_of_memory(exc)
    report.load_s += time.perf_counter() - started
    if obj is not None and not stubbed:
        return obj  # numpy arrays only: plain data
    outcome = (
        "its tensors were scanned with those objects left out"
        if obj is not None
        else "its tensors could not be scanned"
    )
    report.add(
        "info" if obj is not None and not other else "suspicious",
        "unsafe_pickle",
        f"{rel} is not loadable safely: it needs the globals {', '.join(stubbed or names)}, "
        f"which Lifeboat never executes ({outcome})",
        rel,
    )
    return obj


def is_lightning(obj) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("state_dict"), dict)
        and ("global_step" in obj or "epoch" in obj)
    )


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


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
    entries = [_header_entry(name, spec, data_size) for name, spec in header.items()]
    entries = [e for e in entries if e is not None]
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
    previous = None
    for entry in entries:
        if entry.begin < position:
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
    report.formats.add("safetensors")
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
        _close_quietly(mapped)


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


def _close_quietly(mapped: mmap.mmap | None) -> None:
    if mapped is None:
        return
    # A tensor that still views the mapping keeps it open; it goes when that tensor does.
    with contextlib.suppress(BufferError):
        mapped.close()


# --------------------------------------------------------------------------- DCP


class UnsafeGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.global_name = f"{module}.{name}"


SAFE_BUILTINS = frozenset(
    {"set", "frozenset", "slice", "complex", "bytearray", "bytes", "int", "float", "str"}
    | {"bool", "tuple", "list", "dict", "range"}
)
SAFE_PATHS = frozenset({"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"})
DCP_PACKAGE = "torch.distributed.checkpoint"


class DcpRecord:
    """Stands in for a class of torch.distributed.checkpoint in `.metadata` (Metadata,
    TensorStorageMetadata, MetadataIndex, _StorageInfo, ...): it keeps the pickled state
    as attributes and runs no DCP code. DCP is not even imported, which also saves the
    second that importing it takes."""

    dcp_name = ""

    def __init__(self, *args):  # a call, as for the _MEM_FORMAT_ENCODING enum
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}  # (__dict__, __slots__) state
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state  # TensorProperties pickles a tuple

    @property
    def dtype(self) -> torch.dtype | None:
        """A TensorProperties' dtype, whichever way it was pickled."""
        found = self.__dict__.get("dtype")
        if isinstance(found, torch.dtype):
            return found
        state = self.__dict__.get("state")
        values = state if isinstance(state, tuple) else ()
        return next((v for v in values if isinstance(v, torch.dtype)), None)


_dcp_records: dict[str, type[DcpRecord]] = {}


def dcp_record(module: str, name: str) -> type[DcpRecord]:
    full = f"{module}.{name}"
    if full not in _dcp_records:
        _dcp_records[full] = type(name, (DcpRecord,), {"dcp_name": full})
    return _dcp_records[full]


class DcpMetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP `.metadata` allowing only what DCP writes there: its own classes (as
    inert DcpRecord stand-ins), torch.Size, dtypes, layouts and memory formats,
    OrderedDict, a few plain builtins and paths (constructing a path touches nothing).
    Anything else raises UnsafeGlobal before it is imported."""

    def find_class(self, module: str, name: str):
        if not name.isidentifier():  # "Path.touch" and the like: attribute paths, never
            raise UnsafeGlobal(module, name)
        if (module, name) == ("collections", "OrderedDict"):
            return super().find_class(module, name)
        if module == "builtins" and name in SAFE_BUILTINS:
            return super().find_class(module, name)
        if module == "pathlib" and name in SAFE_PATHS:
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if name == "Size" or isinstance(
                value, torch.dtype | torch.layout | torch.memory_format
            ):
                return value
        if (module, name) == ("torch.serialization", "_get_layout"):
            return torch.serialization._get_layout  # maps a layout's name to the layout
        if module == DCP_PACKAGE or module.startswith(DCP_PACKAGE + "."):
            return dcp_record(module, name)
        raise UnsafeGlobal(module, name)


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
            elif opcode.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg)] = pushed[-1] if pushed else None
            elif opcode.name in ("GET", "BINGET", "LONG_BINGET"):
                pushed.append(memo.get(int(arg)))
            else:
                pushed.append(arg if isinstance(arg, str) else None)
    except Exception as exc:  # a broken pickle: keep what was read
        raise_if_out_of_memory(exc)
    return sorted(set(names))


def unsafe_metadata_globals(data: bytes) -> list[str]:
    unsafe = []
    probe = DcpMetadataUnpickler(io.BytesIO(b""))
    for full_name in pickle_globals(data):
        module, _, name = full_name.rpartition(".")
        try:
            probe.find_class(module, name)
        except pickle.UnpicklingError:
            unsafe.append(full_name)
    return unsafe


def inspect_dcp(base: str, root: str, files: set[str], report: Report) -> None:
    """One DCP checkpoint: `root` is the directory (relative to base) holding .metadata."""
    report.formats.add("dcp")
    meta_rel = _join(root, ".metadata")
    started = time.perf_counter()
    metadata = read_dcp_metadata(os.path.join(base, meta_rel), meta_rel, report)
    report.load_s += time.perf_counter() - started
    if metadata is None:
        return
    shards_ok = check_dcp_shards(base, root, metadata, files, report)
    count_dcp_tensors(metadata, meta_rel, report)
    if shards_ok:
        scan_dcp_tensors(base, root, metadata, meta_rel, report)


def read_dcp_metadata(full: str, rel: str, report: Report):
    with open(full, "rb") as f:
        data = f.read()
    if not data:
        report.add("corrupt", "empty_file", f"{rel} is empty (0 bytes)", rel)
        return None
    try:
        metadata = DcpMetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeGlobal as exc:
        names = unsafe_metadata_globals(data) or [exc.global_name]
        report.add(
            "suspicious",
            "unsafe_pickle",
            f"{rel} is not loadable safely: it needs the globals {', '.join(names)}, which "
            "Lifeboat never executes",
            rel,
        )
        return None
    except Exception as exc:  # a truncated or garbled pickle
        raise_if_out_of_memory(exc)
        report.add("corrupt", "bad_dcp_metadata", f"{rel} cannot be read: {_first_line(exc)}", rel)
        return None
    if not (
        isinstance(getattr(metadata, "state_dict_metadata", None), dict)
        and isinstance(getattr(metadata, "storage_data", None), dict)
    ):
        report.add("corrupt", "bad_dcp_metadata", f"{rel} is not DCP metadata", rel)
        return None
    return metadata


def check_dcp_shards(base: str, root: str, metadata, files: set[str], report: Report) -> bool:
    """Every file named in storage_data exists and reaches the end of its last item."""
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not _stays_inside(rel):
            report.add(
                "corrupt",
                "bad_dcp_metadata",
                f"{_join(root, '.metadata')} names a shard outside the checkpoint: {rel!r}",
            )
            return False
        end = int(getattr(info, "offset", 0) or 0) + int(getattr(info, "length", 0) or 0)
        needed[rel] = max(needed.get(rel, 0), end)
    whole = True
    for rel, end in sorted(needed.items()):
        path = _join(root, rel)
        full = os.path.join(base, path)
        if path not in files or not os.path.isfile(full):
            report.add(
                "corrupt",
                "missing_shard",
                f"the DCP metadata names {path}, which is missing",
                path,
            )
            whole = False
        elif (size := os.path.getsize(full)) < end:
            report.add(
                "corrupt",
                "truncated_shard",
                f"{path} is {size} bytes but the DCP metadata needs {end} (truncated?)",
                path,
            )
            whole = False
    return whole


def count_dcp_tensors(metadata, meta_rel: str, report: Report) -> None:
    for fqn, item in metadata.state_dict_metadata.items():
        size = getattr(item, "size", None)
        properties = getattr(item, "properties", None)
        if size is None or properties is None:
            continue  # bytes items: pickled Python objects, not tensors
        dtype = properties.dtype
        report.count(f"{meta_rel}:{fqn}", dtype_name(dtype) if dtype else "unknown", list(size))


def scan_dcp_tensors(base: str, root: str, metadata, meta_rel: str, report: Report) -> None:
    """Scans every tensor chunk, shard by shard; a tensor's NaN/Inf counts add up over its
    chunks. A chunk in the default layout (one torch.save'd tensor) is read in place: its
    pickle is checked for unsafe globals without being run, and its stored bytes are
    viewed through a mapping with the dtype the metadata gives, without copy. Chunks
    that do not look like that go through torch.load(weights_only=True); transformed
    (compressed) ones are left unscanned and counted in an info finding."""
    stats: dict[str, list] = {}  # fqn -> [NaN, Inf, all zero so far]
    skipped = 0
    items = sorted(
        metadata.storage_data.items(),
        key=lambda item: (str(item[1].relative_path), int(item[1].offset)),
    )
    shard = ShardReader(base, root)
    try:
        for index, info in items:
            fqn = getattr(index, "fqn", None)
            item = metadata.state_dict_metadata.get(fqn)
            if getattr(item, "properties", None) is None:
                continue  # a bytes item
            tensor = load_dcp_chunk(shard, index, info, item, report)
            if tensor is None:
                skipped += 1
                continue
            if not scannable(tensor):
                continue
            started = time.perf_counter()
            nan, inf, all_zero = scan_values(tensor)
            del tensor
            report.scan_s += time.perf_counter() - started
            totals = stats.setdefault(fqn, [0, 0, True])
            totals[0] += nan
            totals[1] += inf
            totals[2] = totals[2] and all_zero
    finally:
        shard.close()
    planner = getattr(metadata, "planner_data", None)
    roles = dcp_roles(meta_rel, list(metadata.state_dict_metadata), planner)
    for fqn, (nan, inf, all_zero) in stats.items():
        size = list(metadata.state_dict_metadata[fqn].size)
        role = roles(fqn, math.prod(size))
        if nan or inf:
            report.nonfinite.append(NonFinite(f"{meta_rel}:{fqn}", nan, inf, role))
        if all_zero and role != BOOKKEEPING and len(size) >= 2 and math.prod(size) > 1:
            report.zero.append(AllZero(f"{meta_rel}:{fqn}", size, role))
    if skipped:
        report.add(
            "info",
            "not_scanned",
            f"{_plural(skipped, 'DCP chunk was', 'DCP chunks were')} not scanned for NaN "
            "(transformed, unsafe, or unreadable)",
        )


class ShardReader:
    """One DCP shard open (and mapped) at a time: shards can be many and large, and the
    address space is limited."""

    def __init__(self, base: str, root: str):
        self.base, self.root = base, root
        self.path = ""
        self.fd = -1
        self.mapped: mmap.mmap | None = None

    def open(self, relative_path: str) -> str:
        path = _join(self.root, relative_path)
        if path != self.path:
            self.close()
            self.fd = os.open(os.path.join(self.base, path), os.O_RDONLY)
            self.path = path
        return path

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def view(self, dtype: torch.dtype, offset: int, count: int) -> torch.Tensor:
        if self.mapped is None:
            # ACCESS_COPY: private, so torch gets a writable buffer and the file is safe.
            self.mapped = mmap.mmap(self.fd, 0, access=mmap.ACCESS_COPY)
        return torch.frombuffer(self.mapped, dtype=dtype, count=count, offset=offset)

    def close(self) -> None:
        _close_quietly(self.mapped)
        self.mapped = None
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.path = -1, ""


class FileWindow(io.RawIOBase):
    """Bytes [start, start + length) of an open file, as a seekable file of their own, so
    that zipfile can read the torch.save archive that a DCP chunk is."""

    def __init__(self, fd: int, start: int, length: int):
        super().__init__()
        self.fd, self.start, self.length, self.position = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        origin = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, origin + offset)
        return self.position

    def readinto(self, buffer) -> int:
        wanted = max(0, min(len(buffer), self.length - self.position))
        data = os.pread(self.fd, wanted, self.start + self.position)
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def load_dcp_chunk(shard: ShardReader, index, info, item, report: Report):
    """One chunk of a DCP tensor as a tensor, or None when it cannot be scanned."""
    if getattr(info, "transform_descriptors", None):
        return None
    fqn = index.fqn
    path = shard.open(info.relative_path)
    started = time.perf_counter()
    try:
        if not shard.read(info.offset, 4).startswith(ZIP_MAGIC):
            return None
        in_place = dcp_chunk_in_place(shard, index, info, item, path, report)
        if in_place is not False:
            return in_place
        chunk = shard.read(info.offset, info.length)
        tensor = torch.load(io.BytesIO(chunk), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        report.add(
            "corrupt",
            "load_failed",
            f"{path}: the chunk of {fqn} at byte {info.offset} could not be loaded: "
            f"{weights_only_reason(exc)}",
            path,
        )
        return None
    except Exception as exc:  # torch raises RuntimeError, EOFError, ...
        raise_if_out_of_memory(exc)
        report.add(
            "corrupt",
            "load_failed",
            f"{path}: the chunk of {fqn} at byte {info.offset} could not be loaded: "
            f"{_first_line(exc)}",
            path,
        )
        return None
    finally:
        report.load_s += time.perf_counter() - started
    return tensor if isinstance(tensor, torch.Tensor) else None


def dcp_chunk_in_place(shard: ShardReader, index, info, item, path: str, report: Report):
    """The chunk's elements viewed in place (flat: NaN counts and all-zero do not depend
    on the shape); None when its pickle is unsafe (reported); False when the chunk is not
    laid out as expected, for the caller to torch.load it instead."""
    sizes = _chunk_sizes(item, index)
    dtype = item.properties.dtype
    if sizes is None or not isinstance(dtype, torch.dtype):
        return False
    with zipfile.ZipFile(FileWindow(shard.fd, info.offset, info.length)) as archive:
        records = archive.infolist()
        pickles = [r for r in records if r.filename.endswith("data.pkl")]
        data = [r for r in records if re.search(r"/data/\d+$", r.filename)]
        if len(pickles) != 1 or len(data) != 1 or data[0].compress_type != zipfile.ZIP_STORED:
            return False
        unsafe = sorted(set(pickle_globals(archive.read(pickles[0]))) - _torch_allowed_globals())
    if unsafe:
        report.add(
            "suspicious",
            "unsafe_pickle",
            f"{path}: the chunk of {index.fqn} is not loadable safely: it needs the globals "
            f"{', '.join(unsafe)}, which Lifeboat never executes",
            path,
        )
        return None
    count = math.prod(sizes)
    if data[0].file_size != count * dtype.itemsize or count == 0:
        return False
    header = shard.read(info.offset + data[0].header_offset, 30)
    if not header.startswith(ZIP_MAGIC):
        return False
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    start = info.offset + data[0].header_offset + 30 + name_length + extra_length
    return shard.view(dtype, start, count)


def _chunk_sizes(item, index) -> list[int] | None:
    """The sizes of the chunk that `index` names, from the tensor's metadata."""
    offsets = list(getattr(index, "offset", None) or [])
    chunks = getattr(item, "chunks", None) or []
    for chunk in chunks:
        if list(chunk.offsets) == offsets:
            return list(chunk.sizes)
    return None


def _join(root: str, rel: str) -> str:
    return str(PurePosixPath(root, rel)) if root else rel


def _stays_inside(rel: str) -> bool:
    path = PurePosixPath(rel)
    return not path.is_absolute() and ".." not in path.parts


# --------------------------------------------------------------------------- HF Trainer


def is_hf_index(path: str) -> bool:
    return path.endswith(".index.json")


def inspect_hf_json(base: str, rel: str, files: set[str], report: Report) -> None:
    report.formats.add("hf-trainer")
    try:
        with open(os.path.join(base, rel), encoding="utf-8") as f:
            content = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        report.add("corrupt", "bad_json", f"{rel} is not valid JSON: {_first_line(exc)}", rel)
        return
    if not is_hf_index(rel):
        return
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict):
        report.add("corrupt", "bad_json", f"{rel} has no weight_map object", rel)
        return
    folder = _parent(rel)
    for shard in sorted({str(v) for v in weight_map.values()}):
        path = _join(folder, shard)
        if not _stays_inside(shard):
            report.add("corrupt", "bad_json", f"{rel} names a shard outside the checkpoint", rel)
        elif path not in files or not os.path.isfile(os.path.join(base, path)):
            report.add(
                "corrupt", "missing_shard", f"the index {rel} names {path}, which is missing", path
            )


# --------------------------------------------------------------------------- the checkpoint


def inspect(request: dict) -> dict:
    """The whole check of one checkpoint; never raises for a bad file (only MemoryError)."""
    base = request["base"]
    files = sorted(str(p) for p in request["files"])
    report = Report()
    file_set = set(files)
    dcp_roots = sorted({_parent(p) for p in files if PurePosixPath(p).name == ".metadata"})
    for rel in files:
        try:
            inspect_file(base, rel, file_set, dcp_roots, report)
        except Exception as exc:  # a gap in this checker, not in the file
            raise_if_out_of_memory(exc)
            report.add(
                "error",
                "inspect_failed",
                f"{rel} could not be inspected ({type(exc).__name__}: {_first_line(exc)})",
                rel,
            )
    for root in dcp_roots:
        try:
            inspect_dcp(base, root, file_set, report)
        except Exception as exc:
            raise_if_out_of_memory(exc)
            report.add(
                "error",
                "inspect_failed",
                f"the DCP checkpoint in {root or '.'} could not be inspected "
                f"({type(exc).__name__}: {_first_line(exc)})",
            )
    check_orphan_dcp_shards(files, dcp_roots, report)
    if any(PurePosixPath(p).name == "trainer_state.json" for p in files):
        report.formats.add("hf-trainer")
    return report.as_dict(request.get("format_hint", ""))


def inspect_file(base: str, rel: str, files: set[str], dcp_roots: list[str], report) -> None:
    name = PurePosixPath(rel).name
    if name == ".metadata" or (rel.endswith(".distcp") and _parent(rel) in dcp_roots):
        return  # checked with their DCP checkpoint
    full = os.path.join(base, rel)
    size = os.path.getsize(full)
    if name == "trainer_state.json" or is_hf_index(rel):
        inspect_hf_json(base, rel, files, report)
        return
    with open(full, "rb") as f:
        head = f.read(len(LEGACY_TORCH_MAGIC))
    is_safetensors = rel.endswith(".safetensors")
    is_torch, claimed_torch = is_torch_candidate(rel, head)
    if size == 0:
        if is_safetensors or claimed_torch:
            report.add("corrupt", "empty_file", f"{rel} is empty (0 bytes)", rel)
        return
    if is_safetensors:
        inspect_safetensors_file(full, rel, size, report)
    elif is_torch:
        inspect_torch_file(full, rel, size, head, report)
        # Drop the mapping of this file before the next one: under the address-space limit
        # only one file at a time should be mapped.
        gc.collect()


def check_orphan_dcp_shards(files: list[str], dcp_roots: list[str], report: Report) -> None:
    orphans = sorted(
        {_parent(p) for p in files if p.endswith(".distcp") and _parent(p) not in dcp_roots}
    )
    for folder in orphans:
        report.formats.add("dcp")
        where = folder or "the checkpoint"
        report.add(
            "corrupt",
            "missing_shard",
            f"{where} holds .distcp shards but no .metadata, without which DCP cannot load them",
            _join(folder, ".metadata"),
        )


def _parent(rel: str) -> str:
    parent = str(PurePosixPath(rel).parent)
    return "" if parent == "." else parent


# --------------------------------------------------------------------------- entry point


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        return serve()
    # Everything printed by torch or this code goes to stderr; stdout carries the result.
    result_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        request = json.load(sys.stdin)
        result = inspect(request)
    except MemoryError:
        os._exit(EXIT_OUT_OF_MEMORY)
    with os.fdopen(result_fd, "w", encoding="utf-8") as out:
        json.dump(result, out)
    return 0


# --------------------------------------------------------------------------- warm helper


def serve() -> int:
    """The warm helper (inspector.WarmHelper): torch is imported once, here; each request
    is checked in a child forked for it, under its limits (inspector.serve_forked). This
    process itself never opens a checkpoint."""
    from webapp.domain.validation.inspector import serve_forked

    return serve_forked(inspect, out_of_memory_exit=EXIT_OUT_OF_MEMORY)


if __name__ == "__main__":
    sys.exit(main())
