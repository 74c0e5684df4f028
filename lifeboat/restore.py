"""`lifeboat.latest`: what a restarting job calls to get back on its feet.

It asks the server for the run's newest verified checkpoint. If the copy where the job
wrote it is there and every file matches its sha256, that path is the answer. Otherwise
the checkpoint comes from a verified replica in object storage, through the presigned
URLs the server hands out (so the job needs no S3 credentials and no boto3): each file is
streamed to a temporary name, hashed on the way, and renamed into place only when its
sha256 matches. A damaged local copy is left where it is, for a person to look at.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

from lifeboat.config import Config, process_rank, process_world_size
from lifeboat.download import RestoreError, download_files
from lifeboat.files import hash_file
from lifeboat.parts import parts_from_env, rank_share
from lifeboat.progress import Progress
from lifeboat.transport import ServerError, Unreachable, api_url, quote_key, request


class LatestError(Exception):
    """No verified checkpoint could be handed back; the message says why."""


def latest_info(run: str, config: Config, checkpoint: int | None = None) -> dict:
    """The server's answer for the newest verified checkpoint of `run`, or for its
    verified checkpoint `checkpoint` (an id)."""
    query = f"?checkpoint={int(checkpoint)}" if checkpoint is not None else ""
    try:
        return request(
            "GET",
            api_url(config.url, f"/runs/{quote_key(run)}/latest{query}"),
            config.token,
            timeout=config.timeout_s,
        )
    except ServerError as exc:
        said = exc.answer.get("error", exc.answer)
        raise LatestError(
            f"nothing to resume run {run!r} from: {said} (HTTP {exc.status})"
        ) from None
    except Unreachable as exc:
        raise LatestError(f"the server at {config.url} is unreachable: {exc}") from None


def _local_copy_ok(checkpoint: dict) -> tuple[bool, str]:
    location = checkpoint.get("location", "")
    if location.startswith("s3://"):
        return False, "the checkpoint lives in object storage"
    files = checkpoint.get("files") or []
    single = len(files) == 1 and files[0]["path"] == os.path.basename(location)
    base = Path(location).parent if single else Path(location)
    for spec in files:
        path = base / spec["path"]
        try:
            if path.stat().st_size != spec["size"]:
                return False, f"{path} has the wrong size"
        except FileNotFoundError:
            return False, f"{path} is missing"
    for spec in files:
        path = base / spec["path"]
        if hash_file(path)[0] != spec["sha256"]:
            return False, f"{path} does not match its sha256"
    return True, ""


def _restored_path(checkpoint: dict, destination: Path) -> Path:
    files = checkpoint["files"]
    location = checkpoint.get("location", "").rstrip("/")
    single = len(files) == 1 and files[0]["path"] == location.rsplit("/", 1)[-1]
    return destination / files[0]["path"] if single else destination


def fetch_replica(
    checkpoint: dict, destination: Path, show_progress: bool = True, partial: bool = False
) -> Path:
    """Download the checkpoint from its first verified replica that works into
    `destination` (a directory), verifying every file; the path to hand to the loader.
    `partial` (one rank's share): its files go straight into `destination`, each renamed
    into place once verified, beside what the host's other ranks fetch; the folder is
    never replaced whole."""
    replicas = [r for r in checkpoint.get("replicas") or [] if r.get("files")]
    if not replicas:
        raise LatestError(
            f"checkpoint {checkpoint.get('id')} (step {checkpoint.get('step')}) is not usable "
            "here and has no verified replica to restore from"
        )
    files = checkpoint["files"]
    total = sum(spec["size"] for spec in files)
    errors = []
    for replica in replicas:
        # Where each file's bytes are: `url`; a small file in a pack, from `offset` on in
        # the pack's object; a large file cut at tensor boundaries, its `pieces` in order.
        where = {
            item["path"]: {
                k: item[k] for k in ("url", "offset", "pieces") if item.get(k) is not None
            }
            for item in replica["files"]
        }
        missing = [
            spec["path"]
            for spec in files
            if not {"url", "pieces"} & set(where.get(spec["path"], {}))
        ]
        if missing:
            errors.append(f"{replica.get('target')}: no object for {missing[0]}")
            continue
        staging = destination.with_name(f".{destination.name}.restoring-{uuid.uuid4().hex[:8]}")
        bar = Progress(total, f"restoring from {replica.get('target')}", enabled=show_progress)
        seen = [0]

        def progress(done: int, _total: int, bar=bar, seen=seen) -> None:
            bar.add(done - seen[0])
            seen[0] = done

        try:
            if partial:
                download_files(
                    [{**spec, **where[spec["path"]]} for spec in files],
                    destination,
                    progress,
                )
                bar.close()
                return destination
            download_files(
                [{**spec, **where[spec["path"]]} for spec in files],
                staging,
                progress,
            )
            bar.close()
            if destination.exists():
                shutil.rmtree(destination)
            os.replace(staging, destination)
            return _restored_path(checkpoint, destination)
        except (RestoreError, OSError) as exc:
            bar.close()
            errors.append(f"{replica.get('target')}: {exc}")
            shutil.rmtree(staging, ignore_errors=True)
    raise LatestError("no replica could be restored: " + "; ".join(errors))


def latest(
    run: str | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    dest: str | os.PathLike | None = None,
    progress: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    checkpoint: int | None = None,
) -> Path:
    """The local path of the newest verified checkpoint of `run` (LIFEBOAT_RUN by
    default): the job's own copy if it is intact, else a verified download from a replica
    into `dest` (LIFEBOAT_RESTORE_DIR, or a folder beside the spool).

    A checkpoint whose ranks each reported their part, asked for by one rank of a job
    with the same world size (`rank=`, `world_size=`; with LIFEBOAT_PARTS=1 they come
    from the environment, as for Run(parts=True)): only that rank's files and the shared
    ones are looked at and fetched, each rank on its own host at the same time. On
    another world size, every file. `checkpoint` (an id, from rank 0's `latest_id()`)
    makes every rank restore that one checkpoint, even if a newer one is verified while
    the job starts (docs/client.md)."""
    config = Config.resolve(url=url, token=token)
    run = run or os.environ.get("LIFEBOAT_RUN")
    if not run:
        raise LatestError("which run? pass run= or set LIFEBOAT_RUN")
    if rank is None and parts_from_env():
        rank, world_size = process_rank(), process_world_size()
    answer = latest_info(run, config, checkpoint)
    if progress:
        say_passed_over(answer)
    share = rank_share(answer, rank, world_size)
    root = restore_root(config, dest)
    if share is not None:
        return usable_copy(share, run, root, progress, partial=True)
    return usable_copy(answer, run, root, progress)


def say_passed_over(answer: dict) -> None:
    """Name the newer checkpoints the server passed over (quarantined), on stderr."""
    for skipped in answer.get("passed_over") or []:
        reason = (skipped.get("quarantine_reason") or "").splitlines()[:1]
        sys.stderr.write(
            f"lifeboat: step {skipped['step']} is quarantined"
            + (f" ({reason[0]})" if reason else "")
            + f"; using step {answer.get('step')}\n"
        )


def latest_id(run: str | None = None, *, url: str | None = None, token: str | None = None) -> int:
    """The id of the newest verified checkpoint of `run` (LIFEBOAT_RUN by default): what
    rank 0 of a job on many hosts broadcasts, so that every rank's `latest(checkpoint=)`
    restores the same one."""
    config = Config.resolve(url=url, token=token)
    run = run or os.environ.get("LIFEBOAT_RUN")
    if not run:
        raise LatestError("which run? pass run= or set LIFEBOAT_RUN")
    return int(latest_info(run, config)["id"])


def restore_root(config: Config, dest: str | os.PathLike | None = None) -> Path:
    """Where restored checkpoints go: `dest`, else LIFEBOAT_RESTORE_DIR, else a folder
    beside the spool."""
    return Path(
        dest or os.environ.get("LIFEBOAT_RESTORE_DIR") or config.spool_root.parent / "restored"
    )


def usable_copy(
    checkpoint: dict, run: str, root: Path, progress: bool = True, partial: bool = False
) -> Path:
    """The job's own copy of `checkpoint` (the server's answer) if every file is there
    and matches its sha256, else restored_copy() under `root`. `partial`: the answer's
    files are one rank's share (parts.rank_share), which other ranks complete beside it."""
    ok, why = _local_copy_ok(checkpoint)
    if ok:
        return Path(checkpoint["location"])
    return restored_copy(checkpoint, run, root, progress, why=why, partial=partial)


def restored_copy(
    checkpoint: dict,
    run: str,
    root: str | os.PathLike,
    progress: bool = True,
    why: str = "",
    partial: bool = False,
) -> Path:
    """A verified copy of `checkpoint` in root/<run>/checkpoint-<id>/: the one there if
    it is still whole, else downloaded from a verified replica (LatestError if none can
    be). Only that folder is ever replaced, never `root` itself."""
    folder = run.replace("/", "_")
    if folder in (".", ".."):
        folder = folder.replace(".", "_")  # a run key is a name here, never a way up
    destination = Path(root) / folder / f"checkpoint-{int(checkpoint['id'])}"
    restored = _restored_path(checkpoint, destination)
    if _local_copy_ok({**checkpoint, "location": str(restored)})[0]:
        return restored  # restored before, and still whole
    if progress:
        because = f"{why}; " if why else ""
        step = checkpoint.get("step")
        sys.stderr.write(f"lifeboat: {because}restoring step {step} from a replica\n")
    return fetch_replica(checkpoint, destination, show_progress=progress, partial=partial)
