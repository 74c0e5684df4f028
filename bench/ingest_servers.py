"""The two systems bench/ingest.py measures: Lifeboat under gunicorn and MLflow's tracking
server (in its own venv), each on its own PostgreSQL database, and their settings.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time

from ingest_common import (
    EXPERIMENT,
    LIFEBOAT_DB,
    LOG_DIR,
    MLFLOW_DB,
    MLFLOW_MAX_ENTITIES,
    MLFLOW_MAX_METRICS,
    MLFLOW_MAX_TAGS,
    MLFLOW_METRICS_PER_EVENT,
    MLFLOW_TAGS_PER_EVENT,
    MLFLOW_VENV,
    PG_HOST,
    PG_PORT,
    PROCS,
    REDIS_URL,
    ROOT,
    BenchError,
    http,
    run_quiet,
    say,
    wait_http,
)
from ingest_load import (
    Phase,
    Setting,
    System,
    WrkResult,
    check_stored,
    checkpoint_postgres,
    new_nonce,
    pg_connect,
    recreate_database,
    redis_client,
)

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

    def fresh(self) -> None:
        """An empty database and broker, as before the first phase."""
        self.prepare()
        redis_client().flushdb()
        checkpoint_postgres()

    def start(self, setting: Setting) -> None:
        o = setting.options
        # What make run and docker-compose.yml serve: uvicorn workers under gunicorn.
        app, worker_class = "webapp.asgi:application", "uvicorn_worker.UvicornWorker"
        env = {**self.env, "WEB_THREADS": str(o["threads"])}
        cmd = [
            self.gunicorn, app,
            "--bind", f"127.0.0.1:{self.args.lifeboat_port}",
            "--worker-class", worker_class, "--workers", str(o["workers"]),
            "--threads", str(o["threads"]), "--timeout", "120", "--graceful-timeout", "10",
            "--backlog", "2048", "--log-level", "warning", "--no-control-socket", "--reuse-port",
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

    def check(
        self, wrk: WrkResult, batch: int, delta: dict[str, int], connections: int
    ) -> tuple[str, bool]:
        text, ok = check_stored(wrk, batch, delta["events"], "events", connections)
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

    def fresh(self) -> None:
        """An empty database (the server makes its tables and runs at its next start)."""
        recreate_database(MLFLOW_DB)
        self.run_ids = []
        checkpoint_postgres()

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

    def check(
        self, wrk: WrkResult, batch: int, delta: dict[str, int], connections: int
    ) -> tuple[str, bool]:
        metrics, tags = delta["metrics"], delta["tags"]
        events = metrics // MLFLOW_METRICS_PER_EVENT
        text, ok = check_stored(wrk, batch, events, "events", connections)
        same = metrics == MLFLOW_METRICS_PER_EVENT * events
        same = same and tags == MLFLOW_TAGS_PER_EVENT * events
        text += f"; {metrics:,} metric rows, {tags:,} tag rows [{'OK' if same else 'MISMATCH'}]"
        return text, ok and same


# --- settings -----------------------------------------------------------------------------


def parse_gunicorn(spec: str) -> Setting:
    """asgi:2 (2 uvicorn workers serving webapp.asgi, as deployed; asgi:2x8 sets
    WEB_THREADS, the threads of each worker's pool)."""
    try:
        kind, _, size = spec.partition(":")
        if kind != "asgi":
            raise ValueError(kind)
        workers, _, threads = size.partition("x")
        workers, threads = int(workers), int(threads or 8)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{spec!r}: expected asgi:WORKERS[xTHREADS] (webapp.asgi, the one entry point)"
        ) from None
    label = f"gunicorn asgi workers={workers} threads={threads}"
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
