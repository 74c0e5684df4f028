"""What the client costs a training loop.

    .venv/bin/python bench/client_overhead.py                  # about 2 minutes
    .venv/bin/python bench/client_overhead.py --state-mb 100 --steps 120   # quicker
    .venv/bin/python bench/client_overhead.py --threads 1   # a core left free (GPU-like)
    .venv/bin/python bench/client_overhead.py --threads $(nproc)   # every core training

A CPU training loop (an MLP, a few tens of ms a step) checkpoints a state of --state-mb
MB (its weights plus ballast, 500 MB by default) every --every steps, four ways, in the
same process, --rounds times, the order rotated every round:

  baseline   the loop with plain torch.save, no client at all;
  client     the same loop inside lifeboat.Run: run.log(step, loss) every step, and
             run.checkpoint(path, step) after each torch.save (files read back and
             hashed on a background thread, events spooled and sent to a real Lifeboat
             server);
  durable    torch.save to a temporary file, fsync, rename, no client and no hashing:
             the baseline of the next way, which pays the same fsync;
  atomic     inside lifeboat.Run, lifeboat.torch.save(state, path, step=step): the bytes
             hashed as torch.save writes them, nothing read back.

The timed part of each way is the whole loop plus run.finish(), which waits for the
last checkpoint's hashing and delivers its event. Printed per way: the mean time of a
training step (saves excluded), that total, the time of each save, and the longest time
run.checkpoint() blocked the loop. Overheads, as a share of the step time: on the step
time (client vs baseline); and the extra total time per step (client vs baseline, atomic
vs durable), which counts hashing wherever it happens.

Without --url/--token it starts its own Lifeboat (gunicorn on a SQLite file in
var/bench-client/, Redis db 11 as broker when a Redis answers on 127.0.0.1:6379, no
worker) and removes it at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import lifeboat  # noqa: E402
import lifeboat.torch  # noqa: E402

WORK = ROOT / "var" / "bench-client"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(checkpoints: Path) -> tuple[subprocess.Popen, str, str]:
    env = dict(os.environ)
    env.update(
        DEBUG="1",
        DATABASE_URL=f"sqlite:///{WORK / 'db.sqlite3'}",
        REDIS_URL="redis://127.0.0.1:6379/11",
        LIFEBOAT_VAR_DIR=str(WORK / "var"),
        ALLOWED_HOSTS="127.0.0.1",
    )
    env.pop("DJANGO_SETTINGS_MODULE", None)
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, check=True, cwd=ROOT)
    token = (
        subprocess.run(
            [
                *manage,
                "create_project",
                "bench",
                "--root",
                str(checkpoints),
                "--scopes",
                "ingest,read",
                "--quiet-token",
            ],
            env=env,
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    port = free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "webapp.asgi", "-b", f"127.0.0.1:{port}"),
            *("-k", "uvicorn_worker.UvicornWorker", "-w", "1"),
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            urllib.request.urlopen(f"{url}/api/v1/openapi.json", timeout=1)  # noqa: S310
            break
        except OSError:
            time.sleep(0.2)
    else:
        raise RuntimeError("the Lifeboat server did not start")
    return server, url, token


class Model(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 10),
        )

    def forward(self, x):
        return self.net(x)


def durable_save(state, path: Path) -> None:
    """What lifeboat.torch.save does to the file, without hashing it."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def model_width(state_mb: int) -> int:
    """The width whose Model, with Adam's two moments, holds `state_mb` MB: 12 bytes a
    parameter (float32 weight, exp_avg, exp_avg_sq), two width x width layers."""
    return int(math.sqrt(state_mb * 1e6 / 12 / 2))


def loop(way: str, args, directory: Path, url: str, token: str, round_: int) -> dict:
    torch.manual_seed(0)
    if args.model_sized:
        # The checkpoint is the state of the model being trained, as in a real job: its
        # step costs what a model of that size costs.
        model = Model(model_width(args.state_mb))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        ballast = None
    else:
        model = Model(args.width)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        ballast_elems = max(
            0, args.state_mb * 1024 * 1024 // 4 - sum(p.numel() for p in model.parameters())
        )
        ballast = torch.randn(ballast_elems)
    width = model.net[0].in_features
    x = torch.randn(args.batch, width)
    y = torch.randint(0, 10, (args.batch,))
    step_times, save_times, report_times, reports = [], [], [], []
    run = None
    if way in ("client", "atomic"):
        run = lifeboat.Run(
            f"bench-{way}-{round_}-{time.time_ns()}",
            url=url,
            token=token,
            spool_dir=WORK / "spool",
            handle_signals=False,
        ).start()
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if run is not None:
            run.log(step, loss=loss.item())
        else:
            loss.item()
        step_times.append(time.perf_counter() - t0)
        if step % args.every == 0:
            path = directory / f"{way}-step-{step}.pt"
            if ballast is None:
                state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
            else:
                state = {"model": model.state_dict(), "ballast": ballast}
            t1 = time.perf_counter()
            if way == "atomic":
                reports.append(lifeboat.torch.save(state, path, step=step, run=run))
            elif way == "durable":
                durable_save(state, path)
            else:
                torch.save(state, path)
            save_times.append(time.perf_counter() - t1)
            if way == "client":
                t2 = time.perf_counter()
                run.checkpoint(path, step=step)
                report_times.append(time.perf_counter() - t2)
    wall = time.perf_counter() - started
    drained = 0.0
    if run is not None:
        t3 = time.perf_counter()
        run.finish()  # waits for the hashing thread and delivers the spool
        drained = time.perf_counter() - t3
    for report in reports:
        assert report.wait(0)["type"] == "checkpoint.saved"
    for path in directory.glob(f"{way}-step-*.pt"):
        path.unlink()
    return {
        "step_ms": 1000 * statistics.mean(step_times),
        "step_p50_ms": 1000 * statistics.median(step_times),
        "wall_s": wall,
        "save_s": statistics.mean(save_times) if save_times else 0.0,
        "report_max_ms": 1000 * max(report_times) if report_times else 0.0,
        "report_mean_ms": 1000 * statistics.mean(report_times) if report_times else 0.0,
        "finish_s": drained,
        "total_s": wall + drained,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--state-mb", type=int, default=500)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--model-sized",
        action="store_true",
        help="train a model whose weights and Adam moments are the --state-mb checkpoint "
        "(no ballast): the step time of a model that size",
    )
    parser.add_argument(
        "--ways", default="baseline,client,durable,atomic", help="the ways to run, comma-separated"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads for the training loop (0: torch's default, every core); 1 "
        "leaves a core free, as a GPU-bound job does",
    )
    parser.add_argument("--url", default=os.environ.get("LIFEBOAT_BENCH_URL"))
    parser.add_argument("--token", default=os.environ.get("LIFEBOAT_BENCH_TOKEN"))
    return parser.parse_args(argv)


def run_rounds(args, checkpoints: Path, url: str, token: str) -> dict[str, list[dict]]:
    """Every way once a round, the order rotated round by round, after an untimed warm-up."""
    # Warm up torch's kernels and the page cache, untimed.
    warm = argparse.Namespace(**{**vars(args), "steps": args.every, "rounds": 1})
    loop("baseline", warm, checkpoints, url, token, -1)
    results: dict[str, list[dict]] = {way: [] for way in args.ways.split(",")}
    ways = list(results)
    for round_ in range(args.rounds):
        for way in ways[round_ % len(ways) :] + ways[: round_ % len(ways)]:
            results[way].append(loop(way, args, checkpoints, url, token, round_))
            r = results[way][-1]
            print(
                f"  round {round_ + 1} {way:8s} step {r['step_ms']:7.2f} ms  "
                f"wall {r['wall_s']:6.2f} s  save {r['save_s']:5.2f} s  "
                f"report max {r['report_max_ms']:5.2f} ms  finish {r['finish_s']:5.2f} s"
            )
    return results


def print_results(results: dict[str, list[dict]], args) -> None:
    """The table of the ways, then the overheads against their targets (those whose two
    ways ran)."""

    def mean(way, key):
        return statistics.mean(r[key] for r in results[way])

    reference = "baseline" if "baseline" in results else next(iter(results))
    base = mean(reference, "step_ms")
    print()
    print(
        f"{'way':10s} {'step (ms)':>10s} {'vs ' + reference:>12s} {'total (s)':>10s} "
        f"{'save (s)':>9s} {'report max (ms)':>16s}"
    )
    for way in results:
        step = mean(way, "step_ms")
        print(
            f"{way:10s} {step:10.2f} {100 * (step / base - 1):+11.2f}% "
            f"{mean(way, 'total_s'):10.2f} {mean(way, 'save_s'):9.2f} "
            f"{max(r['report_max_ms'] for r in results[way]):16.2f}"
        )

    def per_step(way, against):
        extra = mean(way, "total_s") - mean(against, "total_s")
        return 100 * extra / args.steps / (base / 1000)

    print()
    shares = []
    if {"client", "baseline"} <= set(results):
        shares.append(per_step("client", "baseline"))
        print(f"extra total time per step, client (read back) vs baseline: "
              f"{shares[-1]:+.2f}% of the step time")  # fmt: skip
        # The step time alone misses the hashing done during saves and after the loop.
        shares.append(100 * (mean("client", "step_ms") / base - 1))
        print(f"client overhead on the step time: {shares[-1]:+.2f}%")
    if {"atomic", "durable"} <= set(results):
        shares.append(per_step("atomic", "durable"))
        extra = mean("atomic", "save_s") - mean("durable", "save_s")
        print(f"extra total time per step, atomic (hash while writing) vs durable: "
              f"{shares[-1]:+.2f}% of the step time (target < 1%); "
              f"{extra:+.2f} s a save")  # fmt: skip
    if shares:
        worst = max(shares)
        print(f"client overhead, the worst of the above: {worst:+.2f}% (target < 1%): "
              f"{'met' if worst < 1 else 'NOT met'}")  # fmt: skip
    blocking = [r["report_max_ms"] for w in ("client", "atomic") for r in results.get(w, [])]
    if blocking:
        print(f"longest time run.checkpoint() blocked the loop: {max(blocking):.2f} ms "
              f"(target < 5 ms): {'met' if max(blocking) < 5 else 'NOT met'}")  # fmt: skip
    if {"durable", "baseline"} <= set(results):
        extra = mean("durable", "save_s") - mean("baseline", "save_s")
        print(f"the atomic save (fsync + rename) costs {extra:+.2f} s a checkpoint over torch.save")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shutil.rmtree(WORK, ignore_errors=True)
    checkpoints = WORK / "checkpoints"
    checkpoints.mkdir(parents=True)
    server = None
    url, token = args.url, args.token
    if not (url and token):
        server, url, token = start_server(checkpoints)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; "
        f"{args.steps} steps, a {args.state_mb} MB checkpoint every {args.every} steps"
    )
    try:
        results = run_rounds(args, checkpoints, url, token)
    finally:
        if server is not None:
            server.terminate()
            server.wait(20)
        shutil.rmtree(WORK, ignore_errors=True)
        try:
            import redis

            redis.Redis.from_url("redis://127.0.0.1:6379/11").flushdb()
        except Exception:  # noqa: BLE001, S110 (no Redis: nothing to clean)
            pass
    print_results(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
