"""What every checkpoint format is: its names, how it is recognised in a checkpoint's file
list, how the inspection child checks it and how the restore test's loader loads it.

One class per format, one module each (webapp/domain/formats/); the registry FORMATS in
webapp/domain/formats/__init__.py lists them, and validation (inspect_child), the
hint-versus-files finding, the merge of parts (inspect_parts) and the restore loader
(recovery/restore_load) only iterate it. A hook a format has no use for keeps the
default here, which does nothing.

This module and the format modules import neither torch nor Django at module level: the
registry is read by the parent side of the load check (the worker, the web process), which
must stay free of torch. A format's child half imports its implementation (torch, the
`inspect_<x>` modules) inside the hook, which only the child and the restore loader call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class Inspection:
    """One checkpoint's check in the inspection child, as the formats' hooks see it."""

    base: str  # the local directory holding the checkpoint
    files: list[str]  # every file of the checkpoint, relative to base, sorted
    only: set[str]  # the files whose contents this child reads (a part: inspect_parts)
    report: Any  # inspect_common.Report (imported by the child only: it needs torch)
    # Hands an object loaded from a torch.save file to every format's `observe` (a
    # Lightning checkpoint and a DeepSpeed model states file are torch files).
    observe: Callable[[str, Any], None]

    def path(self, rel: str) -> str:
        """Where the checkpoint's file `rel` is on this machine."""
        return os.path.join(self.base, rel)


class Format:
    """One checkpoint format. The class attributes name it; the methods, all optional,
    are its part in detection, in the inspection child and in the restore test."""

    # What the check's result calls the checkpoint (Checkpoint.format).
    name: ClassVar[str]
    # Other format hints a job may send that mean this format (the name always does).
    aliases: ClassVar[tuple[str, ...]] = ()
    # When a checkpoint's files show several formats, the lowest number names it (an HF
    # Trainer folder holds torch and safetensors files). None: the format never names a
    # checkpoint; its files are reported as another's (DeepSpeed's as torch).
    precedence: ClassVar[int | None] = None
    # The modules the hooks below import when they run (torch's side: the inspection
    # child, the restore loader), named here so that a warm helper imports them once
    # before it forks (formats.import_child_halves) and a test can check that none of
    # them imports Django.
    child_modules: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------ detection (names only)

    def folders(self, files: Iterable[str]) -> list[str]:
        """The folders (relative) that are checkpoints of this format as a whole, checked
        and loaded folder by folder (DCP's, found by their `.metadata`)."""
        return []

    def folder_files(self, files: Iterable[str]) -> set[str]:
        """The files of `files` that belong to one of this format's folders: checked and
        loaded with their folder, never file by file."""
        return set()

    def claims(self, rel: str, head: bytes) -> bool:
        """Whether this format inspects the file `rel`, whose first bytes are `head`
        (torch_files.HEAD_BYTES of them). The first format in FORMATS that claims a file
        inspects it."""
        return False

    def promised(self, rel: str) -> bool:
        """Whether the file's name promises this format, so that an empty one is corrupt
        rather than just not a checkpoint file."""
        return False

    # ------------------------------------------------------------ the inspection child

    def inspect_file(self, job: Inspection, rel: str, size: int, head: bytes) -> None:
        """Checks one file this format claimed (never an empty one it was promised); adds
        `self.name` to job.report.formats and what it finds to job.report. Raises only
        for a gap in the checker (the child makes that an `inspect_failed` finding)."""
        raise NotImplementedError(f"{self.name} claims files but cannot inspect them")

    def inspect_checkpoint(self, job: Inspection) -> None:
        """The checks across files, after every file was inspected (a folder's shards, a
        marker file that names the format)."""

    def observe(self, job: Inspection, rel: str, obj: Any) -> None:
        """Sees every object a torch.save file of the checkpoint loaded to."""

    # ------------------------------------------------------------ the restore test's loader

    def loads(self, rel: str, full: str) -> bool:
        """Whether this format's loader loads the file (the first in FORMATS that does)."""
        return False

    def load_file(self, full: str) -> Any:
        """The file's contents, with its tensors on the CPU (memory-mapped where it can)."""
        raise NotImplementedError(f"{self.name} loads no file")

    def load_folder(
        self, base: str, root: str, files: set[str], result: dict, device: Any, use_cuda: bool
    ) -> float:
        """Loads one of this format's folders, adding to result's "tensors", "bytes" and
        "loaded"; moves every tensor to `device`. Returns the seconds spent moving them;
        raises for a folder that does not load (the loader reports the error)."""
        raise NotImplementedError(f"{self.name} has no folders to load")
