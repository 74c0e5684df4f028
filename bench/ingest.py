"""Ingest benchmark: Lifeboat's POST /api/v1/events beside an MLflow tracking server.

    .venv/bin/python bench/ingest.py                 # the whole thing, about 12 minutes
    .venv/bin/python bench/ingest.py --quick         # 8 s phases, one setting per system
    .venv/bin/python bench/ingest.py --skip-mlflow --gunicorn asgi:1

What it measures, in one run on one machine (everything on 127.0.0.1):

* Lifeboat under gunicorn on PostgreSQL (as deployed: uvicorn workers serving
  webapp.asgi) (database lifeboat_bench, Redis db 12 as the
  Celery broker; no worker runs, the validation tasks pile up in Redis and are flushed at
  the end). A project and an ingest token are made with `manage.py create_project`.
* Load from wrk (apt-get install -y wrk) with bench/ingest.lua: 8 and 32 connections
  (--connections; each server setting is tried with each, and a system's best setting is
  its best pair, for MLflow too: thousands of jobs are thousands of clients), every
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
the targets are met (single events >= 5x MLflow's figure, batched >= 10,000 events/s).
At the end it stops every server it started, drops both databases (unless --keep) and
flushes Redis db 12. Logs of the servers are left in var/bench-ingest/.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules below

from ingest_common import (
    LIFEBOAT_DB,
    LOG_DIR,
    MLFLOW_DB,
    MLFLOW_MAX_TAGS,
    MLFLOW_METRICS_PER_EVENT,
    MLFLOW_TAGS_PER_EVENT,
    MLFLOW_VENV,
    PROCS,
    ROOT,
    BenchError,
    port_free,
    say,
)
from ingest_load import (
    Phase,
    Setting,
    drop_database,
    pg_connect,
    queued_checkpoint_ids,
    redis_client,
)
from ingest_report import machine_summary, print_settings_tried, print_table, storage_check
from ingest_servers import Lifeboat, MLflow, default_mlflow_settings, parse_gunicorn, parse_mlflow


def measure(system, settings: list[Setting], args, modes: list[str]) -> dict[str, Phase]:
    """Try each setting with short phases (when there are several), then measure the best
    setting of each mode again with the full duration. Returns the final phase per mode."""
    if len(settings) > 1:
        say(f"  trying {len(settings)} settings, {args.sweep_duration:.0f} s per phase:")
        for server in by_server(settings):
            system.start(server[0])
            try:
                for setting in server:
                    say(f"  {setting.label}")
                    for mode in modes:
                        say(system.phase(setting, mode, args.sweep_duration).line())
            finally:
                system.stop()
        # The sweep left hundreds of thousands of rows; each system's measured phases
        # start from an empty database, so neither pays for how many settings it tried.
        system.fresh()
    final: dict[str, Phase] = {}
    by_best: dict[str, list[str]] = {}
    for mode in modes:
        best = max(settings, key=lambda s, m=mode: s.results[m].events_per_s if s.results else 0)
        by_best.setdefault(best.label, []).append(mode)
    for label, best_modes in by_best.items():
        setting = next(s for s in settings if s.label == label)
        say(f"  measured with {label} ({args.duration:.0f} s per phase, "
            f"{args.warmup:.0f} s warm-up):")  # fmt: skip
        final_setting = Setting(label, setting.options, connections=setting.connections)
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


def by_server(settings: list[Setting]) -> list[list[Setting]]:
    """The settings in groups that share a server setting (started once per group)."""
    groups: list[list[Setting]] = []
    for setting in settings:
        if groups and groups[-1][0].options == setting.options:
            groups[-1].append(setting)
        else:
            groups.append([setting])
    return groups


def with_connections(settings: list[Setting], connections: list[int]) -> list[Setting]:
    """Each server setting with each number of client connections: a system's best
    setting is its best server setting under its best load."""
    return [s.with_connections(c) for s in settings for c in connections]


def parse_connections(spec: str) -> list[int]:
    try:
        counts = [int(c) for c in spec.split(",") if c.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected positive counts, e.g. 8,32")
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=25, help="seconds per measured phase")
    parser.add_argument("--warmup", type=float, default=4, help="seconds of warm-up per phase")
    parser.add_argument("--sweep-duration", type=float, default=10,
                        help="seconds per phase while trying gunicorn settings")  # fmt: skip
    parser.add_argument("--connections", type=parse_connections, default=[8, 32],
                        help="wrk connections to try with every server setting, e.g. 8,32 "
                             "(default); each system keeps its best")  # fmt: skip
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
        help="a gunicorn setting to try: asgi:N[xT] (N uvicorn workers serving webapp.asgi, "
        "as deployed; T threads in each one's pool) (repeatable; default: asgi:1, asgi:2)",
    )
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
        args.gunicorn = args.gunicorn or [parse_gunicorn("asgi:1")]
    args.gunicorn = args.gunicorn or [parse_gunicorn(s) for s in ("asgi:1", "asgi:2")]
    args.modes = [m for m in args.modes.split(",") if m]
    if set(args.modes) - {"single", "batched"}:
        parser.error("--modes takes single and/or batched")
    if args.runs < 1 or args.batch < 1:
        parser.error("--runs and --batch must be positive")
    return args


def preflight(args: argparse.Namespace) -> None:
    if shutil.which("wrk") is None:
        raise BenchError("wrk is not installed: apt-get install -y wrk")
    for port in (args.lifeboat_port, args.mlflow_port):
        if not port_free(port):
            raise BenchError(f"port {port} on 127.0.0.1 is in use; pick another (--*-port)")
    redis_client().ping()


def run_lifeboat(args: argparse.Namespace) -> tuple[list[Setting], dict[str, Phase]]:
    """Lifeboat's settings tried and its final phase per mode; then checks that Redis holds
    one validation task's worth for every checkpoint stored."""
    lifeboat = Lifeboat(args)
    say("")
    say(f"Lifeboat: gunicorn on PostgreSQL ({LIFEBOAT_DB}), Redis db 12 as the broker")
    lifeboat.prepare()
    say("  migrated; `manage.py create_project bench --scopes ingest,read "
        "--quiet-token` gave the token")  # fmt: skip
    settings = with_connections(args.gunicorn, args.connections)
    final = measure(lifeboat, settings, args, args.modes)
    queued = queued_checkpoint_ids()
    with pg_connect(LIFEBOAT_DB) as conn:
        (checkpoints,) = conn.execute(Lifeboat.counts["checkpoints"]).fetchone()
    say(
        f"  checkpoints queued for validation in Redis db 12: {queued:,} for "
        f"{checkpoints:,} checkpoints [{'OK' if queued == checkpoints else 'MISMATCH'}]"
    )
    return settings, final


def run_mlflow(
    args: argparse.Namespace, lifeboat_settings: list[Setting], lifeboat_final: dict[str, Phase]
) -> tuple[list[Setting], dict[str, Phase]]:
    """MLflow's settings tried (by default sized on Lifeboat's best) and its final phases."""
    mlflow = MLflow(args)
    say("")
    mlflow.prepare()
    servers = args.mlflow or default_mlflow_settings(lifeboat_settings, lifeboat_final, args.quick)
    settings = with_connections(servers, args.connections)
    say(
        f"MLflow {mlflow.version} ({MLFLOW_VENV.relative_to(ROOT)}: pip install "
        f"mlflow psycopg2-binary) on PostgreSQL ({MLFLOW_DB}): `mlflow server "
        f"--backend-store-uri postgresql+psycopg2://... --workers N` with its default "
        f"uvicorn, or with gunicorn (sync workers) when given --gunicorn-opts; "
        f"log-batch with {MLFLOW_METRICS_PER_EVENT} metrics + {MLFLOW_TAGS_PER_EVENT} "
        f"tags per event, batched = {mlflow.batch} events per request (its limit of "
        f"{MLFLOW_MAX_TAGS} tags per request)"
    )
    return settings, measure(mlflow, settings, args, args.modes)


def run(args: argparse.Namespace) -> int:
    """Both systems measured and reported; 1 when a phase stored other than it answered."""
    preflight(args)
    say("Lifeboat ingest benchmark")
    say(machine_summary())
    say(
        f"load: wrk with {' or '.join(map(str, args.connections))} connections, "
        f"{args.wrk_threads} thread(s) at most; every request new checkpoint.saved events "
        f"(unique UUIDs, unique steps, {args.runs} runs, 2 files each "
        f"with size and sha256, loss and lr)"
    )
    redis_client().flushdb()
    lifeboat_settings: list[Setting] = []
    lifeboat_final: dict[str, Phase] = {}
    mlflow_settings: list[Setting] = []
    mlflow_final: dict[str, Phase] = {}
    if not args.skip_lifeboat:
        lifeboat_settings, lifeboat_final = run_lifeboat(args)
    if not args.skip_mlflow:
        mlflow_settings, mlflow_final = run_mlflow(args, lifeboat_settings, lifeboat_final)
    print_settings_tried(lifeboat_settings, mlflow_settings, args)
    print_table(lifeboat_final, mlflow_final, args)
    all_phases = [p for s in lifeboat_settings + mlflow_settings for p in s.results.values()]
    all_phases += list(lifeboat_final.values()) + list(mlflow_final.values())
    return 0 if storage_check(all_phases) else 1


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
    try:
        status = run(args)
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
