"""The load check of a checkpoint, run in a child process with a memory and time limit.

The parent side (this module) imports neither torch nor Django: it starts
`python -m webapp.domain.validation.inspect_child`, hands it the request as JSON and reads
one JSON object back. Whatever the child meets (a truncated zip, a malicious pickle, a
tensor bigger than memory, a hang, a segfault in a C extension), the worker survives and
the checkpoint gets a finding that says what happened.

The child runs in the sandbox (sandbox.py): fresh, a new interpreter per check (the
default; each pays for `import torch`, about 2 s on a small machine), or warm
(`warm=True`), forked from a helper that imported torch once, under the same limits. Use
warm where checks are frequent (a validate worker, the benchmark);
`start_warm_inspector()` starts the helper ahead of the first check. The sandbox's names
(WarmHelper, serve_forked, run_fresh_child, apply_limits, child_env) are importable from
here too. What the child checks per format is the formats' (webapp/domain/formats, one
module per format); inspect_child hands each file to the format that claims it.
"""

from __future__ import annotations

import json
import os
import signal
import time

from lifeboat.units import human_size
from webapp.domain.child_payloads import InspectRequest
from webapp.domain.validation.sandbox import (  # noqa: F401  (re-exported)
    PROJECT_ROOT,
    WarmHelper,
    apply_limits,
    child_env,
    run_fresh_child,
    serve_forked,
)
from webapp.domain.validation.sandbox import warm_helper as sandbox_warm_helper

CHILD_MODULE = "webapp.domain.validation.inspect_child"
# The child exits with this status when it runs out of memory (inspect_child has the same).
EXIT_OUT_OF_MEMORY = 3
# What an allocation failure looks like on the child's stderr when it could not exit with
# EXIT_OUT_OF_MEMORY itself (in `import torch`, in C++ code, ...).
MEMORY_SIGNS = (
    "MemoryError",
    "Cannot allocate memory",
    "failed to map segment",
    "std::bad_alloc",
    "can't allocate memory",
)

SEVERITIES = ("corrupt", "suspicious", "info", "error")


def inspect_checkpoint(
    base: str,
    files: list[str],
    single_file: bool,
    format_hint: str = "",
    *,
    timeout_s: float = 600,
    memory_bytes: int = 8 << 30,
    warm: bool = False,
    only: list[str] | None = None,
    raw_values: bool = False,
    slot: int = 0,
    threads: int | None = None,
) -> dict:
    """Loads and scans a checkpoint in a child process; never raises for a bad checkpoint
    or a dead child.

    `base` is a local directory holding the checkpoint, `files` the paths (relative to
    base) of all its files, whose sizes and hashes were checked before; `single_file` says
    the checkpoint is the one file in `files`. Returns

        {"format": a format's name (webapp.domain.formats.names()) | "unknown",
         "tensors": int, "parameters": int, "dtypes": {"float32": count, ...},
         "keys": {"<file>:<dotted.key>": [dtype, [shape...]], ...},
         "findings": [{"severity": "corrupt" | "suspicious" | "info" | "error",
                       "code": str, "message": str,
                       "file": str (optional), "tensors": [names] (optional)}],
         "timings": {"load_s": float, "scan_s": float}}

    A check that could not finish (codes load_timeout, load_out_of_memory, load_crashed,
    severity "error") says nothing about the checkpoint's content: its keys are empty and
    must not be diffed against another checkpoint's.

    Memory: `memory_bytes` bounds what the child allocates. The child maps weight files
    (mmap) rather than reading them, and a mapping counts against RLIMIT_AS although it
    takes no memory of its own, so the address-space limit is `memory_bytes` plus the size
    of the largest file (the child maps one file at a time). torch alone maps about
    550 MiB, so a limit below ~700 MiB fails every check as out of memory.

    `warm=True` runs the check in a child forked from a helper that imported torch once
    (see the module docstring): the same limits, without paying for `import torch`.

    One part of a checkpoint checked in parts (inspect_parts): `only` names the files whose
    contents this child reads, `raw_values` leaves the NaN/Inf summary to the merge, and
    `slot` picks one of several warm helpers, so that parts run at the same time, and
    `threads` bounds the child's torch threads (parts at once share the cores: an
    oversubscribed NaN scan runs several times slower).
    """
    request: InspectRequest = {
        "base": str(base),
        "files": [str(f) for f in files],
        "single_file": bool(single_file),
        "format_hint": format_hint or "",
    }
    if only is not None:
        request["only"] = [str(f) for f in only]
    if raw_values:
        request["raw_values"] = True
    if threads:
        request["threads"] = int(threads)
    address_space = memory_bytes + largest_file(str(base), request.get("only", request["files"]))
    started = time.monotonic()
    if warm:
        outcome = warm_helper(CHILD_MODULE, slot).run(request, address_space, timeout_s)
    else:
        outcome = run_fresh_child(request, address_space, timeout_s, CHILD_MODULE)
    return interpret(outcome, timeout_s, memory_bytes, time.monotonic() - started)


def start_warm_inspector() -> None:
    """Starts the warm helper now (it imports torch, which takes a while), so that the first
    `inspect_checkpoint(..., warm=True)` does not wait for it."""
    _warm_helper().ensure_started()


# --------------------------------------------------------------------------- running a child


def largest_file(base: str, files: list[str]) -> int:
    sizes = []
    for rel in files:
        try:
            sizes.append(os.path.getsize(os.path.join(base, rel)))
        except OSError:
            continue  # a missing file gets its own finding; it maps nothing
    return max(sizes, default=0)


def warm_helper(module: str = CHILD_MODULE, slot: int = 0) -> WarmHelper:
    """This process's warm helper for `module` (the load check's child by default); each
    `slot` is a helper of its own, for checks that run at the same time."""
    return sandbox_warm_helper(module, slot)


_warm_helper = warm_helper  # the validation's own name for it


# --------------------------------------------------------------------------- the result


def interpret(outcome: dict, timeout_s: float, memory_bytes: int, elapsed_s: float) -> dict:
    """Turns what the child did into the result: its JSON when it finished, otherwise an
    error finding that says why it did not."""
    if outcome.get("timed_out"):
        return failure(
            "load_timeout", f"the load check did not finish within {timeout_s:g} s", elapsed_s
        )
    returncode, stderr = outcome.get("returncode"), outcome.get("stderr", "")
    if returncode == 0:
        result = _parse_result(outcome.get("stdout", ""))
        if result is not None:
            return result
        return failure(
            "load_crashed",
            "the load check crashed: it finished without a readable result" + _last_words(stderr),
            elapsed_s,
        )
    if returncode == EXIT_OUT_OF_MEMORY or returncode == -signal.SIGKILL or _ran_out(stderr):
        # SIGKILL that was not our timeout: the kernel's OOM killer (or a cgroup limit).
        return failure(
            "load_out_of_memory",
            f"the load check needed more than its {human_size(memory_bytes)} memory limit",
            elapsed_s,
        )
    return failure(
        "load_crashed",
        f"the load check crashed ({_how(returncode)})" + _last_words(stderr),
        elapsed_s,
    )


def failure(code: str, message: str, elapsed_s: float = 0.0) -> dict:
    return {
        "format": "unknown",
        "tensors": 0,
        "parameters": 0,
        "dtypes": {},
        "keys": {},
        "findings": [{"severity": "error", "code": code, "message": message}],
        "timings": {"load_s": round(elapsed_s, 6), "scan_s": 0.0},
    }


def _parse_result(stdout: str) -> dict | None:
    try:
        result = json.loads(stdout)
    except ValueError:
        return None
    expected = ("format", "tensors", "parameters", "dtypes", "keys", "findings", "timings")
    if not isinstance(result, dict) or not all(k in result for k in expected):
        return None
    return result


def _ran_out(stderr: str) -> bool:
    return any(sign in stderr for sign in MEMORY_SIGNS)


def _how(returncode: int | None) -> str:
    if returncode is None:
        return "it could not run"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _last_words(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return f": {lines[-1][:300]}" if lines else ""
