"""Server time of a GET /metrics scrape at large history, written by prometheus_client,
beside the hand-written exposition it replaced (issue #34), measured in the same run.

Uses bench/pages.py's database (lifeboat_bench_pages: 10,000 runs, a third of them
running, 1,000,000 checkpoints, goodput rows for every run), filling it first unless
--reuse finds it, adds the storage ledger's rows of its project, then calls both views
in this process (no network, no gunicorn), round after round, so that whatever else runs
on the machine slows both alike:

* `prometheus_client`: webapp/ops/metrics.py as it is,
* `hand-written`: the same module as of the commit before the change
  (`git show f099448^:webapp/ops/metrics.py`), loaded here only for this comparison.

    .venv/bin/python bench/metrics.py --reuse --requests 50

Both read the same rows with the same queries, so the figure to watch is the difference:
what writing the text through the library costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/pages.py

from pages import DB_NAME, ROOT, configure, create_database, fill  # noqa: E402

HANDWRITTEN = "f099448^"  # the commit before /metrics moved to prometheus_client
TOKEN = "bench-metrics"  # noqa: S105


def handwritten_module() -> types.ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{HANDWRITTEN}:webapp/ops/metrics.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("handwritten_metrics")
    exec(compile(source, "handwritten_metrics.py", "exec"), module.__dict__)  # noqa: S102
    return module


def add_ledger_rows() -> None:
    """The newest ledger rows of the project: the local copies and one target."""
    from webapp.domain.models import Project, StorageSnapshot, StorageTarget

    project = Project.objects.get(slug="bench")
    if StorageSnapshot.objects.filter(project=project).exists():
        return
    target = StorageTarget.objects.filter(project=project).first()
    for where in {target, None}:
        StorageSnapshot.objects.create(
            project=project, target=where, stored_bytes=3 * 10**12, stored_objects=40_000,
            logical_bytes=5 * 10**12, would_free_bytes=10**11,
        )  # fmt: skip


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--database", default=DB_NAME, help="dropped and filled unless --reuse")
    parser.add_argument("--reuse", action="store_true", help="keep a filled database")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14", help="broker and latency")
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()

    configure(args.server, args.database)
    os.environ.update(REDIS_URL=args.redis, METRICS_TOKEN=TOKEN)
    must_fill = create_database(args.server, args.database, args.reuse)
    import django

    django.setup()
    from django.core.management import call_command

    if must_fill:
        figures = fill()
        print(f"filled {figures['checkpoints']:,} checkpoints in {figures['seconds']:.0f} s")
    else:
        call_command("migrate", verbosity=0)
    add_ledger_rows()

    from django.test import RequestFactory

    from webapp.ops import metrics

    old = handwritten_module()
    request = RequestFactory().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    views = (("prometheus_client", metrics.metrics_view), ("hand-written", old.metrics_view))
    bodies = {}
    for name, view in views:  # warm caches and connections; check both say the same
        for _ in range(2):
            response = view(request)
            assert response.status_code == 200, (name, response.status_code)
        bodies[name] = response.content.decode()
    same = families(bodies["prometheus_client"]) == families(bodies["hand-written"])

    times: dict[str, list[float]] = {name: [] for name, _ in views}
    for _ in range(args.requests):
        for name, view in views:
            start = time.perf_counter()
            view(request)
            times[name].append((time.perf_counter() - start) * 1000)

    load = os.getloadavg()[0]
    print(
        f"GET /metrics, {args.requests} scrapes each, database {args.database}, "
        f"load average {load:.1f}"
    )
    heads = ("p50 ms", "p95 ms", "max ms", "samples", "bytes")
    print(f"{'exposition':<18} " + " ".join(f"{h:>8}" for h in heads))
    for name, _ in views:
        values = sorted(times[name])
        p95 = values[max(0, int(len(values) * 0.95) - 1)]
        text = bodies[name]
        samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        print(
            f"{name:<18} {statistics.median(values):>8.1f} {p95:>8.1f} {values[-1]:>8.1f} "
            f"{samples:>8,} {len(text):>8,}"
        )
    print(f"same families and TYPE lines: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
