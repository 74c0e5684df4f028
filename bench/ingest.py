"""Ingest benchmark: Lifeboat's POST /api/v1/events beside an MLflow tracking server.

    .venv/bin/python bench/ingest.py                 # the whole thing, about 12 minutes
    .venv/bin/python bench/ingest.py --quick         # 8 s phases, one setting per system
    .venv/bin/python bench/ingest.py --skip-mlflow --gunicorn asgi:1

What it measures, in one run on one machine (everything on 127.0.0.1):

* Lifeboat under gunicorn on PostgreSQL (as deployed: uvicorn workers serving
  webapp.asgi; or the WSGI application, webapp.wsgi) (database lifeboat_bench, Redis db 12 as the
  Celery broker; no worker runs, the validation tasks pile up in Redis and are flushed at
  the end). A project and an ingest token are made with `manage.py create_project`.
* Load from wrk (apt-get install -y wrk) with bench/ingest.lua: 8 connections, every
  request new `checkpoint.saved` events (unique UUIDs, unique increasing steps over 8
  runs, a location, two files with size and sha256, loss and lr):
    single   one event per request: events/s, p50 and p99 latency per request;
    batched  {"events": [1000 events]} per request: events/s, p50/p99 per request.
  Each phase has a warm-up (not counted), then the measured part. After each phase the
  script counts what PostgreSQL holds (events, checkpoints, files, and the tasks queued
  in Redis) and checks it against the 202 answers wrk received.
* Several gunicorn settings (worker class, workers, threads) are tried with shorter
  phases; the best one per mode is measured again with the full duration.
* The baseline: MLflow's tracking server (MLflow >= 3.17, installed by this script into
  its own venv var/bench-mlflow-venv with `pip install mlflow psycopg2-binary`, so the
  project's venv is untouched) on PostgreSQL (database mlflow_bench), started with
  `mlflow server --backend-store-uri postgresql+psycopg2://... --workers N`, under
  gunicorn (given --gunicorn-opts) with N = Lifeboat's best worker count, and with
  MLflow's defaults (4 workers, gunicorn and uvicorn); the best is kept. The same wrk
  load goes to POST /api/2.0/mlflow/runs/log-batch: one event = metrics loss and lr at
  its step and four tags (location, step, and each file's size and sha256). Batched: the
  largest whole-event batch log-batch accepts (100 tags per request, so 25 events).

Each phase also prints the CPU it used (server, PostgreSQL, Redis, wrk, other programs)
and the CPU milliseconds per event; a phase during which other programs took CPU is
measured once more. It refuses to start when the checkout's models and migrations
disagree (`manage.py makemigrations --check`), and stops when a phase gets no success.

It prints a table (system, mode, events/s, p50, p99, Lifeboat/MLflow ratio) and whether
the targets are met (single events >= 10x MLflow's figure, batched >= 10,000 events/s).
At the end it stops every server it started, drops both databases (unless --keep) and
flushes Redis db 12. Logs of the servers are left in var/bench-ingest/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "bench" / "ingest.lua"
VAR = ROOT / "var"
LOG_DIR = VAR / "bench-ingest"
MLFLOW_VENV = VAR / "bench-mlflow-venv"
PG_HOST, PG_PORT = "127.0.0.1", 5432
LIFEBOAT_DB, MLFLOW_DB = "lifeboat_bench", "mlflow_bench"
REDIS_URL = "redis://127.0.0.1:6379/12"
EXPERIMENT = "lifeboat-ingest-bench"
# MLflow's log-batch limits per request (mlflow/utils/validation.py).
MLFLOW_MAX_METRICS, MLFLOW_MAX_TAGS, MLFLOW_MAX_ENTITIES = 1000, 100, 1000
MLFLOW_METRICS_PER_EVENT, MLFLOW_TAGS_PER_EVENT = 2, 4
# Reference from the issue: MLflow on PostgreSQL, wrk 8 connections, this machine.
MLFLOW_REFERENCE = 85.0
SINGLE_TARGET_RATIO, BATCH_TARGET = 10.0, 10_000.0


def say(message: str = "") -> None:
    print(message, flush=True)


class BenchError(RuntimeError):
    pass


# --- processes --------------------------------------------------------------------------


class Processes:
    """Every server this script starts, each in its own process group, so that stopping
    one stops its workers too."""

    def __init__(self) -> None:
        self.running: dict[str, subprocess.Popen] = {}
        self.logs: set[str] = set()

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        mode = "ab" if name in self.logs else "wb"  # each run of the bench starts a new log
        self.logs.add(name)
        log = open(LOG_DIR / f"{name}.log", mode)  # noqa: SIM115 (kept open by the child)
        log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.running[name] = proc
        return proc

    def stop(self, name: str, grace: float = 15.0) -> None:
        proc = self.running.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, if any
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            say(f"  warning: {name} (pid {proc.pid}) did not exit")

    def stop_all(self) -> None:
        for name in list(self.running):
            self.stop(name)


PROCS = Processes()


def run_quiet(cmd: list[str], env: dict | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise BenchError(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{tail}")
    return done.stdout


def http(method: str, url: str, body: dict | None = None, headers: dict | None = None):
    assert url.startswith("http://127.0.0.1:"), url  # traffic stays on this machine
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(  # noqa: S310 (http://127.0.0.1 only, asserted)
        url, data=data, method=method, headers=headers or {}
    )
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return response.status, json.loads(response.read() or b"null")


def wait_http(url: str, proc: subprocess.Popen, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{name} exited ({proc.returncode}); see {LOG_DIR / name}.log")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
                if response.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise BenchError(f"{name} did not answer {url} within {timeout:.0f} s")


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


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


def run_wrk(url: str, args: argparse.Namespace, duration: float, lua_args: list[str]) -> WrkResult:
    assert url.startswith("http://127.0.0.1:"), url
    threads = min(args.wrk_threads, args.connections)
    cmd = [
        "wrk", f"-t{threads}", f"-c{args.connections}", f"-d{max(1, round(duration))}s",
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
    label: str
    options: dict = field(default_factory=dict)
    results: dict[str, Phase] = field(default_factory=dict)


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

    def check(self, wrk: WrkResult, batch: int, delta: dict[str, int]) -> tuple[str, bool]:
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
        run_wrk(self.url, self.args, self.args.warmup, self.lua_args(batch))
        wait_idle(pgid)
        before = pg_counts(self.database, self.counts)
        cpu_before = cpu_snapshot(pgid)
        result = run_wrk(self.url, self.args, duration, self.lua_args(batch))
        cpu = cpu_usage(cpu_before, cpu_snapshot(pgid))
        wait_idle(pgid)
        after = pg_counts(self.database, self.counts)
        if result.ok == 0 and result.bad:
            raise BenchError(
                f"{self.name} answered no request with success in the {mode} phase; the first "
                f"answer: {result.first_bad!r}; see {LOG_DIR / self.process}.log"
            )
        check, ok = self.check(result, batch, {k: after[k] - before[k] for k in after})
        return Phase(self.name, setting.label, mode, batch, result, check, ok, cpu)


# --- Lifeboat ---------------------------------------------------------------------------


class Lifeboat(System):
    name = "Lifeboat"
    process = "lifeboat-gunicorn"
    database = LIFEBOAT_DB
    counts = {
        "events": "SELECT count(*) FROM domain_event WHERE type = 'checkpoint.saved'",
        "checkpoints": "SELECT count(*) FROM domain_checkpoint",
        "files": "SELECT count(*) FROM domain_checkpointfile",
    }

    def __init__(self, args: argparse.Namespace):
        super().__init__(args, args.lifeboat_port)
        self.token = ""
        self.runs = [f"run-{i}" for i in range(args.runs)]
        self.env = {
            **os.environ,
            "DATABASE_URL": f"postgres://postgres@{PG_HOST}:{PG_PORT}/{LIFEBOAT_DB}",
            "DEBUG": "0",
            "SECRET_KEY": secrets.token_urlsafe(40),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "REDIS_URL": REDIS_URL,
            "CELERY_BROKER_URL": REDIS_URL,
            "LIFEBOAT_VAR_DIR": str(LOG_DIR / "lifeboat-var"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.python = str(ROOT / ".venv" / "bin" / "python")
        self.gunicorn = str(ROOT / ".venv" / "bin" / "gunicorn")

    def prepare(self) -> None:
        recreate_database(LIFEBOAT_DB)
        run_quiet([self.python, "manage.py", "migrate", "--noinput"], env=self.env)
        try:
            run_quiet(
                [self.python, "manage.py", "makemigrations", "--check", "--dry-run"], env=self.env
            )
        except BenchError as exc:
            raise BenchError(
                "the models and the migrations of this checkout disagree, so the bench would "
                f"measure errors; finish or revert that change first.\n{exc}"
            ) from None
        out = run_quiet(
            [self.python, "manage.py", "create_project", "bench", "--scopes", "ingest,read",
             "--quiet-token"],
            env=self.env,
        )  # fmt: skip
        self.token = out.strip().splitlines()[-1] if out.strip() else ""
        if not self.token or " " in self.token:
            raise BenchError(f"create_project printed {out!r}, not a token")

    def start(self, setting: Setting) -> None:
        o = setting.options
        env = self.env
        if o["worker_class"] == "asgi":
            # What make run and docker-compose.yml serve: uvicorn workers under gunicorn.
            app, worker_class = "webapp.asgi:application", "uvicorn_worker.UvicornWorker"
            env = {**env, "WEB_THREADS": str(o["threads"])}
            reuse_port = ["--reuse-port"]
        else:
            app, worker_class = "webapp.wsgi:application", o["worker_class"]
            reuse_port = []
        cmd = [
            self.gunicorn, app,
            "--bind", f"127.0.0.1:{self.args.lifeboat_port}",
            "--worker-class", worker_class, "--workers", str(o["workers"]),
            "--threads", str(o["threads"]), "--timeout", "120", "--graceful-timeout", "10",
            "--backlog", "2048", "--log-level", "warning", "--no-control-socket", *reuse_port,
        ]  # fmt: skip
        proc = PROCS.start(self.process, cmd, env)
        wait_http(f"{self.url}/api/v1/openapi.json", proc, self.process, 60)

    def batch_size(self, mode: str) -> int:
        return 1 if mode == "single" else self.args.batch

    def lua_args(self, batch: int) -> list[str]:
        return [
            "target=lifeboat", f"token={self.token}", f"runs={','.join(self.runs)}",
            f"batch={batch}", f"nonce={new_nonce()}", f"step_base={self.next_step_base()}",
            f"mix={1 if self.args.mix_runs else 0}",
        ]  # fmt: skip

    def check(self, wrk: WrkResult, batch: int, delta: dict[str, int]) -> tuple[str, bool]:
        text, ok = check_stored(wrk, batch, delta["events"], "events", self.args.connections)
        same = delta["checkpoints"] == delta["events"] and delta["files"] == 2 * delta["events"]
        text += (
            f"; {delta['checkpoints']:,} checkpoints, {delta['files']:,} files "
            f"[{'OK' if same else 'MISMATCH'}]"
        )
        return text, ok and same

    def read_check(self) -> str:
        try:
            return self._read_check()
        except Exception as exc:
            return f"reading back through the API failed: {exc!r} [FAILED]"

    def _read_check(self) -> str:
        """Ask the read API for the newest checkpoint of one run and compare with SQL."""
        run = self.runs[0]
        auth = {"Authorization": f"Bearer {self.token}"}
        _, page = http("GET", f"{self.url}/api/v1/runs/{run}/checkpoints?limit=1", headers=auth)
        newest = page["checkpoints"][0]
        _, detail = http("GET", f"{self.url}/api/v1/checkpoints/{newest['id']}", headers=auth)
        with pg_connect(LIFEBOAT_DB) as conn:
            (max_step,) = conn.execute(
                "SELECT max(c.step) FROM domain_checkpoint c JOIN domain_run r "
                "ON r.id = c.run_id WHERE r.key = %s",
                (run,),
            ).fetchone()
        files = detail.get("files", [])
        ok = newest["step"] == max_step and len(files) == 2 and newest["file_count"] == 2
        return (
            f"GET /api/v1/runs/{run}/checkpoints?limit=1 -> step {newest['step']} "
            f"({newest['status']}), /api/v1/checkpoints/{newest['id']} -> {len(files)} files; "
            f"newest step of {run} in PostgreSQL: {max_step} [{'OK' if ok else 'MISMATCH'}]"
        )


# --- MLflow -----------------------------------------------------------------------------


def ensure_mlflow_venv() -> str:
    """var/bench-mlflow-venv with MLflow >= 3.17 and psycopg2-binary; made if missing."""
    mlflow = MLFLOW_VENV / "bin" / "mlflow"
    python = MLFLOW_VENV / "bin" / "python"
    if not mlflow.exists():
        say(f"  creating {MLFLOW_VENV.relative_to(ROOT)} (pip install mlflow psycopg2-binary)")
        run_quiet([sys.executable, "-m", "venv", str(MLFLOW_VENV)])
        run_quiet(
            [str(python), "-m", "pip", "install", "--quiet", "mlflow>=3.17", "psycopg2-binary"],
            timeout=1200,
        )
    version = run_quiet(
        [str(python), "-c", "import mlflow, psycopg2; print(mlflow.__version__)"]
    ).strip()
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) < (3, 17):
        raise BenchError(f"{MLFLOW_VENV} has MLflow {version}; need >= 3.17 (delete it to redo)")
    return version


class MLflow(System):
    name = "MLflow"
    process = "mlflow-server"
    database = MLFLOW_DB
    counts = {"metrics": "SELECT count(*) FROM metrics", "tags": "SELECT count(*) FROM tags"}

    def __init__(self, args: argparse.Namespace):
        super().__init__(args, args.mlflow_port)
        self.run_ids: list[str] = []
        self.batch = min(
            MLFLOW_MAX_METRICS // MLFLOW_METRICS_PER_EVENT,
            MLFLOW_MAX_TAGS // MLFLOW_TAGS_PER_EVENT,
            MLFLOW_MAX_ENTITIES // (MLFLOW_METRICS_PER_EVENT + MLFLOW_TAGS_PER_EVENT),
        )
        self.env = {
            **os.environ,
            # No usage reports: MLflow 3 sends telemetry unless told not to.
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "DO_NOT_TRACK": "true",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.version = ""

    def prepare(self) -> None:
        self.version = ensure_mlflow_venv()
        recreate_database(MLFLOW_DB)

    def start(self, setting: Setting) -> None:
        artifacts = LOG_DIR / "mlflow-artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(MLFLOW_VENV / "bin" / "mlflow"), "server",
            "--backend-store-uri", f"postgresql+psycopg2://postgres@{PG_HOST}:{PG_PORT}/{MLFLOW_DB}",
            "--default-artifact-root", artifacts.as_uri(), "--no-serve-artifacts",
            "--host", "127.0.0.1", "--port", str(self.args.mlflow_port),
            "--workers", str(setting.options["workers"]),
        ]  # fmt: skip
        if setting.options["server"] == "gunicorn":
            # Any --gunicorn-opts makes `mlflow server` run gunicorn instead of uvicorn.
            cmd += ["--gunicorn-opts", "--log-level warning --timeout 120"]
        proc = PROCS.start(self.process, cmd, self.env)
        wait_http(f"{self.url}/health", proc, self.process, 240)
        if self.run_ids:
            return
        _, out = http("POST", f"{self.url}/api/2.0/mlflow/experiments/create", {"name": EXPERIMENT})
        experiment_id = out["experiment_id"]
        now = int(time.time() * 1000)
        for i in range(self.args.runs):
            _, out = http(
                "POST",
                f"{self.url}/api/2.0/mlflow/runs/create",
                {"experiment_id": experiment_id, "run_name": f"run-{i}", "start_time": now},
            )
            self.run_ids.append(out["run"]["info"]["run_id"])

    def batch_size(self, mode: str) -> int:
        return 1 if mode == "single" else self.batch

    def lua_args(self, batch: int) -> list[str]:
        return [
            "target=mlflow", f"runs={','.join(self.run_ids)}", f"batch={batch}",
            f"nonce={new_nonce()}", f"step_base={self.next_step_base()}",
        ]  # fmt: skip

    def check(self, wrk: WrkResult, batch: int, delta: dict[str, int]) -> tuple[str, bool]:
        metrics, tags = delta["metrics"], delta["tags"]
        events = metrics // MLFLOW_METRICS_PER_EVENT
        text, ok = check_stored(wrk, batch, events, "events", self.args.connections)
        same = metrics == MLFLOW_METRICS_PER_EVENT * events
        same = same and tags == MLFLOW_TAGS_PER_EVENT * events
        text += f"; {metrics:,} metric rows, {tags:,} tag rows [{'OK' if same else 'MISMATCH'}]"
        return text, ok and same


# --- the run ----------------------------------------------------------------------------


def parse_gunicorn(spec: str) -> Setting:
    """sync:2 (2 sync workers), gthread:2x4 (2 workers with 4 threads each) or asgi:2
    (2 uvicorn workers serving webapp.asgi, as deployed; asgi:2x8 sets WEB_THREADS)."""
    try:
        kind, _, size = spec.partition(":")
        if kind == "sync":
            workers, threads = int(size), 1
        elif kind == "gthread" or (kind == "asgi" and "x" in size):
            workers, threads = (int(x) for x in size.split("x"))
        elif kind == "asgi":
            workers, threads = int(size), 8
        else:
            raise ValueError(kind)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{spec!r}: expected sync:WORKERS, gthread:WORKERSxTHREADS or asgi:WORKERS[xTHREADS]"
        ) from None
    label = f"gunicorn {kind} workers={workers}" + (f" threads={threads}" if threads > 1 else "")
    return Setting(label, {"worker_class": kind, "workers": workers, "threads": threads})


def parse_mlflow(spec: str) -> Setting:
    """gunicorn:4 (mlflow server --workers 4 --gunicorn-opts ...) or uvicorn:4 (its
    default server)."""
    kind, _, size = spec.partition(":")
    if kind not in ("gunicorn", "uvicorn") or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected gunicorn:WORKERS or uvicorn:WORKERS")
    return Setting(f"mlflow {kind} workers={size}", {"server": kind, "workers": int(size)})


def default_mlflow_settings(
    lifeboat_settings: list[Setting], lifeboat_final: dict[str, Phase], quick: bool
) -> list[Setting]:
    """MLflow with as many worker processes as Lifeboat's best single-event setting, under
    gunicorn (its faster server here) and, unless --quick, also its defaults: 4 workers,
    gunicorn and uvicorn. The best is kept, so the baseline is not handicapped."""
    workers = 2
    if "single" in lifeboat_final:
        label = lifeboat_final["single"].setting
        workers = next(s.options["workers"] for s in lifeboat_settings if s.label == label)
    specs = [f"gunicorn:{workers}"]
    if not quick:
        specs += [s for s in ("gunicorn:4", "uvicorn:4") if s not in specs]
    return [parse_mlflow(spec) for spec in specs]


def measure(system, settings: list[Setting], args, modes: list[str]) -> dict[str, Phase]:
    """Try each setting with short phases (when there are several), then measure the best
    setting of each mode again with the full duration. Returns the final phase per mode."""
    if len(settings) > 1:
        say(f"  trying {len(settings)} settings, {args.sweep_duration:.0f} s per phase:")
        for setting in settings:
            say(f"  {setting.label}")
            system.start(setting)
            try:
                for mode in modes:
                    say(system.phase(setting, mode, args.sweep_duration).line())
            finally:
                system.stop()
    final: dict[str, Phase] = {}
    by_best: dict[str, list[str]] = {}
    for mode in modes:
        best = max(settings, key=lambda s, m=mode: s.results[m].events_per_s if s.results else 0)
        by_best.setdefault(best.label, []).append(mode)
    for label, best_modes in by_best.items():
        setting = next(s for s in settings if s.label == label)
        say(f"  measured with {label} ({args.duration:.0f} s per phase, "
            f"{args.warmup:.0f} s warm-up):")  # fmt: skip
        final_setting = Setting(label, setting.options)
        system.start(final_setting)
        try:
            for mode in best_modes:
                phase = system.phase(final_setting, mode, args.duration)
                say(phase.line())
                final[mode] = phase
            if isinstance(system, Lifeboat):
                say(f"             read API: {system.read_check()}")
        finally:
            system.stop()
    return final


def machine_summary() -> str:
    cpus = os.cpu_count()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with pg_connect("postgres") as conn:
        pg = conn.execute("SHOW server_version").fetchone()[0]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    wrk_version = (wrk.stdout + wrk.stderr).splitlines()[0].split(" Copyright")[0]
    return (
        f"machine: {cpus} CPUs ({model}); PostgreSQL {pg} at {PG_HOST}:{PG_PORT} "
        f"(fsync={fsync}, synchronous_commit={sync}); Redis db 12; {wrk_version}"
    )


def print_table(lifeboat: dict[str, Phase], mlflow: dict[str, Phase], args) -> list[str]:
    say("")
    say("Results (events/s = answered requests x events per request / measured seconds;")
    say("latency per request, as wrk measured it)")
    header = f"{'system':<9} {'mode':<8} {'server setting':<36} {'ev/req':>6} {'events/s':>10} "
    header += f"{'p50 ms':>9} {'p99 ms':>9} {'LB/MLflow':>9}  stored"
    say(header)
    say("-" * len(header))
    for mode in ("single", "batched"):
        for system, phases in (("Lifeboat", lifeboat), ("MLflow", mlflow)):
            phase = phases.get(mode)
            if phase is None:
                continue
            ratio = ""
            if system == "Lifeboat" and mode in mlflow:
                ratio = f"{phase.events_per_s / mlflow[mode].events_per_s:.1f}x"
            setting = phase.setting.removeprefix("mlflow ")
            say(
                f"{system:<9} {mode:<8} {setting:<36} {phase.batch:>6} "
                f"{phase.events_per_s:>10,.0f} {phase.wrk.p50_ms:>9,.1f} "
                f"{phase.wrk.p99_ms:>9,.1f} {ratio:>9}  {'OK' if phase.check_ok else 'CHECK'}"
            )
    say("")
    verdicts = []
    single = lifeboat.get("single")
    if single:
        if "single" in mlflow:
            base, source = mlflow["single"].events_per_s, "MLflow measured in this run"
        else:
            base, source = MLFLOW_REFERENCE, "the issue's reference (MLflow skipped)"
        need = SINGLE_TARGET_RATIO * base
        met = single.events_per_s >= need
        verdicts.append(
            f"target single events >= {SINGLE_TARGET_RATIO:.0f}x MLflow "
            f"({source}: {base:,.0f} events/s, so >= {need:,.0f}): "
            f"{single.events_per_s:,.0f} events/s "
            f"({single.events_per_s / base:.1f}x) -> {'MET' if met else 'NOT MET'}"
        )
    batched = lifeboat.get("batched")
    if batched:
        met = batched.events_per_s >= BATCH_TARGET
        verdicts.append(
            f"target batched >= {BATCH_TARGET:,.0f} events/s: "
            f"{batched.events_per_s:,.0f} events/s -> {'MET' if met else 'NOT MET'}"
        )
    if "single" in mlflow:
        verdicts.append(
            f"(the issue's earlier MLflow reference was {MLFLOW_REFERENCE:.0f} events/s; this "
            f"run measured {mlflow['single'].events_per_s:,.0f})"
        )
    for verdict in verdicts:
        say(verdict)
    return verdicts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=25, help="seconds per measured phase")
    parser.add_argument("--warmup", type=float, default=4, help="seconds of warm-up per phase")
    parser.add_argument("--sweep-duration", type=float, default=10,
                        help="seconds per phase while trying gunicorn settings")  # fmt: skip
    parser.add_argument("--connections", type=int, default=8, help="wrk connections")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--request-timeout", type=int, default=60, help="wrk --timeout (s)")
    parser.add_argument("--batch", type=int, default=1000, help="Lifeboat events per batch")
    parser.add_argument("--runs", type=int, default=8, help="distinct run keys")
    parser.add_argument("--mix-runs", action="store_true",
                        help="spread each Lifeboat batch over all runs (default: one run "
                             "per batch, as one job's client sends)")  # fmt: skip
    parser.add_argument(
        "--gunicorn",
        type=parse_gunicorn,
        action="append",
        metavar="SPEC",
        help="a gunicorn setting to try: asgi:N[xT] (uvicorn workers, webapp.asgi, as "
        "deployed), sync:N or gthread:NxT (webapp.wsgi) (repeatable; default: asgi:1, asgi:2, "
        "gthread:2x4)",
    )
    parser.add_argument("--gunicorn-workers", type=int,
                        help="measure only this many workers (see --gunicorn-threads)")  # fmt: skip
    parser.add_argument("--gunicorn-threads", type=int, default=1)
    parser.add_argument(
        "--mlflow",
        type=parse_mlflow,
        action="append",
        metavar="SPEC",
        help="an MLflow server setting to try: gunicorn:N or uvicorn:N (repeatable; default: "
        "gunicorn with Lifeboat's best worker count, gunicorn:4, uvicorn:4)",
    )
    parser.add_argument("--retries", type=int, default=1,
                        help="repeat a phase while other programs take the CPUs")  # fmt: skip
    parser.add_argument("--skip-mlflow", action="store_true")
    parser.add_argument("--skip-lifeboat", action="store_true")
    parser.add_argument("--modes", default="single,batched", help="single,batched")
    parser.add_argument("--lifeboat-port", type=int, default=8077)
    parser.add_argument("--mlflow-port", type=int, default=5055)
    parser.add_argument("--keep", action="store_true",
                        help="keep the databases and Redis db 12 afterwards")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="8 s phases, 2 s warm-up, one setting per system")  # fmt: skip
    parser.add_argument("--time-limit", type=float, default=1800,
                        help="stop everything after this many seconds")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = min(args.duration, 8), min(args.warmup, 2)
        if not args.gunicorn and not args.gunicorn_workers:
            args.gunicorn = [parse_gunicorn("asgi:1")]
    if args.gunicorn_workers:
        kind = "gthread" if args.gunicorn_threads > 1 else "sync"
        size = f"{args.gunicorn_workers}x{args.gunicorn_threads}" if kind == "gthread" else ""
        args.gunicorn = [parse_gunicorn(f"{kind}:{size or args.gunicorn_workers}")]
    if not args.gunicorn:
        # asgi: what production serves (uvicorn workers, webapp.asgi); gthread: the WSGI
        # application with threads, for comparison.
        args.gunicorn = [parse_gunicorn(s) for s in ("asgi:1", "asgi:2", "gthread:2x4")]
    args.modes = [m for m in args.modes.split(",") if m]
    if set(args.modes) - {"single", "batched"}:
        parser.error("--modes takes single and/or batched")
    if args.connections < 1 or args.runs < 1 or args.batch < 1:
        parser.error("--connections, --runs and --batch must be positive")
    return args


def preflight(args: argparse.Namespace) -> None:
    if shutil.which("wrk") is None:
        raise BenchError("wrk is not installed: apt-get install -y wrk")
    for port in (args.lifeboat_port, args.mlflow_port):
        if not port_free(port):
            raise BenchError(f"port {port} on 127.0.0.1 is in use; pick another (--*-port)")
    redis_client().ping()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    def on_alarm(signum, frame):
        raise BenchError(f"--time-limit of {args.time_limit:.0f} s reached")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(max(1, int(args.time_limit)))
    started = time.monotonic()
    lifeboat_final: dict[str, Phase] = {}
    mlflow_final: dict[str, Phase] = {}
    lifeboat_settings: list[Setting] = []
    mlflow_settings: list[Setting] = []
    status = 0
    try:
        preflight(args)
        say("Lifeboat ingest benchmark")
        say(machine_summary())
        say(
            f"load: wrk, {args.connections} connections, {min(args.wrk_threads, args.connections)}"
            f" thread(s); every request new checkpoint.saved events (unique UUIDs, unique "
            f"steps, {args.runs} runs, 2 files each with size and sha256, loss and lr)"
        )
        redis_client().flushdb()
        if not args.skip_lifeboat:
            lifeboat = Lifeboat(args)
            say("")
            say(f"Lifeboat: gunicorn on PostgreSQL ({LIFEBOAT_DB}), Redis db 12 as the broker")
            lifeboat.prepare()
            say("  migrated; `manage.py create_project bench --scopes ingest,read "
                "--quiet-token` gave the token")  # fmt: skip
            lifeboat_settings = args.gunicorn
            lifeboat_final = measure(lifeboat, lifeboat_settings, args, args.modes)
            queued = queued_checkpoint_ids()
            with pg_connect(LIFEBOAT_DB) as conn:
                (checkpoints,) = conn.execute(Lifeboat.counts["checkpoints"]).fetchone()
            say(
                f"  checkpoints queued for validation in Redis db 12: {queued:,} for "
                f"{checkpoints:,} checkpoints [{'OK' if queued == checkpoints else 'MISMATCH'}]"
            )
        if not args.skip_mlflow:
            mlflow = MLflow(args)
            say("")
            mlflow.prepare()
            mlflow_settings = args.mlflow or default_mlflow_settings(
                lifeboat_settings, lifeboat_final, args.quick
            )
            say(
                f"MLflow {mlflow.version} ({MLFLOW_VENV.relative_to(ROOT)}: pip install "
                f"mlflow psycopg2-binary) on PostgreSQL ({MLFLOW_DB}): `mlflow server "
                f"--backend-store-uri postgresql+psycopg2://... --workers N` with its default "
                f"uvicorn, or with gunicorn (sync workers) when given --gunicorn-opts; "
                f"log-batch with {MLFLOW_METRICS_PER_EVENT} metrics + {MLFLOW_TAGS_PER_EVENT} "
                f"tags per event, batched = {mlflow.batch} events per request (its limit of "
                f"{MLFLOW_MAX_TAGS} tags per request)"
            )
            mlflow_final = measure(mlflow, mlflow_settings, args, args.modes)
        for title, tried in (("Lifeboat", lifeboat_settings), ("MLflow", mlflow_settings)):
            if len(tried) < 2:
                continue
            say("")
            say(f"{title} settings tried ({args.sweep_duration:.0f} s phases), events/s:")
            for setting in tried:
                figures = ", ".join(
                    f"{m} {p.events_per_s:,.0f} (p50 {p.wrk.p50_ms:,.1f} ms, "
                    f"p99 {p.wrk.p99_ms:,.1f} ms)"
                    for m, p in setting.results.items()
                )
                say(f"  {setting.label:<38} {figures}")
        print_table(lifeboat_final, mlflow_final, args)
        all_phases = [p for s in lifeboat_settings + mlflow_settings for p in s.results.values()]
        all_phases += list(lifeboat_final.values()) + list(mlflow_final.values())
        if all(p.check_ok for p in all_phases):
            say("storage check: every phase stored exactly the events it was answered for")
        else:
            say("storage check: SOME PHASES DID NOT STORE WHAT THEY WERE ANSWERED FOR (above)")
            status = 1
    except (BenchError, KeyboardInterrupt) as exc:
        say(f"\nstopped: {exc}")
        status = 2
    except Exception:
        import traceback

        say("\nstopped by an unexpected error:\n" + traceback.format_exc())
        status = 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cleanup(args)
        say(f"total time {time.monotonic() - started:.0f} s")
    return status


def cleanup(args: argparse.Namespace) -> None:
    PROCS.stop_all()
    notes = ["servers stopped"]
    if args.keep:
        notes.append(f"databases {LIFEBOAT_DB}, {MLFLOW_DB} and Redis db 12 kept (--keep)")
    else:
        for name in (LIFEBOAT_DB, MLFLOW_DB):
            try:
                drop_database(name)
            except Exception as exc:
                notes.append(f"could not drop {name}: {exc}")
        try:
            redis_client().flushdb()
            notes.append(f"databases {LIFEBOAT_DB} and {MLFLOW_DB} dropped, Redis db 12 flushed")
        except Exception as exc:
            notes.append(f"could not flush Redis db 12: {exc}")
    say("cleanup: " + "; ".join(notes) + f"; logs in {LOG_DIR.relative_to(ROOT)}/")


if __name__ == "__main__":
    sys.exit(main())
