"""Slurm through its command-line client: submit a batch script, read a job's state,
cancel it. Pure functions, no Django: the launch worker calls them on a host where the
Slurm client works (a login node, or the single-node cluster of
scripts/slurm_single_node.sh); see docs/slurm.md.

- submit(): the script is written beside the job's output file and submitted with
  `sbatch --parsable`; the job's environment is exactly `env` (plus the SLURM_* variables
  Slurm always sets), handed to sbatch on a pipe (`--export-file=<fd>`: values may hold
  commas, spaces, quotes, newlines), never `--export=ALL`, which would hand the job
  everything of the launch worker's.
- Every Slurm command is found on the worker's own PATH and run with a minimal
  environment of the worker's (client_env): a launch profile chooses neither the program
  nor how it loads.
- state(): `squeue` while the job is queued or running; once it has left the queue,
  `scontrol show job` (kept for MinJobAge seconds) and then `sacct` (when accounting is
  on). A job none of them knows any more is UNKNOWN and final; a controller that does
  not answer (an error, or no answer within the timeout) gives UNREACHABLE, not final:
  ask again later.
- cancel(): `scancel`; cancelling a job that has already ended is not an error.

Every call has a timeout (LaunchTimeout, a LaunchError). A missing command raises
LaunchError saying so.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from shutil import which

SUBMIT_TIMEOUT_S = 60.0
QUERY_TIMEOUT_S = 30.0

# States after which a job never runs again.
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
    }
)

_JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INVALID_JOB = "Invalid job id"


class LaunchError(RuntimeError):
    """A Slurm command failed, timed out, or is not installed."""


class LaunchTimeout(LaunchError):
    """A Slurm command did not answer in time (for sbatch: the job may exist anyway)."""


@dataclass(frozen=True)
class JobState:
    """One look at a job. `state` is Slurm's (PENDING, RUNNING, COMPLETING, COMPLETED,
    FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, ...), or UNKNOWN (Slurm no longer
    knows the job: final) or UNREACHABLE (the controller did not answer: not final).
    `exit_code` is the batch script's exit status once the job has ended (None before, and
    when no command could tell); `signal` the signal that ended it (ExitCode=N:S), if any."""

    state: str
    exit_code: int | None
    reason: str
    final: bool
    signal: int | None = None
    source: str = ""  # the command that answered: squeue, scontrol or sacct


def available() -> bool:
    """Whether the Slurm client is installed on this host."""

    return all(which(name) for name in ("sbatch", "squeue", "scontrol", "scancel"))


# What a Slurm command itself is given of the worker's environment: where programs are,
# whose it is, and Slurm's own client settings (SLURM_CONF, SBATCH_* defaults the
# deployment set). Nothing else of the worker's (its secrets), and nothing of a profile's:
# a profile's PATH or LD_PRELOAD must never choose or change the program the worker runs.
CLIENT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "SLURM_CONF")


def client_env() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if name in CLIENT_ENV or name.startswith(("SBATCH_", "SQUEUE_", "SACCT_"))
    }


def program(name: str) -> str:
    """The absolute path of a Slurm command, looked up on the worker's own PATH."""

    found = which(name, path=os.environ.get("PATH", os.defpath))
    if not found:
        raise LaunchError(
            f"{name} not found: is this worker on a Slurm login node? "
            f"(the Slurm client must be on PATH={os.environ.get('PATH', '')})"
        )
    return found


def _run(
    args: list[str], *, timeout: float, pass_fds: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    args = [program(args[0]), *args[1:]]
    try:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=client_env(),
            stdin=subprocess.DEVNULL,
            check=False,
            pass_fds=pass_fds,
        )
    except FileNotFoundError as exc:
        raise LaunchError(f"{args[0]} could not be run: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise LaunchTimeout(f"{args[0]} did not answer within {timeout:g} s") from exc


def _check_job_id(job_id: str) -> str:
    job_id = str(job_id).strip()
    if not _JOB_ID.match(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return job_id


def _message(proc: subprocess.CompletedProcess[str]) -> str:
    text = (proc.stderr or "").strip() or (proc.stdout or "").strip()
    return text or f"exit status {proc.returncode}"


def submit(
    script_text: str,
    *,
    job_name: str,
    output_path: str,
    workdir: str,
    env: dict[str, str],
) -> str:
    """Submit `script_text` as a batch job; return its job id.

    The script is written to `<dir of output_path>/<job_name>.sbatch` (a `#!/bin/bash`
    line is put first when it has none); the job's stdout and stderr go to `output_path`
    (Slurm's patterns such as %j work), it starts in `workdir`, and its environment is
    `env` and Slurm's own SLURM_* variables, nothing else of this process's (sbatch
    `--export-file`; `--export=NONE` when `env` is empty). No value belongs in the
    script text: pass values through `env`.
    """
    if not _JOB_NAME.match(job_name):
        raise ValueError(f"job name must be letters, digits, '.', '_' or '-': {job_name!r}")
    for name, value in env.items():
        if not _ENV_NAME.match(name) or not isinstance(value, str) or "\0" in value:
            raise ValueError(f"bad environment variable for the job: {name!r}")
    output = Path(os.path.abspath(output_path))
    workdir = os.path.abspath(workdir)
    if not os.path.isdir(workdir):
        # Slurm would run the job in /tmp instead, and say so only in the job's output.
        raise LaunchError(f"the job's working directory does not exist: {workdir}")
    output.parent.mkdir(parents=True, exist_ok=True)
    if not script_text.startswith("#!"):
        script_text = "#!/bin/bash\n" + script_text
    script = output.parent / f"{job_name}.sbatch"
    tmp = script.with_name(script.name + ".tmp")
    tmp.write_text(script_text)
    tmp.chmod(0o700)
    tmp.replace(script)
    # The job's environment goes to sbatch on a pipe (--export-file=<fd>, NUL-separated):
    # exactly those variables, and no value in sbatch's command line (which every user of
    # the host can read in /proc) nor in its own environment.
    payload = b"".join(f"{k}={v}".encode() + b"\0" for k, v in sorted(env.items()))
    if len(payload) > 60_000:  # a pipe's buffer: written before sbatch reads it
        raise LaunchError("the job's environment is too large to hand to sbatch")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, payload)
        os.close(write_end)
        write_end = -1
        proc = _run(
            [
                "sbatch",
                "--parsable",
                f"--job-name={job_name}",
                f"--output={output}",
                f"--chdir={workdir}",
                f"--export-file={read_end}" if env else "--export=NONE",
                str(script),
            ],
            timeout=SUBMIT_TIMEOUT_S,
            pass_fds=(read_end,),
        )
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    if proc.returncode != 0:
        raise LaunchError(f"sbatch failed: {_message(proc)}")
    # --parsable prints "ID" or "ID;cluster".
    first = (proc.stdout or "").strip().splitlines()
    job_id = first[-1].split(";", 1)[0].strip() if first else ""
    if not _JOB_ID.match(job_id):
        raise LaunchError(f"sbatch printed no job id: {proc.stdout!r} {proc.stderr!r}")
    return job_id


def _exit_code(text: str) -> tuple[int | None, int | None]:
    match = re.match(r"^(\d+):(\d+)$", text.strip())
    if not match:
        return None, None
    code, sig = int(match[1]), int(match[2])
    return code, (sig or None)


def _from_squeue(job_id: str) -> JobState | None:
    try:
        proc = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], timeout=QUERY_TIMEOUT_S)
    except LaunchTimeout as exc:
        return JobState("UNREACHABLE", None, str(exc), False, source="squeue")
    if proc.returncode != 0:
        if _INVALID_JOB in _message(proc):
            return None
        return JobState("UNREACHABLE", None, f"squeue: {_message(proc)}", False, source="squeue")
    line = proc.stdout.strip().splitlines()
    if not line:
        return None
    state, _, reason = line[0].partition("|")
    state = state.strip().split()[0] if state.strip() else "UNKNOWN"
    return JobState(state, None, reason.strip(), state in FINAL_STATES, source="squeue")


def _field(line: str, name: str) -> str | None:
    # `scontrol -o` prints Key=Value pairs separated by spaces; JobState, Reason and
    # ExitCode come before the free-text fields (Command, WorkDir, StdOut).
    match = re.search(rf"(?:^|\s){name}=(\S*)", line)
    return match[1] if match else None


def _from_scontrol(job_id: str) -> JobState | None:
    try:
        proc = _run(["scontrol", "-o", "show", "job", job_id], timeout=QUERY_TIMEOUT_S)
    except LaunchTimeout as exc:
        return JobState("UNREACHABLE", None, str(exc), False, source="scontrol")
    if proc.returncode != 0:
        if _INVALID_JOB in _message(proc):
            return None
        return JobState(
            "UNREACHABLE", None, f"scontrol: {_message(proc)}", False, source="scontrol"
        )
    line = proc.stdout.strip().splitlines()
    if not line or _field(line[0], "JobState") is None:
        return None
    state = _field(line[0], "JobState") or "UNKNOWN"
    final = state in FINAL_STATES
    code, sig = _exit_code(_field(line[0], "ExitCode") or "") if final else (None, None)
    reason = _field(line[0], "Reason") or ""
    return JobState(state, code, "" if reason == "None" else reason, final, sig, "scontrol")


def _from_sacct(job_id: str) -> JobState | None:
    try:
        proc = _run(
            ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"],
            timeout=QUERY_TIMEOUT_S,
        )
    except LaunchError:
        return None  # sacct is optional
    if proc.returncode != 0:
        return None  # e.g. "Slurm accounting storage is disabled"
    for line in proc.stdout.strip().splitlines():
        state_text, _, code_text = line.partition("|")
        if not state_text.strip():
            continue
        state = state_text.split()[0]  # "CANCELLED by 0"
        final = state in FINAL_STATES
        code, sig = _exit_code(code_text) if final else (None, None)
        return JobState(state, code, "", final, sig, "sacct")
    return None


def state(job_id: str) -> JobState:
    """Where the job is now; see JobState."""
    job_id = _check_job_id(job_id)
    queued = _from_squeue(job_id)
    if queued is not None and not queued.final:
        return queued
    ended = _from_scontrol(job_id)
    if ended is not None and ended.state != "UNREACHABLE":
        return ended
    accounted = _from_sacct(job_id)
    if accounted is not None:
        return accounted
    if ended is not None:
        return ended  # UNREACHABLE
    if queued is not None:
        return queued  # final in squeue, but no exit code to be had
    return JobState(
        "UNKNOWN",
        None,
        f"Slurm no longer knows job {job_id} (gone from squeue and scontrol after "
        "MinJobAge, and sacct has no record)",
        True,
        source="",
    )


def cancel(job_id: str) -> None:
    """Cancel the job (scancel). A job that has already ended, or that Slurm no longer
    knows, is left as it is without an error."""
    job_id = _check_job_id(job_id)
    proc = _run(["scancel", job_id], timeout=QUERY_TIMEOUT_S)
    if proc.returncode != 0:
        text = _message(proc)
        if _INVALID_JOB in text or "already completing or completed" in text:
            return
        raise LaunchError(f"scancel {job_id} failed: {text}")


def wait(job_id: str, *, timeout: float, interval: float = 0.5) -> JobState:
    """Look every `interval` seconds until the job is final; TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        now = state(job_id)
        if now.final:
            return now
        if time.monotonic() >= deadline:
            raise TimeoutError(f"Slurm job {job_id} still {now.state} after {timeout:g} s")
        time.sleep(interval)
