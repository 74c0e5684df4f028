"""A child process with a memory and time limit, for code that opens files from
strangers (the validation's load check, the restore test's load).

Two ways to run a child module:

- fresh: a new interpreter per request (`run_fresh_child`), limits set in preexec_fn. Each
  request pays for the child's imports (`import torch`: about 2 s on a small machine).
- warm: a helper process (`WarmHelper`, `<module> --serve`) that imported what it needs
  once forks a child per request (`serve_forked`, on the helper's side), which sets the
  same limits on itself before it looks at any file. The helper never opens a file and
  never runs torch code, so forking it is safe (torch has started no threads).

Whatever the child meets (a truncated zip, a malicious pickle, a tensor bigger than
memory, a hang, a segfault in a C extension), the caller survives and gets the raw
outcome: {"timed_out": True} or {"returncode", "stdout", "stderr"}. This module imports
only the standard library.
"""

from __future__ import annotations

import contextlib
import gc
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
from collections.abc import Mapping
from pathlib import Path

PROJECT_ROOT = str(Path(__file__).resolve().parents[3])
STDERR_TAIL = 4000
# How long past its own timeout the warm helper may take to answer before it is presumed
# stuck and replaced.
HELPER_GRACE_S = 30.0


# --------------------------------------------------------------------------- limits


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
    # Idle OpenMP threads sleep rather than spin. Children of several workers (or parts)
    # on one host share its cores; spinning threads then steal each other's time: two
    # workers' scans of an 8 GiB DCP checkpoint took 3.6 s each instead of 0.28 s.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def child_command(*extra: str, module: str) -> list[str]:
    return [sys.executable, "-W", "ignore", "-m", module, *extra]


def run_fresh_child(
    request: Mapping, address_space: int | None, timeout_s: float, module: str
) -> dict:
    """Runs the check in a new interpreter. Returns the raw outcome: {"timed_out": True}
    or {"returncode", "stdout", "stderr"}."""
    try:
        proc = subprocess.Popen(
            child_command(module=module),
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

    def __init__(self, module: str) -> None:
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

    def run(self, request: Mapping, address_space: int | None, timeout_s: float) -> dict:
        job = {"request": request, "address_space": address_space, "timeout_s": timeout_s}
        line = (json.dumps(job) + "\n").encode()
        with self._lock:
            for attempt in (1, 2):
                self._start_if_needed()
                # Started just above, with a pipe for its stdin.
                assert self._proc is not None and self._proc.stdin is not None
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
        # Only called on a started helper (run()), whose stdout is a pipe.
        assert self._proc is not None and self._proc.stdout is not None
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
            assert stream is not None  # both are pipes (_start_if_needed)
            with contextlib.suppress(OSError):
                stream.close()
        self._proc = None


def _no_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _helper_failure(why: str) -> dict:
    return {"returncode": None, "stdout": "", "stderr": why}


_helpers: dict[tuple[str, int], WarmHelper] = {}
_helpers_pid = 0
_helper_lock = threading.Lock()


def warm_helper(module: str, slot: int = 0) -> WarmHelper:
    """This process's helper number `slot` for `module`, created on first use (not yet
    started). One helper runs one request at a time; requests that must run at the same
    time use different slots."""
    global _helpers_pid
    with _helper_lock:
        if _helpers_pid != os.getpid():
            # A forked worker (Celery prefork) must not share its parent's helpers and pipes.
            _helpers.clear()
            _helpers_pid = os.getpid()
        if (module, slot) not in _helpers:
            _helpers[module, slot] = WarmHelper(module)
        return _helpers[module, slot]


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
    # Everything imported so far (torch: 170,000 objects) lives as long as the helper: out
    # of the collector's sight, a child's gc.collect() between two files takes microseconds
    # instead of 0.13 s, and collections do not copy the shared pages.
    gc.freeze()
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
