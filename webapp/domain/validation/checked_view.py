"""The files integrity checked, as a directory the inspection child can read by path.

Libraries (torch.load, safetensors, the DCP reader) open files by path. Handing them the
checkpoint's own directory would let a job swap a file for a symlink between the check
and the load. Instead the worker keeps the descriptors integrity opened (by a confined
walk) and makes, in its own scratch directory, a private folder whose entries are
symlinks to /proc/<worker pid>/fd/<n>: opening one opens the very file that was checked,
whatever happens to names in the checkpoint's directory since. The folder is created
0700 by the worker, so no job can add or change an entry; only the listed files exist
in it. The inspection code needs no change: it gets this folder as its `base`.
"""

from __future__ import annotations

import os
import resource
import shutil
from pathlib import Path

from webapp.domain.confined_files import relative_parts


def raise_open_file_limit(needed: int) -> None:
    """Keeping one descriptor per file: lift the soft limit toward the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def make_view(handles: dict[str, int], folder: Path) -> str:
    """A fresh private folder at `folder` naming each checked file by its relative path.
    Returns its path. The caller removes it (remove_view) and closes the handles."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700, parents=True)
    pid = os.getpid()
    for rel, fd in handles.items():
        parts = relative_parts(rel, "file path")  # checked already; never trust twice
        entry = folder.joinpath(*parts)
        entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.symlink(f"/proc/{pid}/fd/{fd}", entry)
    return str(folder)


def remove_view(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
