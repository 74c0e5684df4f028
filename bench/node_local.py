"""Node-local checkpoints: save → verified on 4 hosts, beside one central worker on
shared storage and beside each host's own floor, in the same run on the same machine.

    .venv/bin/python bench/node_local.py --rounds 5               # 512 MiB, about 2 minutes
    .venv/bin/python bench/node_local.py --total 2GiB --rounds 3  # about 3 minutes

(On a 2-core machine; most of it is writing the checkpoint, 8 spawned torch processes,
and starting 5 workers.)

A real DCP save of 8 gloo ranks (bench/corpus.py) is laid out two ways, as hard links of
the same files (one page cache, warm: a worker checks what the job has just written):

  node-local  a project with node_local=True; each of 4 hosts holds its ranks' shards
              (ranks 0-1 on node-0, 2-3 on node-1, ...; rank 0's `.metadata` on node-0).
              Each host is a Celery worker (solo pool) on `validate.node-<i>` in a mount
              namespace of its own where a bind mount puts that host's disk at the common
              checkpoint folder (as tests/test_node_local.py does): it sees its own files
              and no other's. A central worker on `validate` sees the folder empty.
  shared      a plain project whose folder holds every file; the same central worker
              checks it (one task: below VALIDATION_FANOUT_BYTES), the host workers idle.

Each checkpoint is reported as the ranks do: 8 `checkpoint.saved` events with their part
(rank, world_size, host), posted at once over HTTP to gunicorn serving webapp.asgi. The
time is from the first event posted until PostgreSQL says `verified` (polled every 20
ms). A first round of each, not counted, warms every worker (its inspection helper
imports torch once, as in a running deployment). The floor of a host is max(reading its
files, sha256 of its files ÷ cores), measured here with hashlib on the same files; the
target of the issue is node-local ≤ 1.3× the slowest host's floor. Here every "host"
shares this machine's cores, so 4 hosts cannot run 4× as fast as one: the script also
prints the floor of the whole checkpoint on this machine (what one host holding every
byte could reach), which bounds both layouts here.

Needs: root (mount namespaces: `unshare -m`), PostgreSQL at 127.0.0.1:5432 (user
postgres, trust auth; the database `bench_nodelocal` is made anew), Redis at
127.0.0.1:6379 (database 13, emptied before and after; `--redis-db` to change). Files
and worker logs: var/bench-node-local-*/; it and the database are removed at the end
unless `--keep`.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG_ADMIN = "postgres://postgres@127.0.0.1:5432/postgres"
PG_DB = "bench_nodelocal"
TARGET = 1.3


def host_of(rank: int, ranks: int, hosts: int) -> str:
    """Consecutive ranks on one host, as a launcher places them."""
    return f"node-{rank * hosts // ranks}"


def files_of(rank: int) -> list[str]:
    return [f"__{rank}_0.distcp"] + ([".metadata"] if rank == 0 else [])


def fresh_database() -> str:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_DB}")
    return f"postgres://postgres@127.0.0.1:5432/{PG_DB}"


def drop_database() -> None:
    import psycopg

    if "django" in sys.modules:
        from django.db import connections

        connections.close_all()
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")


def flush_redis(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()  # this bench's database only


class Cluster:
    """The web server, a worker per host (each in its own mount namespace) and the
    central worker; every process in a session of its own, stopped with its children."""

    def __init__(self, env: dict, work: Path, shared: Path, disks: dict[str, Path]):
        from tests.support.servers import WebServer

        self.env, self.work = env, work
        self.workers: dict[str, subprocess.Popen] = {}
        self.web = None
        try:
            for host, disk in disks.items():
                mount = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                         f'mount --bind "{disk}" "{shared}" && exec "$@"', "sh"]  # fmt: skip
                self.workers[host] = self._worker(host, f"validate.{host}", mount)
            self.workers["central"] = self._worker("central", "validate", [])
            self.web = WebServer(env)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _worker(self, name: str, queues: str, prefix: list[str]) -> subprocess.Popen:
        argv = [*prefix, sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q",
                queues, "-P", "solo", "-l", "info", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-n", f"{name}@%h"]  # fmt: skip
        with (self.work / f"{name}.log").open("w") as log:
            return subprocess.Popen(
                argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        for name, process in self.workers.items():
            while "ready." not in self.log(name):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {name} did not start:\n{self.log(name)[-3000:]}")
                time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM to each worker's session (its inspection helpers too), SIGKILL after
        20 s; a host's bind mount goes with the last process of its namespace."""
        for process in self.workers.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.workers.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.workers = {}
        if self.web is not None:
            self.web.stop()
            self.web = None


def link(source: Path, folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.link(source / name, folder / name)


def lay_out(written: Path, layout: dict, step: int, ranks: int, hosts: int) -> dict:
    """Step `step` of each layout, hard links of the written files: each host's ranks on
    its disk (node-local), every rank in one folder (shared). Returns the locations."""
    for rank in range(ranks):
        host = host_of(rank, ranks, hosts)
        link(written, layout["disks"][host] / "nl" / f"step-{step}", files_of(rank))
        link(written, layout["central"] / "sh" / f"step-{step}", files_of(rank))
    return {
        "nl": f"{layout['shared']}/nl/step-{step}",
        "sh": f"{layout['central']}/sh/step-{step}",
    }


def events(manifest: dict, run: str, location: str, step: int, ranks: int, hosts: int):
    now = datetime.now(UTC).isoformat()
    return [
        {
            "id": str(uuid.uuid4()),
            "type": "checkpoint.saved",
            "run": run,
            "time": now,
            "step": step,
            "location": location,
            "format": "dcp",
            "files": [manifest[name] for name in files_of(rank)],
            "part": {"rank": rank, "world_size": ranks, "host": host_of(rank, ranks, hosts)},
        }
        for rank in range(ranks)
    ]


def save_to_verified(web, token: str, project, body: list[dict], timeout: float) -> dict:
    """Posts the ranks' events at once (a thread each), then polls the checkpoint's status;
    seconds from the first post until `verified`, until a worker began the check, and
    until each validation part finished."""
    from webapp.domain.models import Checkpoint, Validation, ValidationPart

    run, step = body[0]["run"], body[0]["step"]
    started, wall = time.monotonic(), time.time()
    with ThreadPoolExecutor(len(body)) as pool:
        answers = list(pool.map(lambda event: web.post_events(token, event), body))
    bad = [a for a in answers if a[0] != 202]
    if bad:
        raise RuntimeError(f"events refused: {bad[:2]}")
    found = Checkpoint.objects.filter(project=project, run__key=run, step=step)
    while True:
        row = found.values_list("pk", "status", "status_message").first()
        if row and row[1] not in ("reported", "verifying"):
            seconds = time.monotonic() - started
            break
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"{run} step {step} not settled in {timeout} s: {row}")
        time.sleep(0.02)
    if row[1] != "verified":
        raise RuntimeError(f"{run} step {step} is {row[1]}: {row[2]}")
    began = Validation.objects.filter(checkpoint_id=row[0]).values_list("started_at", flat=True)
    parts = ValidationPart.objects.filter(validation__checkpoint_id=row[0]).order_by("index")
    done = [(p.host, p.files, p.finished_at.timestamp() - wall, p.worker) for p in parts]
    return {"seconds": seconds, "began": min(began).timestamp() - wall, "parts": done}


def floors(folder: Path, by_host: dict[str, list[str]], cores: int) -> dict[str, float]:
    """max(read, sha256 ÷ cores) of each host's files and of all of them, and their parts."""
    from bench.validate_sharded import read_all, sha256_all, timed

    out = {}
    groups = {**by_host, "whole": [n for names in by_host.values() for n in names]}
    for name, files in groups.items():
        paths = [folder / f for f in files]
        read = timed(lambda paths=paths: read_all(paths, min(cores, len(paths))))
        sha = timed(lambda paths=paths: sha256_all(paths)) / cores
        out[name] = max(read, sha)
        out[f"{name} read"], out[f"{name} sha256/cores"] = read, sha
    return out


def setup(args, work: Path) -> tuple[dict, dict]:
    """The environment of every process, Django set up in this one, the projects."""
    base_redis = args.redis.rsplit("/", 1)[0]
    redis_url = f"{base_redis}/{args.redis_db}"
    flush_redis(redis_url)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LIFEBOAT_"))},
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "DATABASE_URL": fresh_database(),
        "DB_CONN_MAX_AGE": "0",
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "SECRET_KEY": secrets.token_urlsafe(32),
        "LIFEBOAT_ENV_FILE": "off",
        "LIFEBOAT_VAR_DIR": str(work / "var"),
        "PYTHONUNBUFFERED": "1",
    }
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    from webapp.domain.models import Project

    call_command("migrate", verbosity=0)
    layout = {"shared": work / "ckpt", "central": work / "central"}
    layout["disks"] = {f"node-{i}": work / "disks" / f"node-{i}" for i in range(args.hosts)}
    for folder in [layout["shared"], layout["central"], *layout["disks"].values()]:
        folder.mkdir(parents=True)
    nl = Project.objects.create(
        name="Node-local", slug="nl", allowed_roots=[str(layout["shared"])], node_local=True
    )
    sh = Project.objects.create(name="Shared", slug="sh", allowed_roots=[str(layout["central"])])
    layout["projects"] = {
        "nl": (nl, nl.issue_token("bench", ["ingest", "read"])[1]),
        "sh": (sh, sh.issue_token("bench", ["ingest", "read"])[1]),
    }
    return env, layout


def measure(args, work: Path) -> int:
    from bench import corpus

    cores = len(os.sched_getaffinity(0))
    env, layout = setup(args, work)
    print(f"writing a DCP checkpoint of {args.ranks} ranks, {args.total / (1 << 20):,.0f} MiB ...")
    written = corpus.write("dcp", work / "written", args.total, ranks=args.ranks)
    manifest = {f["path"]: f for f in corpus.manifest(written)}  # also warms the page cache
    size = sum(f["size"] for f in manifest.values())
    by_host: dict[str, list[str]] = {}
    for rank in range(args.ranks):
        by_host.setdefault(host_of(rank, args.ranks, args.hosts), []).extend(files_of(rank))
    print(f"starting the web server, {args.hosts} host workers and the central worker ...")
    cluster = Cluster(env, work, layout["shared"], layout["disks"])
    rows: dict[str, list] = {"nl": [], "sh": [], "floor": []}
    try:
        for number in range(args.rounds + 1):  # round 0 warms the workers, not counted
            step = 100 * (number + 1)
            locations = lay_out(written, layout, step, args.ranks, args.hosts)
            order = ("nl", "sh") if number % 2 else ("sh", "nl")
            for kind in order:
                project, token = layout["projects"][kind]
                body = events(manifest, f"{kind}-run", locations[kind], step, args.ranks,
                              args.hosts)  # fmt: skip
                result = save_to_verified(cluster.web, token, project, body, args.timeout)
                if number:
                    rows[kind].append(result)
            if number:
                rows["floor"].append(floors(written, by_host, cores))
                print(f"round {number}: node-local {rows['nl'][-1]['seconds']:.2f} s, "
                      f"shared {rows['sh'][-1]['seconds']:.2f} s", flush=True)  # fmt: skip
    finally:
        cluster.stop()
    report(args, rows, size, cores, by_host)
    # Each node-local part was taken by its own host's worker (the bind mounts worked).
    astray = [p for r in rows["nl"] for p in r["parts"] if not p[3].startswith(f"{p[0]}@")]
    if astray or not all(r["parts"] for r in rows["nl"]):
        print(f"\nWRONG: node-local parts not checked on their hosts: {astray}")
        return 1
    return 0


def report(args, rows: dict, size: int, cores: int, by_host: dict) -> None:
    def med(values) -> float:
        return statistics.median(values)

    nl = med([r["seconds"] for r in rows["nl"]])
    sh = med([r["seconds"] for r in rows["sh"]])
    floor = {k: med([f[k] for f in rows["floor"]]) for k in rows["floor"][0]}
    slowest = max(by_host, key=lambda h: floor[h])
    host_floor, whole = floor[slowest], floor["whole"]
    mib = size / (1 << 20)
    print(f"\nDCP checkpoint of {args.ranks} ranks, {mib:,.0f} MiB, on {args.hosts} hosts "
          f"({args.ranks // args.hosts} ranks each); page cache warm; median of "
          f"{args.rounds} round(s)")  # fmt: skip
    print(f"this machine: {cores} cores, shared by every host worker, the central worker, "
          f"the web server and PostgreSQL; load average {args.load[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")  # fmt: skip
    print(f"\n{'':<44} {'seconds':>8} {'x host floor':>13} {'x whole floor':>14}")

    def line(name: str, seconds: float, note: str = "") -> None:
        print(f"{name:<44} {seconds:8.2f} {seconds / host_floor:13.2f} "
              f"{seconds / whole:14.2f}  {note}")  # fmt: skip

    def spread(kind: str) -> str:
        values = [r["seconds"] for r in rows[kind]]
        return f"rounds {min(values):.2f}-{max(values):.2f}"

    met = "met" if nl / host_floor <= TARGET else "NOT met"
    line(f"(a) node-local, {args.hosts} hosts: save -> verified", nl,
         f"{spread('nl')}; target <= {TARGET}x host floor: {met}")  # fmt: skip
    fanned = max(len(r["parts"]) for r in rows["sh"])
    how = f"fanned out in {fanned} parts" if fanned else "one task"
    line("(b) shared storage, 1 central worker", sh, f"{spread('sh')}; {how}")
    line(f"(c) slowest host's floor ({slowest})", host_floor,
         f"read {floor[slowest + ' read']:.2f}, sha256/{cores} cores "
         f"{floor[slowest + ' sha256/cores']:.2f}")  # fmt: skip
    line("    whole checkpoint's floor (one host)", whole,
         f"read {floor['whole read']:.2f}, sha256/{cores} cores "
         f"{floor['whole sha256/cores']:.2f}")  # fmt: skip
    print(f"\n(a)/(c) = {nl / host_floor:.2f} (target <= {TARGET}); (a)/(b) = {nl / sh:.2f}")
    print(f"The {args.hosts} hosts share {cores} cores here: their parts cannot run side by "
          f"side on cores of their own, so (a) is bounded by the whole floor "
          f"({whole:.2f} s), not by one host's; (a)/whole = {nl / whole:.2f}.")  # fmt: skip
    print("\neach round, seconds after the first event was posted:")
    for nl_row, sh_row in zip(rows["nl"], rows["sh"], strict=True):
        shared = [at for host, files, at, _ in nl_row["parts"] if files == [".metadata"]]
        hosts = [at for host, files, at, _ in nl_row["parts"] if files != [".metadata"]]
        print(f"  node-local: check began {nl_row['began']:.2f}, rank 0's .metadata checked "
              f"{min(shared, default=0):.2f}, host parts done {min(hosts):.2f}-{max(hosts):.2f}, "
              f"verified {nl_row['seconds']:.2f}; shared: check began {sh_row['began']:.2f}, "
              f"verified {sh_row['seconds']:.2f}")  # fmt: skip


def main() -> int:
    from bench.corpus import parse_size

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=parse_size, default=512 << 20, help="e.g. 512MiB, 2GiB")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per checkpoint")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--redis-db", type=int, default=13)
    parser.add_argument("--keep", action="store_true", help="keep the files, logs and database")
    args = parser.parse_args()
    if args.ranks % args.hosts:
        parser.error("--ranks must be a multiple of --hosts")
    if args.redis_db in (0, 15):
        parser.error("Redis db 0 is a running Lifeboat's, 15 the tests'")
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False).returncode
    ):
        print("needs mount namespaces: run as root (unshare -m)", file=sys.stderr)
        return 1
    # SIGTERM ends the run as Ctrl-C does: through the finally blocks that stop workers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.load = os.getloadavg()
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-node-local-", dir=ROOT / "var"))
    try:
        return measure(args, work)
    finally:
        try:
            flush_redis(f"{args.redis.rsplit('/', 1)[0]}/{args.redis_db}")
        finally:
            if args.keep:
                print(f"kept {work} and the database {PG_DB}")
            else:
                shutil.rmtree(work, ignore_errors=True)
                drop_database()


if __name__ == "__main__":
    sys.exit(main())
