"""What bench/ingest.py prints about the machine and the results: the table, the targets
met or not, the settings tried and the storage check.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ingest_common import (
    BATCH_TARGET,
    MLFLOW_REFERENCE,
    PG_HOST,
    PG_PORT,
    SINGLE_TARGET_RATIO,
    say,
)
from ingest_load import Phase, Setting, pg_connect


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
    header = f"{'system':<9} {'mode':<8} {'server setting':<46} {'ev/req':>6} {'events/s':>10} "
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
                f"{system:<9} {mode:<8} {setting:<46} {phase.batch:>6} "
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


def print_settings_tried(
    lifeboat_settings: list[Setting], mlflow_settings: list[Setting], args
) -> None:
    """Every setting's short-phase figures, for the systems that tried several."""
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
            say(f"  {setting.label:<48} {figures}")


def storage_check(phases: list[Phase]) -> bool:
    """Says whether every phase stored exactly the events it was answered for."""
    if all(p.check_ok for p in phases):
        say("storage check: every phase stored exactly the events it was answered for")
        return True
    say("storage check: SOME PHASES DID NOT STORE WHAT THEY WERE ANSWERED FOR (above)")
    return False
