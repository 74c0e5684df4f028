"""The load check of a checkpoint, run in a child process with a memory and time limit.

The parent side (this module) imports neither torch nor Django: it starts
`python -m webapp.domain.validation.inspect_child`, hands it the request as JSON and reads
one JSON object back. Whatever the child meets (a truncated zip, a malicious pickle, a
tensor bigger than memory, a hang, a segfault in a C extension), the worker survives and
the checkpoint gets a finding that says what happened.

Two ways to run the child:

- fresh (the default): a new interpreter per check, limits set in preexec_fn. Each check
  pays for `import torch` (about 2 s on a small machine).
- warm (`warm=True`): a helper process that has imported torch once forks a child per
  check, which sets the same limits on itself before it looks at any file. The helper
  never loads a checkpoint and never runs torch code, so forking it is safe (torch has
  started no threads). Use it where checks are frequent (a validate worker, the
  benchmark); `start_warm_inspector()` starts the helper ahead of the first check.

The warm helper (`warm_helper(module)`) and the forking loop on the helper's side
(`serve_forked(handler)`) serve any child module whose `--serve` calls serve_forked: the
restore test's load (webapp/domain/restore_load.py) runs the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from lifeboat.units import human_size

CHILD_MODULE = "webapp.domain.validation.inspect_child"
PROJECT_ROOT = str(Path(__file__).resolve().parents[3])
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
STDERR_TAIL = 4000
# How long past its own timeout the warm helper may take to answer before it is presumed
# stuck and replaced.
HELPER_GRACE_S = 30.0

FORMATS = ("torch", "lightning", "safetensors", "dcp", "hf-trainer", "unknown")
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
) -> dict:
    """Loads and scans a checkpoint in a child process; never raises for a bad checkpoint
    or a dead child.

    `base` is a local directory holding the checkpoint, `files` the paths (relative to
    base) of all its files, whose sizes and hashes were checked before; `single_file` says
    the checkpoint is the one file in `files`. Returns

        {"format": "torch" | "lightning" | "safetensors" | "dcp" | "hf-trainer" | "unknown",
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
    """
    request = {
        "base": str(base),
        "files": [str(f) for f in files],
        "single_file": bool(single_file),
        "format_hint": format_hint or "",
    }
    address_space = memory_bytes + largest_file(str(base), request["files"])
    started = time.monotonic()
    if warm:
        outcome = _warm_helper().run(request, address_space, timeout_s)
    else:
        outcome = run_fresh_child(request, address_space, timeout_s)
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


def apply_limits(address_space: int | None) -> None:
    """In the child, before it reads anything: no core dumps, bounded address space (None:
    unbounded, for a GPU child, whose CUDA reserves far more than it uses)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if address_space is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        address_space = min(address_space, hard)
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))


# The only parts of the worker's environment the child gets: it needs no database or
# storage credentials, and reads files from strangers.
CHILD_ENV_PREFIXES = (
    "PATH",
    "HOME",
    "LANG",
    "LC_",
    "TMPDIR",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "OMP_",
    "MKL_",
    "KMP_",
    "TORCH_",
    "MALLOC_",
)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(CHILD_ENV_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p)
    # Each glibc malloc arena reserves 64 MiB of address space; with one per thread they
    # would eat the RLIMIT_AS budget on a machine with many cores.
    env.setdefault("MALLOC_ARENA_MAX", "2")
    # The scan is bound by memory bandwidth: a few threads saturate it, and each thread's
    # stack also counts against RLIMIT_AS.
    env.setdefault("OMP_NUM_THREADS", str(min(os.cpu_count() or 1, 8)))
    return env


def child_command(*extra: str, module: str = CHILD_MODULE) -> list[str]:
    return [sys.executable, "-W", "ignore", "-m", module, *extra]


def run_fresh_child(request: dict, address_space: int, timeout_s: float) -> dict:
    """Runs the check in a new interpreter. Returns the raw outcome: {"timed_out": True}
    or {"returncode", "stdout", "stderr"}."""
    try:
        proc = subprocess.Popen(
            child_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=PROJECT_ROOT,
            env=child_env(),
            preexec_fn=lambda: apply_limits(address_space),
            start_new_session=True,  # its own process group, killed as one on timeout
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"returncode": None, "stdout": "", "stderr": f"could not start: {exc}"}
    try:
        out, err = proc.communicate(json.dumps(request).encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return {"timed_out": True}
    return {
        "returncode": proc.returncode,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace")[-STDERR_TAIL:],
    }


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return  # already gone
    except PermissionError:
        proc.kill()


# --------------------------------------------------------------------------- the warm helper


class WarmHelper:
    """Talks to `<module> --serve` (inspect_child by default): one JSON line per request
    on its stdin, one JSON line per answer on its stdout. One check at a time per helper
    (a lock guards it); a helper that dies or stops answering is replaced at the next
    check."""

    def __init__(self, module: str = CHILD_MODULE) -> None:
        self.module = module
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._buffer = b""

    def ensure_started(self) -> None:
        with self._lock:
            self._start_if_needed()

    @property
    def pid(self) -> int | None:
        """The helper's process id while it runs (what an operator or a test may kill)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def stop(self) -> None:
        """Ends the helper; the next request starts a new one (which pays for its imports)."""
        with self._lock:
            self._stop()

    def run(self, request: dict, address_space: int | None, timeout_s: float) -> dict:
        job = {"request": request, "address_space": address_space, "timeout_s": timeout_s}
        line = (json.dumps(job) + "\n").encode()
        with self._lock:
            for attempt in (1, 2):
                self._start_if_needed()
                try:
                    self._proc.stdin.write(line)
                    self._proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    # A helper that died between checks: start another, once.
                    self._stop()
                    if attempt == 2:
                        return _helper_failure("the load check helper could not be reached")
                    continue
                answer = self._read_answer(timeout_s + HELPER_GRACE_S)
                if answer is None:
                    self._stop()
                    return _helper_failure("the load check helper stopped answering")
                return answer
        raise AssertionError("unreachable")

    def _start_if_needed(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._buffer = b""
        self._proc = subprocess.Popen(
            child_command("--serve", module=self.module),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=PROJECT_ROOT,
            env=child_env(),
            preexec_fn=_no_core_dumps,
            start_new_session=True,
        )

    def _read_answer(self, timeout_s: float) -> dict | None:
        deadline = time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            return None

    def _stop(self) -> None:
        if self._proc is None:
            return
        _kill_group(self._proc)
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self._proc = None


def _no_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _helper_failure(why: str) -> dict:
    return {"returncode": None, "stdout": "", "stderr": why}


_helpers: dict[str, WarmHelper] = {}
_helpers_pid = 0
_helper_lock = threading.Lock()


def warm_helper(module: str = CHILD_MODULE) -> WarmHelper:
    """This process's helper for `module`, created on first use (not yet started)."""
    global _helpers_pid
    with _helper_lock:
        if _helpers_pid != os.getpid():
            # A forked worker (Celery prefork) must not share its parent's helpers and pipes.
            _helpers.clear()
            _helpers_pid = os.getpid()
        if module not in _helpers:
            _helpers[module] = WarmHelper(module)
        return _helpers[module]


_warm_helper = warm_helper  # the validation's own name for it


# --------------------------------------------------------------------------- the helper's side


def serve_forked(handler, out_of_memory_exit: int = 1) -> int:
    """The helper's loop, for a child module's `--serve` (it runs in the helper, which
    imported what `handler` needs, torch, once): each request line {"request",
    "address_space", "timeout_s"} is run as `handler(request) -> dict` in a forked child
    under the limits, and answered with one line {"returncode", "stdout", "stderr"} or
    {"timed_out": true}. The helper itself never opens a checkpoint, so whatever a file
    does to the child (a crash, the OOM killer) leaves it as it was. It ends when its
    stdin closes (the worker is gone). Never call it in a process that started CUDA or
    threads: the children are forked."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        limit = None if job["address_space"] is None else int(job["address_space"])
        answer = _run_forked(
            handler, job["request"], limit, float(job["timeout_s"]), answers.fileno(),
            out_of_memory_exit,
        )  # fmt: skip
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    return 0


def _run_forked(
    handler, request: dict, address_space: int | None, timeout_s: float, answers_fd: int,
    out_of_memory_exit: int,
) -> dict:  # fmt: skip
    result_r, result_w = os.pipe()
    errors_r, errors_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: limits first, then the handler; it never returns
        # Nothing of the helper's conversation with the worker stays open in the child.
        for fd in (result_r, errors_r, answers_fd):
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(errors_w, 1)
        os.dup2(errors_w, 2)
        os.setsid()  # its own process group, as a fresh child has, killed as one
        _forked_child(handler, request, address_space, result_w, out_of_memory_exit)
    os.close(result_w)
    os.close(errors_w)
    outputs = _collect({result_r: bytearray(), errors_r: bytearray()}, timeout_s)
    if outputs is None:
        _kill_forked(pid)
        os.waitpid(pid, 0)
        return {"timed_out": True}
    _, status = os.waitpid(pid, 0)
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "stdout": outputs[result_r].decode("utf-8", "replace"),
        "stderr": outputs[errors_r][-STDERR_TAIL:].decode("utf-8", "replace"),
    }


def _forked_child(handler, request, address_space, result_fd, out_of_memory_exit) -> None:
    code = 1
    try:
        apply_limits(address_space)
        data = json.dumps(handler(request)).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(result_fd, view) :]
        code = 0
    except MemoryError:
        code = out_of_memory_exit
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        os._exit(code)


def _kill_forked(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        # Killed before its setsid(): no group of that id yet, but the process exists.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _collect(buffers: dict[int, bytearray], timeout_s: float) -> dict[int, bytes] | None:
    """Reads the child's pipes until both close; None when the time runs out first."""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        open_fds = set(buffers)
        try:
            while open_fds:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                for key, _ in selector.select(remaining):
                    chunk = os.read(key.fd, 1 << 20)
                    if chunk:
                        buffers[key.fd] += chunk
                    else:
                        selector.unregister(key.fd)
                        open_fds.discard(key.fd)
        finally:
            for fd in buffers:
                os.close(fd)
    return {fd: bytes(data) for fd, data in buffers.items()}


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
