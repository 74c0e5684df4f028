"""The load of bench/ingest.py and what it checks: wrk runs with bench/ingest.lua, the
events PostgreSQL stored and the tasks queued in Redis, per measured phase.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field

from ingest_common import LOG_DIR, LUA, PG_HOST, PG_PORT, PROCS, REDIS_URL, BenchError, say
from ingest_cpu import cpu_snapshot, cpu_usage, wait_idle

# --- PostgreSQL and Redis -----------------------------------------------------------


def pg_connect(dbname: str):
    import psycopg

    return psycopg.connect(
        host=PG_HOST, port=PG_PORT, user=os.environ.get("BENCH_PGUSER", "postgres"),
        dbname=dbname, autocommit=True, connect_timeout=10,
    )  # fmt: skip


def recreate_database(name: str) -> None:
    with pg_connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def checkpoint_postgres() -> None:
    """PostgreSQL writes out what is dirty now (CHECKPOINT), so the next phase does not
    pay for an earlier one's writes: the checkpoint a sweep's million rows bring due, and
    the full-page images each page's first change after it puts in the WAL."""
    with pg_connect("postgres") as conn:
        conn.execute("CHECKPOINT")


def drop_database(name: str) -> None:
    with pg_connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_counts(dbname: str, queries: dict[str, str]) -> dict[str, int]:
    """The counts, once two readings half a second apart agree."""
    with pg_connect(dbname) as conn:
        last: dict[str, int] = {}
        for _ in range(20):
            now = {name: conn.execute(sql).fetchone()[0] for name, sql in queries.items()}
            if now == last:
                break
            last = now
            time.sleep(0.5)
        return last


def redis_client():
    import redis

    return redis.Redis.from_url(REDIS_URL, socket_timeout=10)


def queued_checkpoint_ids() -> int:
    """Distinct checkpoint ids waiting on the validate queue: one per validate_checkpoint
    message, all of a batch's in one dispatch_validations message."""
    import base64

    ids: set[int] = set()
    for raw in redis_client().lrange("validate", 0, -1):
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        ids.update(args[0] if isinstance(args[0], list) else [args[0]])
    return len(ids)


# --- wrk --------------------------------------------------------------------------------


@dataclass
class WrkResult:
    duration_s: float
    ok: int
    bad: int
    sent: int
    p50_ms: float
    p99_ms: float
    errors: dict
    first_bad: str


def run_wrk(
    url: str, args: argparse.Namespace, duration: float, lua_args: list[str], connections: int
) -> WrkResult:
    assert url.startswith("http://127.0.0.1:"), url
    threads = min(args.wrk_threads, connections)
    cmd = [
        "wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration))}s",
        f"--timeout={args.request_timeout}s", "-s", str(LUA), url, "--",
        f"threads={threads}", *lua_args,
    ]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=duration + args.request_timeout + 60
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("BENCHJSON ")), None)
    if done.returncode != 0 or line is None:
        raise BenchError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    data = json.loads(line.removeprefix("BENCHJSON "))
    return WrkResult(
        duration_s=data["duration_us"] / 1e6,
        ok=data["ok"],
        bad=data["bad"],
        sent=data["sent"],
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        errors={
            k: data[k]
            for k in ("connect_errors", "read_errors", "write_errors", "timeouts")
            if data[k]
        },
        first_bad=data["first_bad"],
    )


def new_nonce() -> str:
    return f"{secrets.token_hex(4)}-{secrets.token_hex(3)}"


# --- results --------------------------------------------------------------------------


@dataclass
class Phase:
    system: str
    setting: str
    mode: str
    batch: int
    wrk: WrkResult
    check: str
    check_ok: bool
    cpu: dict[str, float]

    @property
    def events_per_s(self) -> float:
        return self.wrk.ok * self.batch / self.wrk.duration_s

    @property
    def elsewhere(self) -> float:
        """Cores that other programs (or the hypervisor) took during the phase."""
        return self.cpu.get("other", 0) + self.cpu.get("steal", 0)

    @property
    def noisy(self) -> bool:
        return self.elsewhere > 0.25

    def line(self) -> str:
        w = self.wrk
        errors = f", errors {w.errors}" if w.errors else ""
        expected = 200 if self.system == "MLflow" else 202
        bad = f", {w.bad} non-{expected} answers (first: {w.first_bad!r})" if w.bad else ""
        events = max(1, w.ok * self.batch)
        per_event = ", ".join(
            f"{name} {self.cpu[key] * w.duration_s * 1000 / events:.2f}"
            for key, name in (("server", self.system), ("postgres", "PostgreSQL"))
        )
        names = {"server": self.system, "postgres": "PostgreSQL", "redis": "Redis"}
        cores = ", ".join(f"{names.get(k, k)} {v:.2f}" for k, v in self.cpu.items())
        noisy = ""
        if self.noisy:
            noisy = "\n             WARNING: other programs used this machine's CPUs; not clean"
        return (
            f"    {self.mode:<8} {self.events_per_s:>10,.0f} events/s  "
            f"({w.ok / w.duration_s:,.1f} req/s x {self.batch})  p50 {w.p50_ms:,.1f} ms  "
            f"p99 {w.p99_ms:,.1f} ms{errors}{bad}\n"
            f"             stored: {self.check}\n"
            f"             CPU (cores busy): {cores}; CPU ms per event: {per_event}{noisy}"
        )


@dataclass
class Setting:
    """A server setting and the number of connections wrk keeps open to it."""

    label: str
    options: dict = field(default_factory=dict)
    results: dict[str, Phase] = field(default_factory=dict)
    connections: int = 8

    def with_connections(self, connections: int) -> Setting:
        return Setting(f"{self.label}, {connections} conns", self.options, {}, connections)


def check_stored(
    wrk: WrkResult, batch: int, stored: int, what: str, connections: int
) -> tuple[str, bool]:
    """The events stored must be those of the answered requests, plus at most those of
    the requests wrk had sent but not seen answered when it stopped (the server finishes
    them after wrk has gone, and they commit)."""
    answered = wrk.ok * batch
    cut_off = max(0, wrk.sent - wrk.ok - wrk.bad)
    extra = stored - answered
    ok = wrk.bad == 0 and 0 <= extra <= min(cut_off, connections) * batch
    detail = f"{stored:,} {what} = {answered:,} of the {wrk.ok:,} answered requests"
    if extra:
        detail += f" {extra:+,} of {extra // batch} request(s) cut off when wrk stopped"
    return f"{detail} [{'OK' if ok else 'MISMATCH'}]", ok


class System:
    """What Lifeboat and MLflow share: a server process, wrk phases, counting in SQL."""

    name = ""
    process = ""
    database = ""
    counts: dict[str, str] = {}

    def __init__(self, args: argparse.Namespace, port: int):
        self.args = args
        self.url = f"http://127.0.0.1:{port}"
        self.step_base = 0

    def batch_size(self, mode: str) -> int:
        raise NotImplementedError

    def lua_args(self, batch: int) -> list[str]:
        raise NotImplementedError

    def check(
        self, wrk: WrkResult, batch: int, delta: dict[str, int], connections: int
    ) -> tuple[str, bool]:
        raise NotImplementedError

    def next_step_base(self) -> int:
        base = self.step_base
        self.step_base += 10_000_000  # each wrk run has its own range of steps
        return base

    def stop(self) -> None:
        PROCS.stop(self.process)

    def phase(self, setting: Setting, mode: str, duration: float) -> Phase:
        """One measured phase; repeated once (--retries) when something else on the
        machine took CPU during it, keeping the cleaner of the two."""
        phase = self._phase(setting, mode, duration)
        for _ in range(self.args.retries):
            if not phase.noisy:
                break
            again = self._phase(setting, mode, duration)
            cleaner = again.elsewhere <= phase.elsewhere
            kept, dropped = (again, phase) if cleaner else (phase, again)
            say(f"    (measured twice, the machine being busy with other work; dropped:)\n"
                f"{dropped.line()}")  # fmt: skip
            phase = kept
        setting.results[mode] = phase
        return phase

    def _phase(self, setting: Setting, mode: str, duration: float) -> Phase:
        batch = self.batch_size(mode)
        pgid = PROCS.running[self.process].pid
        conns = setting.connections
        run_wrk(self.url, self.args, self.args.warmup, self.lua_args(batch), conns)
        wait_idle(pgid)
        before = pg_counts(self.database, self.counts)
        cpu_before = cpu_snapshot(pgid)
        result = run_wrk(self.url, self.args, duration, self.lua_args(batch), conns)
        cpu = cpu_usage(cpu_before, cpu_snapshot(pgid))
        wait_idle(pgid)
        after = pg_counts(self.database, self.counts)
        if result.ok == 0 and result.bad:
            raise BenchError(
                f"{self.name} answered no request with success in the {mode} phase; the first "
                f"answer: {result.first_bad!r}; see {LOG_DIR / self.process}.log"
            )
        delta = {k: after[k] - before[k] for k in after}
        check, ok = self.check(result, batch, delta, conns)
        return Phase(self.name, setting.label, mode, batch, result, check, ok, cpu)
