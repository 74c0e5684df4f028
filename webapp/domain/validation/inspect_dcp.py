"""torch.distributed.checkpoint folders in the inspection child: .metadata through a
restricted unpickler (DCP's classes become inert records), every shard it names present
and long enough, every chunk scanned in place, one shard mapped at a time."""

from __future__ import annotations

import contextlib
import io
import math
import mmap
import os
import pickle
import re
import struct
import time
import zipfile

import torch

from webapp.domain.validation.content_findings import AllZero, NonFinite
from webapp.domain.validation.content_findings import plural as plural
from webapp.domain.validation.inspect_common import (
    ZIP_MAGIC,
    Report,
    close_quietly,
    dtype_name,
    first_line,
    join,
    pickle_globals,
    raise_if_out_of_memory,
    scan_values,
    scannable,
    stays_inside,
)
from webapp.domain.validation.inspect_torch import torch_allowed_globals, weights_only_reason
from webapp.domain.validation.tensor_places import BOOKKEEPING, dcp_roles

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


def inspect_dcp(
    base: str, root: str, files: set[str], report: Report, scan: set[str] | None = None
) -> None:
    """One DCP checkpoint: `root` is the directory (relative to base) holding .metadata.
    Its metadata checked, its shards present and long enough, its tensors counted, and
    the chunks stored in the shards `scan` (paths relative to base; all when None)
    scanned."""
    meta_rel = join(root, ".metadata")
    started = time.perf_counter()
    metadata = read_dcp_metadata(os.path.join(base, meta_rel), meta_rel, report)
    report.load_s += time.perf_counter() - started
    if metadata is None:
        return
    shards_ok = check_dcp_shards(base, root, metadata, files, report)
    count_dcp_tensors(metadata, meta_rel, report)
    if shards_ok:
        scan_dcp_tensors(base, root, metadata, meta_rel, report, scan)


def scan_dcp_part(base: str, root: str, files: set[str], report: Report, scan: set[str]) -> None:
    """The chunks stored in the shards `scan`, for a part of a DCP checkpoint whose
    .metadata another part checks and counts (inspect_parts splits a DCP folder by
    shard). The metadata and the shards are checked here too before the scan, and what
    is wrong is said here as well: never a scan skipped in silence. The part holding the
    metadata finds the same, and inspect_parts.merge_parts keeps one of each finding."""
    meta_rel = join(root, ".metadata")
    started = time.perf_counter()
    metadata = read_dcp_metadata(os.path.join(base, meta_rel), meta_rel, report)
    report.load_s += time.perf_counter() - started
    if metadata is not None and check_dcp_shards(base, root, metadata, files, report):
        scan_dcp_tensors(base, root, metadata, meta_rel, report, scan)


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
        report.add("corrupt", "bad_dcp_metadata", f"{rel} cannot be read: {first_line(exc)}", rel)
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
        if not isinstance(rel, str) or not stays_inside(rel):
            report.add(
                "corrupt",
                "bad_dcp_metadata",
                f"{join(root, '.metadata')} names a shard outside the checkpoint: {rel!r}",
            )
            return False
        end = int(getattr(info, "offset", 0) or 0) + int(getattr(info, "length", 0) or 0)
        needed[rel] = max(needed.get(rel, 0), end)
    whole = True
    for rel, end in sorted(needed.items()):
        path = join(root, rel)
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
        # Chunks that hold fewer elements than the tensor leave rows no load can fill: DCP
        # would leave the caller's values there (zeros, or whatever it allocated) without
        # a word. More is not a fault: replicated chunks may be saved more than once.
        chunks = getattr(item, "chunks", None) or ()
        held = sum(math.prod(getattr(c, "sizes", None) or ()) for c in chunks)
        if held < math.prod(size):
            report.add(
                "corrupt",
                "dcp_gap",
                f"{meta_rel}: the chunks of {fqn} hold {held:,} of its {math.prod(size):,} "
                "elements: the rest are in no saved chunk",
                meta_rel,
            )


def scan_dcp_tensors(
    base: str, root: str, metadata, meta_rel: str, report: Report, scan: set[str] | None = None
) -> None:
    """Scans every tensor chunk stored in the shards `scan` (all when None), shard by
    shard; a tensor's NaN/Inf counts add up over its chunks (and over the parts of a
    checkpoint checked in parts: Report.nonzero). A chunk in the default layout (one
    torch.save'd tensor) is read in place: its pickle is checked for unsafe globals
    without being run, and its stored bytes are viewed through a mapping with the dtype
    the metadata gives, without copy. Chunks that do not look like that go through
    torch.load(weights_only=True); transformed (compressed) ones are left unscanned and
    counted in an info finding."""
    stats: dict[str, list] = {}  # fqn -> [NaN, Inf, all zero so far]
    skipped = 0
    with contextlib.closing(dcp_chunks(base, root, metadata, report, scan)) as chunks:
        for fqn, _, tensor in chunks:
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
    planner = getattr(metadata, "planner_data", None)
    roles = dcp_roles(meta_rel, list(metadata.state_dict_metadata), planner)
    for fqn, (nan, inf, all_zero) in stats.items():
        size = list(metadata.state_dict_metadata[fqn].size)
        role = roles(fqn, math.prod(size))
        if nan or inf:
            report.nonfinite.append(NonFinite(f"{meta_rel}:{fqn}", nan, inf, role))
        if all_zero and role != BOOKKEEPING and len(size) >= 2 and math.prod(size) > 1:
            report.zero.append(AllZero(f"{meta_rel}:{fqn}", size, role))
        elif not all_zero:
            # Another part may hold only zero chunks of this tensor: not all zero.
            report.nonzero.append(f"{meta_rel}:{fqn}")
    if skipped:
        report.add(
            "info",
            "not_scanned",
            f"{plural(skipped, 'DCP chunk was', 'DCP chunks were')} not scanned for NaN "
            "(transformed, unsafe, or unreadable)",
        )


def dcp_chunks(base: str, root: str, metadata, report: Report, scan: set[str] | None = None):
    """Yields (fqn, storage info, tensor) for every tensor chunk stored in the shards
    `scan` (paths relative to base; all when None), in shard and offset order, one shard
    mapped at a time: the one walk over a DCP folder's chunks, for validation's scan and
    the restore test's load. The tensor is None for a chunk not read: one that does not
    load (load_dcp_chunk added a finding saying why) or a transformed one. Close the
    generator (contextlib.closing) to unmap the last shard at once."""
    items = sorted(
        (
            item
            for item in metadata.storage_data.items()
            if scan is None or join(root, str(item[1].relative_path)) in scan
        ),
        key=lambda item: (str(item[1].relative_path), int(item[1].offset)),
    )
    shard = ShardReader(base, root)
    try:
        for index, info in items:
            fqn = getattr(index, "fqn", None)
            item = metadata.state_dict_metadata.get(fqn)
            if getattr(item, "properties", None) is None:
                continue  # a bytes item: pickled Python objects, not tensors
            yield fqn, info, load_dcp_chunk(shard, index, info, item, report)
    finally:
        shard.close()


class ShardReader:
    """One DCP shard open (and mapped) at a time: shards can be many and large, and the
    address space is limited."""

    def __init__(self, base: str, root: str):
        self.base, self.root = base, root
        self.path = ""
        self.fd = -1
        self.mapped: mmap.mmap | None = None

    def open(self, relative_path: str) -> str:
        path = join(self.root, relative_path)
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
        close_quietly(self.mapped)
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
            f"{first_line(exc)}",
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
        unsafe = sorted(set(pickle_globals(archive.read(pickles[0]))) - torch_allowed_globals())
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
