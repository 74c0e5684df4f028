"""Restore on another world size (docs/restore.md, "On another world size"): the
`reshard` level of a restore test, and the check a resume runs before it launches a job
on a world size other than the one that saved the checkpoint. The load itself runs in a
child (reshard_load.py): M ranks load the torch.distributed.checkpoint folder with DCP's
own planner and every share is compared bit for bit with the saved tensors.

Only DCP folders can be resharded here: a torch.save file or a safetensors shard holds
whole tensors laid out by the code that wrote it, and Lifeboat cannot know how another
world size would split them. Those say so, plainly, instead of passing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from django.conf import settings

from lifeboat.parts import dcp_world_size
from webapp.domain.child_payloads import ReshardRequest, ReshardResult
from webapp.domain.models import SavedChunks, Validation
from webapp.domain.models.recovery import ReplicaStatus
from webapp.domain.recovery.errors import ResumeError
from webapp.domain.replication.restore import RestoreError, restore_replica
from webapp.domain.validation.sandbox import run_fresh_child

CHILD_MODULE = "webapp.domain.recovery.reshard_load"
MAX_WORLD_SIZE = 64  # processes forked on one worker: beyond that, a cluster's job


def dcp_root(files: list[str]) -> str | None:
    """The folder (relative) of the checkpoint's one DCP `.metadata`, None when it has
    none or several."""
    roots = [f.rpartition("/")[0] for f in files if f.rpartition("/")[2] == ".metadata"]
    return roots[0] if len(roots) == 1 else None


def saved_world_size(checkpoint) -> int | None:
    """The world size that saved `checkpoint`: its shards' names for DCP, else what its
    parts or its run said."""
    files = list(checkpoint.files.values_list("path", flat=True))
    root = dcp_root(files)
    found = dcp_world_size(files, root) if root is not None else None
    return found or checkpoint.world_size or checkpoint.run.world_size


def refusal(checkpoint, world_size: int | None) -> str | None:
    """Why `checkpoint` cannot be resumed on `world_size`, None when it can (or when the
    world size is its own)."""
    if world_size is None:
        return None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        return "the world size must be a whole number of at least 1"
    saved = saved_world_size(checkpoint)
    if saved is None or world_size == saved:
        return None
    if dcp_root(list(checkpoint.files.values_list("path", flat=True))) is None:
        return (
            f"this checkpoint was saved by {saved} ranks in a format Lifeboat cannot reshard "
            "(only torch.distributed.checkpoint folders): resume it on "
            f"{saved} ranks"
        )
    if world_size > MAX_WORLD_SIZE:
        return f"Lifeboat checks a resharded load on at most {MAX_WORLD_SIZE} ranks"
    return None


def run_child(base: Path, files: list[str], world_sizes: list[int]) -> ReshardResult:
    """The child's answer (reshard_load.check); RuntimeError when it gave none."""

    request: ReshardRequest = {
        "base": str(base), "root": dcp_root(files) or "", "files": files,
        "world_sizes": world_sizes, "timeout_s": settings.VALIDATION_TIMEOUT_S,
    }  # fmt: skip
    # No address-space limit: M ranks are M processes, each with gloo's threads; the
    # time limit bounds them, and each rank holds only its share.
    outcome = run_fresh_child(
        request, None, settings.VALIDATION_TIMEOUT_S * (len(world_sizes) + 1), CHILD_MODULE
    )
    if outcome.get("timed_out"):
        raise RuntimeError("the resharded load did not finish in time")
    tail = outcome.get("stderr", "").strip().splitlines()[-1:] or ["no output"]
    if outcome.get("returncode") != 0 or not outcome.get("stdout", "").strip():
        raise RuntimeError(
            f"the resharded load exited with {outcome.get('returncode')}: {tail[0][:300]}"
        )
    return json.loads(outcome["stdout"])


def levels(validation, scratch: Path, files: list[str], timings: dict) -> list[dict]:
    """The `reshard` level of a restore test, one entry per world size the project asks
    for (restore_checks["reshard"]); the chunks recorded when every one passes."""

    checkpoint = validation.checkpoint
    sizes = (checkpoint.project.restore_checks or {}).get("reshard") or []
    if not sizes:
        return []
    if dcp_root(files) is None:
        return [{
            "level": "reshard", "ok": True, "severity": "info",
            "message": "not run: only torch.distributed.checkpoint folders can be loaded on "
            "another world size; this checkpoint resumes on the world size that saved it",
        }]  # fmt: skip
    failed = {"level": "reshard", "ok": False, "severity": "corrupt"}
    try:
        result = run_child(scratch, files, sizes)
    except RuntimeError as exc:
        return [{**failed, "message": str(exc)}]
    if result["error"]:
        return [{**failed, "message": result["error"]}]
    timings["reshard_s"] = sum(r["seconds"] for r in result["results"])
    found = [
        {
            "level": "reshard", "ok": r["ok"], "severity": "info" if r["ok"] else "corrupt",
            "message": r["message"], "world_size": r["world_size"],
            "saved_world_size": result["saved_world_size"],
        }
        for r in result["results"]
    ]  # fmt: skip
    if all(r["ok"] for r in found):
        SavedChunks.objects.update_or_create(
            checkpoint=checkpoint, defaults={"chunks": result["chunks"]}
        )
    return found


def altered_tensors(checkpoint, relative: str, mismatched: Path, limit: int = 5) -> str:
    """What a shard whose bytes no longer match its sha256 (`mismatched`, the download
    kept it) holds that differs from the chunks recorded when it last passed: '' when no
    chunks were recorded or none differs."""
    saved = _saved_chunks(checkpoint)
    chunks = [c for c in saved if c[2] == relative]
    if not chunks:
        return ""
    changed = []
    with open(mismatched, "rb") as f:
        for fqn, offsets, _, offset, length, sha in chunks:
            f.seek(offset)
            if hashlib.sha256(f.read(length)).hexdigest() != sha:
                changed.append(f"{fqn} (its chunk at {offsets})")
    if not changed:
        return ""
    more = f" and {len(changed) - limit} more" if len(changed) > limit else ""
    return f"the tensors altered since it last passed: {', '.join(changed[:limit])}{more}"


def _saved_chunks(checkpoint) -> list:
    found = SavedChunks.objects.filter(checkpoint=checkpoint).values_list("chunks", flat=True)
    return next(iter(found), [])


def proven_on(checkpoint, world_size: int) -> bool:
    """Whether a passed restore test already loaded `checkpoint` on `world_size`."""

    for findings in Validation.objects.filter(
        checkpoint=checkpoint, kind="restore", status="passed"
    ).values_list("findings", flat=True):
        if any(
            isinstance(f, dict)
            and f.get("level") == "reshard"
            and f.get("ok")
            and f.get("world_size") == world_size
            for f in findings or []
        ):
            return True
    return False


def before_launch(resume) -> str:
    """For a resume on a world size other than the checkpoint's: load it on that world
    size first, from its verified replica into this worker's scratch folder (bytes that
    match their sha256, in a folder no job can write in). Returns what was done; raises
    ResumeError when it does not load, so the job is never launched on it."""

    checkpoint, world_size = resume.checkpoint, resume.world_size
    saved = saved_world_size(checkpoint)
    if world_size is None or saved is None or world_size == saved:
        return ""
    refused = refusal(checkpoint, world_size)
    if refused:
        raise ResumeError(refused)
    if proven_on(checkpoint, world_size):
        return f"already loaded on {world_size} ranks by a restore test"
    replica = (
        checkpoint.replicas.filter(status=ReplicaStatus.VERIFIED)
        .select_related("target")
        .order_by("-verified_at")
        .first()
    )
    if replica is None:
        raise ResumeError(
            f"saved by {saved} ranks, to be resumed on {world_size}: Lifeboat loads it on "
            f"{world_size} ranks first, from a verified replica, and it has none"
        )
    scratch = Path(settings.SCRATCH_DIR) / f"reshard-resume-{resume.pk}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700, parents=True)
    try:
        restore_replica(replica, scratch, durable=False)
        files = sorted(checkpoint.files.values_list("path", flat=True))
        result = run_child(scratch, files, [world_size])
    except (RestoreError, RuntimeError) as exc:
        raise ResumeError(f"could not load it on {world_size} ranks first: {exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if result["error"] or not result["results"][0]["ok"]:
        raise ResumeError(
            f"it does not load on {world_size} ranks: "
            f"{result['error'] or result['results'][0]['message']}"
        )
    return result["results"][0]["message"]
