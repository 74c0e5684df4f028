"""A restore test's deeper levels: the project's own code run against the restored
checkpoint (restore_checks: a strict forward pass, a replay of K training steps compared
with the losses the run reported). The code is the project's, so it runs in a child as
the project's job user (webapp/domain/launch/run_as.py), never as the worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

from webapp.domain.launch import run_as
from webapp.domain.models import MetricPoint
from webapp.domain.validation.inspector import child_env
from webapp.domain.validation.torch_files import is_torch_file


class ConfigRefused(Exception):
    """The project's restore-check configuration names something it may not."""


def _main_file(scratch: Path, files: list[str], configured: str | None) -> Path:
    """The file the deeper levels load: the only one, the configured one (which must be
    one of the checkpoint's files: never a path out of the scratch folder), or the
    largest torch file of a directory checkpoint."""
    if len(files) == 1:
        return scratch / files[0]
    if configured:
        if not isinstance(configured, str) or configured not in files:
            raise ConfigRefused(
                f"the restore check's file {configured!r} is not one of the checkpoint's "
                f"files ({', '.join(files[:5])}{', …' if len(files) > 5 else ''})"
            )
        return scratch / configured

    loadable = [f for f in files if is_torch_file(scratch / f)]
    return scratch / max(loadable or files, key=lambda f: (scratch / f).stat().st_size)


def _child_check(request: dict, user=None) -> dict:
    """Run one level of the project's own code in a child, as the project's job user
    (run_as.py: the code is the project's, and must reach nothing of the worker's). The
    checkpoint is handed over as an open descriptor (/proc/self/fd/N): the scratch folder
    it lies in stays the worker's."""

    fds: tuple[int, ...] = ()
    if user is not None:
        path = request["checkpoint"]
        os.chown(path, user.uid, user.gid)  # the worker's scratch copy, made for this
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        request = {**request, "checkpoint": f"/proc/self/fd/{fd}"}
        fds = (fd,)
    try:
        process = subprocess.run(
            [*run_as.prefix(user), sys.executable, "-m", "webapp.domain.validation.deep_checks"],
            input=json.dumps({**request, "cwd": str(settings.BASE_DIR)}),
            capture_output=True,
            text=True,
            timeout=settings.VALIDATION_TIMEOUT_S,
            env={**child_env(), "PYTHONPATH": str(settings.BASE_DIR)},
            cwd=settings.BASE_DIR,
            pass_fds=fds,
        )
    finally:
        for fd in fds:
            os.close(fd)
    try:
        return json.loads(process.stdout)
    except ValueError:
        tail = process.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "message": f"the check exited with {process.returncode}: {tail[0]}"}


def deep_levels(validation, scratch: Path, files: list[str], timings: dict) -> list[dict]:
    """The forward and replay levels the project turned on (deep_checks.py)."""

    checkpoint = validation.checkpoint
    config = checkpoint.project.restore_checks or {}
    if not (config.get("forward") or config.get("replay")):
        return []
    user = run_as.for_project(checkpoint.project.slug)  # RunAsRefused: it cannot run
    try:
        main_file = str(_main_file(scratch, files, config.get("file")))
    except ConfigRefused as exc:
        return [{"level": "config", "ok": False, "message": str(exc), "severity": "corrupt"}]
    levels = []
    if config.get("forward"):
        started = time.perf_counter()
        result = _child_check(
            {"level": "forward", "entry": config["forward"], "checkpoint": main_file}, user
        )
        timings["forward_s"] = time.perf_counter() - started
        levels.append(
            {
                "level": "forward",
                "ok": result["ok"],
                "message": result["message"],
                "severity": "info" if result["ok"] else "corrupt",
            }
        )
    if config.get("replay"):
        steps = int(config.get("replay_steps", 5))
        rtol = float(config.get("replay_rtol", 1e-4))
        metric = config.get("replay_metric", "loss")
        started = time.perf_counter()
        result = _child_check(
            {"level": "replay", "entry": config["replay"], "checkpoint": main_file, "steps": steps},
            user,
        )
        timings["replay_s"] = time.perf_counter() - started
        levels.append(_compare_replay(result, checkpoint, metric, rtol, MetricPoint))
    return levels


def _compare_replay(result: dict, checkpoint, metric: str, rtol: float, MetricPoint) -> dict:  # noqa: N803
    level = {"level": "replay", "severity": "suspicious"}
    if not result.get("ok"):
        return {**level, "ok": False, "message": result.get("message", "it did not run")}
    replayed = {step: loss for step, loss in result["losses"]}
    reported = {
        step: values.get(metric)
        for step, values in MetricPoint.objects.filter(
            run_id=checkpoint.run_id, step__in=list(replayed)
        ).values_list("step", "values")
    }
    common = sorted(s for s in replayed if isinstance(reported.get(s), int | float))
    if not common:
        return {
            **level,
            "ok": False,
            "message": f"the run reported no {metric} for steps "
            f"{min(replayed, default=0)}-{max(replayed, default=0)}: nothing to compare",
        }
    worst_step = max(common, key=lambda s: abs(replayed[s] - reported[s]))
    worst = abs(replayed[worst_step] - reported[worst_step])
    allowed = rtol * abs(reported[worst_step]) + 1e-7
    summary = (
        f"{len(common)} steps ({common[0]}-{common[-1]}) replayed; the largest difference is "
        f"{worst:.3g} at step {worst_step} ({replayed[worst_step]:.6g} against "
        f"{reported[worst_step]:.6g} reported; tolerance {rtol:g} relative)"
    )
    if worst > allowed:
        return {
            **level,
            "ok": False,
            "message": f"the resumed training does not follow the run: {summary}",
        }
    return {**level, "ok": True, "severity": "info", "message": summary}
