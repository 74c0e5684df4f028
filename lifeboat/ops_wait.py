"""`--wait` on validate and restore-test: follow the queued check on the server until it
has a verdict, with its bytes, rate and ETA on a progress line of stderr.

A check is a Validation of the checkpoint (GET /checkpoints/<id> lists the newest 20).
The action's answer names it ("validation": id); a server whose validate answer does
not (before the API named it) is followed by elimination: the newest check of that kind
that had not already ended before the request was made."""

from __future__ import annotations

import sys
import time

from lifeboat.ops_api import STILL_RUNNING, CommandFailed, OpsClient
from lifeboat.ops_format import clean
from lifeboat.progress import Progress

WAITING = ("queued", "running")


def ended_before(detail: dict) -> set[int]:
    """The ids of the checks of a checkpoint (its GET answer) that have a verdict: the
    request about to be made cannot be one of them."""
    return {v["id"] for v in detail.get("validations") or [] if v.get("status") not in WAITING}


def find_check(detail: dict, validation_id: int | None, kind: str, ended: set[int]) -> dict | None:
    checks = detail.get("validations") or []
    if validation_id is not None:
        return next((v for v in checks if v.get("id") == validation_id), None)
    candidates = [v for v in checks if v.get("kind") == kind and v.get("id") not in ended]
    return max(candidates, key=lambda v: v["id"], default=None)


class CheckProgress:
    """One line of stderr that says where the check is: waiting for a worker, or its
    bytes, rate and ETA as the worker measured them."""

    def __init__(self, checkpoint_id: int, enabled: bool, stream=None):
        self.checkpoint_id = checkpoint_id
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.bar = Progress(0, "", stream=self.stream, enabled=enabled)
        self.drawn = False

    def show(self, check: dict | None) -> None:
        if not self.enabled:
            return
        self.drawn = True
        name = f"check {check['id']} ({clean(check.get('kind'))})" if check else "check"
        head = f"{name} of checkpoint {self.checkpoint_id}"
        progress = (check or {}).get("progress") or {}
        if check is None or check.get("status") == "queued" or not progress.get("bytes_total"):
            status = clean(check.get("status", "queued")) if check else "queued"
            waiting = ", waiting for a worker" if status == "queued" else ""
            self.stream.write(f"\r{head}: {status}{waiting}   ")
            self.stream.flush()
            return
        self.bar.label = f"{head}: {clean(check['status'])}"
        self.bar.update(
            int(progress.get("bytes_done") or 0),
            int(progress["bytes_total"]),
            progress.get("rate"),
            progress.get("eta_s"),
        )

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def follow(
    client: OpsClient,
    checkpoint_id: int,
    answer: dict,
    kind: str,
    ended: set[int],
    *,
    timeout: float | None,
    interval: float,
    progress: bool,
) -> tuple[dict, dict]:
    """Poll until the check that `answer` (the action's answer) queued has a verdict;
    returns (the check, the checkpoint's GET answer). CommandFailed(STILL_RUNNING) when
    `timeout` seconds pass first."""
    validation_id = answer.get("validation")
    deadline = time.monotonic() + timeout if timeout else None
    line = CheckProgress(checkpoint_id, progress)
    try:
        while True:
            detail = client.checkpoint(checkpoint_id)
            check = find_check(detail, validation_id, kind, ended)
            if check is not None and check.get("status") not in WAITING:
                return check, detail
            line.show(check)
            if deadline is not None and time.monotonic() >= deadline:
                where = (
                    f"check {check['id']} is still {clean(check['status'])}"
                    if check
                    else ("the check has not started")
                )
                raise CommandFailed(
                    f"checkpoint {checkpoint_id}: {where} after {timeout:g} s "
                    "(it goes on on the server)",
                    STILL_RUNNING,
                )
            time.sleep(interval)
    finally:
        line.close()
