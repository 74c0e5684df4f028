"""torch.save files in the inspection child: the zip directory checked, then
torch.load(weights_only=True, mmap=True); a global weights_only refuses is named, stood in
for by an inert placeholder, and never imported."""

from __future__ import annotations

import pickle
import re
import time
import zipfile
from collections.abc import Callable
from typing import Any

import torch

from webapp.domain.validation.checkpoint_walk import walk
from webapp.domain.validation.content_findings import plural as plural
from webapp.domain.validation.inspect_common import (
    LEGACY_TORCH_MAGIC,
    ZIP_MAGIC,
    Report,
    Scanner,
    first_line,
    pickle_globals,
    raise_if_out_of_memory,
)
from webapp.domain.validation.pickle_policy import numpy_data_objects, split_globals

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
        allowed = torch_allowed_globals()
        names = [n for n in pickle_globals(_torch_pickle_bytes(full)) if n not in allowed]
    if not names:
        names = re.findall(r"GLOBAL ([\w.]+)", str(error))[:1]
    return sorted(set(names))


def torch_allowed_globals() -> set[str]:
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
    return lines[0][:300] if lines else first_line(error)


def load_torch(full: str, is_zip: bool, safe_globals: list | None = None):
    kwargs: dict[str, Any] = {"weights_only": True, "map_location": "cpu", "mmap": is_zip}
    if safe_globals is None:
        return torch.load(full, **kwargs)
    with torch.serialization.safe_globals(safe_globals):
        return torch.load(full, **kwargs)


def inspect_torch_file(
    full: str, rel: str, size: int, head: bytes, report: Report, *, observe: Callable
) -> None:
    """Checks one torch.save file; `observe(rel, obj)` is shown the object it loaded to
    (webapp/domain/formats: Lightning and DeepSpeed are told apart by its contents)."""
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
        report.add("corrupt", "load_failed", f"{rel} could not be loaded: {first_line(exc)}", rel)
        return
    else:
        report.load_s += time.perf_counter() - started
    observe(rel, obj)
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
