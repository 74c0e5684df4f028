"""CPU accounting for bench/ingest.py: the cores a phase's server, PostgreSQL, Redis, wrk
and the other programs used, read from /proc.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ingest_common import LIFEBOAT_DB, MLFLOW_DB

# --- CPU accounting -----------------------------------------------------------------


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_stats() -> list[tuple[int, str, int, float]]:
    """(pid, comm, process group, CPU seconds) of every process."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        # fields[0] is state (field 3); pgrp is field 5, utime 14, stime 15.
        seconds = (int(fields[11]) + int(fields[12])) / CLK_TCK
        out.append((int(entry.name), comm, int(fields[2]), seconds))
    return out


def _postgres_is_ours(pid: int) -> bool:
    """A backend serving a bench database, or one of the server's shared processes (WAL
    writer, checkpointer, ...); not the backends of other databases."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    words = cmdline.removeprefix("postgres: ").split()
    if words and words[0].endswith(":"):  # the cluster name, e.g. "15/main:"
        words = words[1:]
    client = len(words) >= 3 and (words[2].endswith(")") or words[2] == "[local]")
    return not client or words[1] in (LIFEBOAT_DB, MLFLOW_DB)


def _total_busy() -> tuple[float, float]:
    """CPU seconds all cores spent busy (not idle, iowait or steal), and stolen by the
    hypervisor, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:7]) - values[3] - values[4]) / CLK_TCK, values[7] / CLK_TCK


@dataclass
class CpuSnapshot:
    at: float
    by_pid: dict[int, tuple[str, float]]
    children: float
    busy: float
    steal: float


def cpu_snapshot(server_pgid: int) -> CpuSnapshot:
    by_pid = {}
    for pid, comm, pgrp, seconds in _proc_stats():
        if pgrp == server_pgid:
            group = "server"
        elif comm.startswith("postgres"):
            group = "postgres" if _postgres_is_ours(pid) else "other"
        elif comm.startswith("redis-server"):
            group = "redis"
        elif pid == os.getpid():
            group = "bench"
        else:
            group = "other"
        by_pid[pid] = (group, seconds)
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy, steal = _total_busy()
    return CpuSnapshot(time.monotonic(), by_pid, children.ru_utime + children.ru_stime, busy, steal)


def cpu_usage(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
    """Cores used on average between two snapshots, per group. wrk is the finished
    children of this script; 'other' is the other programs running at the end of the
    window; 'unaccounted' is the rest of the machine's busy time: the kernel's loopback
    networking, and processes that ended within the window (such as PostgreSQL backends
    that a server opens and closes per request); 'steal' is taken by the hypervisor."""
    seconds = after.at - before.at
    used: dict[str, float] = {"server": 0.0, "postgres": 0.0, "redis": 0.0}
    others = 0.0
    for pid, (group, cpu) in after.by_pid.items():
        if group == "bench":
            continue
        start = before.by_pid.get(pid, (group, 0.0))[1]
        if group == "other":
            others += max(0.0, cpu - start)
        else:
            used[group] = used.get(group, 0.0) + max(0.0, cpu - start)
    used["wrk"] = after.children - before.children
    used["other"] = others
    used["unaccounted"] = max(0.0, (after.busy - before.busy) - sum(used.values()))
    used["steal"] = after.steal - before.steal
    return {k: v / seconds for k, v in used.items()}


def wait_idle(server_pgid: int, timeout: float = 180.0) -> float:
    """Wait until the server's processes use (almost) no CPU for over a second: requests
    that wrk cut off when it stopped are still being served. Returns the seconds waited."""
    started = time.monotonic()
    quiet = 0
    last = cpu_snapshot(server_pgid)
    while time.monotonic() - started < timeout and quiet < 3:
        time.sleep(0.4)
        now = cpu_snapshot(server_pgid)
        quiet = quiet + 1 if cpu_usage(last, now)["server"] < 0.05 else 0
        last = now
    return time.monotonic() - started
