"""The deeper levels of a restore test, with code a project admin registered, run in a
child process (python -m webapp.domain.validation.deep_checks; JSON in on stdin, out on stdout).

Project.restore_checks configures them:

    {"forward": "package.module:function",   # -> (model, sample_batch)
     "replay": "package.module:function",    # (checkpoint_path, steps) -> [[step, loss], ...]
     "replay_steps": 5, "replay_rtol": 1e-4}

* forward: the function builds the model and a sample batch. The checkpoint's state dict
  (its "state_dict" or "model" entry, else the whole object) is loaded strictly, so a key
  that is missing or unexpected fails the check with the names; then one forward pass
  runs and every number in the output must be finite.
* replay: the function resumes training from the checkpoint for `steps` steps and returns
  the loss of each. They are compared with the losses the run reported for the same
  steps (`metrics` events): the determinism question of Rojas et al., as a test.

Checkpoints are read with torch.load(weights_only=True) here too; the registered code is
the project's own and trusted as much as its training code, but it still runs in a child
with a time limit, away from the worker's credentials.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import time


def resolve(entry: str):
    module, _, name = entry.partition(":")
    if not module or not name:
        raise ValueError(f"{entry!r} is not an entry point of the form package.module:function")
    return getattr(importlib.import_module(module), name)


def _state_dict(obj):
    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            if isinstance(obj.get(key), dict):
                return obj[key]
    return obj


def _all_finite(value) -> bool:
    import torch  # torch loads only where a checkpoint is opened, never in the web

    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value).all()) if value.is_floating_point() else True
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_all_finite(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return True


def forward(entry: str, checkpoint_file: str) -> dict:
    import torch  # torch loads only where a checkpoint is opened, never in the web

    started = time.perf_counter()
    model, batch = resolve(entry)()
    state = _state_dict(torch.load(checkpoint_file, map_location="cpu", weights_only=True))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        return {
            "ok": False,
            "message": "the checkpoint does not fit the model: "
            + " ".join(line.strip() for line in first[:4])[:800],
        }
    model.eval()
    with torch.no_grad():
        output = model(batch)
    if not _all_finite(output):
        return {"ok": False, "message": "the forward pass gives NaN or Inf"}
    return {
        "ok": True,
        "message": "loads strictly into the model and its forward pass is finite",
        "seconds": time.perf_counter() - started,
    }


def replay(entry: str, checkpoint_file: str, steps: int) -> dict:
    started = time.perf_counter()
    losses = resolve(entry)(checkpoint_file, steps)
    return {
        "ok": True,
        "losses": [[int(s), float(v)] for s, v in losses],
        "seconds": time.perf_counter() - started,
    }


def main() -> int:
    request = json.load(sys.stdin)
    sys.path.insert(0, request.get("cwd", "."))
    try:
        if request["level"] == "forward":
            result = forward(request["entry"], request["checkpoint"])
        else:
            result = replay(request["entry"], request["checkpoint"], int(request["steps"]))
    except Exception as exc:  # noqa: BLE001 (the parent reports it)
        result = {"ok": False, "message": f"{type(exc).__name__}: {str(exc)[:500]}"}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
