"""`lifeboat.torch.save`: torch.save that cannot leave half a checkpoint behind, timed
and reported.

torch.save writes in place: a job killed mid-save leaves a truncated file under the
final name, and the next start loads it (Lightning #688, #19970). Here the bytes go to a
temporary file in the same directory, are fsynced, and only then renamed over the final
name, so the final name holds either the old checkpoint or the complete new one.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lifeboat.files import HashingWriter
from lifeboat.run import CheckpointReport, Run, current_run


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_file(obj: Any, path: Path, save_kwargs: dict) -> dict | None:
    """Write, fsync; the {size, sha256} of the bytes torch.save wrote, hashed as they
    went to the file (no second read), or None if torch.save did more than write."""
    import torch  # torch is optional for the client: loaded only when used

    with open(path, "wb") as handle:
        writer = HashingWriter(handle)
        torch.save(obj, writer, **save_kwargs)
        handle.flush()
        os.fsync(handle.fileno())
    return writer.digest()


def atomic_save(
    obj: Any, path: str | os.PathLike, *, digests: dict | None = None, **save_kwargs
) -> Path:
    """Save `obj` to the file `path`, or a mapping {file name: object} to the directory
    `path` (one file per entry), atomically. Returns the final path. `digests`, if
    given, receives {relative path: {size, sha256}} of the files as they were written."""
    digests = {} if digests is None else digests
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.lifeboat-tmp-{uuid.uuid4().hex[:8]}")
    directory = str(path).endswith(os.sep) or target.is_dir()
    try:
        if directory:
            if not isinstance(obj, Mapping):
                raise TypeError("saving to a directory takes a mapping {file name: object}")
            temporary.mkdir()
            for name, part in obj.items():
                if "/" in str(name) or str(name) in ("", ".", ".."):
                    raise ValueError(f"{name!r} is not a plain file name")
                digest = _write_file(part, temporary / str(name), save_kwargs)
                if digest is not None:
                    digests[str(name)] = digest
            _fsync_dir(temporary)
            if target.exists():
                # A directory cannot be renamed over a non-empty one: move the old one
                # aside first. Between the two renames the final name is briefly absent,
                # never half-written.
                old = target.with_name(f".{target.name}.lifeboat-old-{uuid.uuid4().hex[:8]}")
                os.replace(target, old)
                os.replace(temporary, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(temporary, target)
        else:
            digest = _write_file(obj, temporary, save_kwargs)
            if digest is not None:
                digests[target.name] = digest
            os.replace(temporary, target)
        _fsync_dir(target.parent)
    except BaseException:
        if temporary.is_dir():
            shutil.rmtree(temporary, ignore_errors=True)
        else:
            temporary.unlink(missing_ok=True)
        raise
    return target


def save(
    obj: Any,
    path: str | os.PathLike,
    *,
    step: int | None = None,
    epoch: int | None = None,
    metrics: dict | None = None,
    run: Run | None = None,
    **save_kwargs,
) -> CheckpointReport | None:
    """Save atomically (see atomic_save), time the save, and report it to `run` (the
    current lifeboat.Run by default) when a step is given. Returns the report, whose
    `wait()` gives the `checkpoint.saved` event once the files are hashed; None when
    there is no run to report to. With parts on (lifeboat.Run(parts=True)) every rank
    calls it for its own file(s), and the report is this rank's part of the checkpoint
    that is the folder holding `path`: `ckpt/step-100/rank-3.pt` on rank 3 is its part
    of `ckpt/step-100/`."""
    run = run or current_run()
    if run is not None and step is not None:
        run.checkpoint_started(step)
    started = time.perf_counter()
    digests: dict[str, dict] = {}
    try:
        final = atomic_save(obj, path, digests=digests, **save_kwargs)
    except BaseException as exc:
        if run is not None and step is not None:
            run.checkpoint_failed(step, f"{type(exc).__name__}: {exc}")
        raise
    seconds = time.perf_counter() - started
    if run is None or step is None:
        return None
    files = None
    if getattr(run, "part", None) is not None:
        # Every rank saves: what this call wrote is this rank's part of the checkpoint
        # that is the folder holding it (the same folder for every rank).
        if final.is_dir():
            digests = {f"{final.name}/{name}": digest for name, digest in digests.items()}
            files = [f"{final.name}/{name}" for name in obj]
        else:
            files = [final.name]
        final = final.parent
    # The digests made while writing: the report reads nothing back, and a file changed
    # on disk after this point no longer matches what is reported (docs/client.md).
    return run.checkpoint(
        final, step=step, epoch=epoch, metrics=metrics, save_seconds=seconds, format="torch",
        written=digests, files=files,
    )  # fmt: skip
