"""torch.distributed.checkpoint (DCP): a folder holding `.metadata`, written last by the
coordinator, and the `.distcp` shards it names. Checked and loaded folder by folder, and
in parts shard by shard (inspect_parts): the part holding the `.metadata` checks it and
every shard's presence, each part scans the chunks of the shards it holds. The checks are
webapp/domain/validation/inspect_dcp.py's."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import PurePosixPath

from webapp.domain.formats.base import Format, Inspection

METADATA = ".metadata"
SHARD_SUFFIX = ".distcp"


def _parent(rel: str) -> str:
    parent = str(PurePosixPath(rel).parent)
    return "" if parent == "." else parent


def _join(root: str, rel: str) -> str:
    return str(PurePosixPath(root, rel)) if root else rel


class Dcp(Format):
    name = "dcp"
    aliases = ("torch.distributed.checkpoint",)
    precedence = 10
    child_modules = (
        "webapp.domain.validation.inspect_common",
        "webapp.domain.validation.inspect_dcp",
    )

    def folders(self, files: Iterable[str]) -> list[str]:
        return sorted({_parent(p) for p in files if PurePosixPath(p).name == METADATA})

    def folder_files(self, files: Iterable[str]) -> set[str]:
        files = list(files)
        roots = set(self.folders(files))
        # A shard outside every DCP folder is left to the other formats (its chunks are
        # torch.save archives) and named by inspect_checkpoint as an orphan.
        return {
            p
            for p in files
            if PurePosixPath(p).name == METADATA
            or (p.endswith(SHARD_SUFFIX) and _parent(p) in roots)
        }

    # ------------------------------------------------------------ the inspection child

    def inspect_checkpoint(self, job: Inspection) -> None:
        # Imported here: torch, which the parent side that reads the registry must not load.
        from webapp.domain.validation.inspect_common import first_line, raise_if_out_of_memory
        from webapp.domain.validation.inspect_dcp import inspect_dcp, scan_dcp_part

        report, file_set = job.report, set(job.files)
        all_roots = self.folders(job.files)
        # A part's own folders: those whose .metadata it holds (it checks the metadata),
        # and those of the shards it holds (it scans their chunks).
        roots = set(self.folders(job.only))
        shard_roots = {_parent(p) for p in job.only if p.endswith(SHARD_SUFFIX)} & set(all_roots)
        for root in sorted(roots | shard_roots):
            report.formats.add(self.name)
            try:
                if root in roots:
                    inspect_dcp(job.base, root, file_set, report, scan=job.only)
                else:
                    scan_dcp_part(job.base, root, file_set, report, scan=job.only)
            except Exception as exc:
                raise_if_out_of_memory(exc)
                report.add(
                    "error",
                    "inspect_failed",
                    f"the DCP checkpoint in {root or '.'} could not be inspected "
                    f"({type(exc).__name__}: {first_line(exc)})",
                )
        self._orphan_shards(sorted(job.only), all_roots, report)

    def _orphan_shards(self, files: list[str], roots: list[str], report) -> None:
        orphans = sorted(
            {_parent(p) for p in files if p.endswith(SHARD_SUFFIX) and _parent(p) not in roots}
        )
        for folder in orphans:
            report.formats.add(self.name)
            where = folder or "the checkpoint"
            report.add(
                "corrupt",
                "missing_shard",
                f"{where} holds .distcp shards but no .metadata, without which DCP cannot "
                "load them",
                _join(folder, METADATA),
            )

    # ------------------------------------------------------------ the restore test's loader

    def load_folder(
        self, base: str, root: str, files: set[str], result: dict, device, use_cuda: bool
    ) -> float:
        """A DCP folder, chunk by chunk: a .distcp shard is a run of torch.save archives,
        one per chunk, that torch.load cannot read whole. Its .metadata goes through
        validation's restricted unpickler and each chunk through the same reader
        validation scans with (inspect_dcp), one shard mapped at a time."""
        # Imported here: torch, which the parent side that reads the registry must not load.
        import torch

        from webapp.domain.validation.inspect_common import Report
        from webapp.domain.validation.inspect_dcp import (
            check_dcp_shards,
            dcp_chunks,
            read_dcp_metadata,
        )

        report = Report()
        meta_rel = _join(root, METADATA)
        metadata = read_dcp_metadata(os.path.join(base, meta_rel), meta_rel, report)
        # Its shards named inside the folder, present and long enough (a copy of a verified
        # checkpoint always passes; a .metadata naming "../x" is never followed).
        if metadata is None or not check_dcp_shards(base, root, metadata, files, report):
            raise RuntimeError(report.findings[0]["message"] if report.findings else meta_rel)
        moving, loaded = 0.0, set()
        with contextlib.closing(dcp_chunks(base, root, metadata, report)) as chunks:
            for _, info, tensor in chunks:
                if tensor is None:
                    if report.findings:  # it does not load: say why
                        raise RuntimeError(report.findings[0]["message"])
                    continue  # a transformed (compressed) chunk: not read here
                loaded.add(_join(root, info.relative_path))
                result["tensors"] += 1
                result["bytes"] += tensor.numel() * tensor.element_size()
                started = time.perf_counter()
                if use_cuda:
                    tensor.to(device, non_blocking=True)
                    torch.cuda.synchronize()
                elif tensor.numel() and tensor.is_floating_point():
                    tensor.sum()  # every byte read, as for the other formats
                moving += time.perf_counter() - started
                del tensor
        result["loaded"] += [meta_rel, *sorted(loaded)]
        return moving
