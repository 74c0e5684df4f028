"""What `make run` keeps of its choices, and the ports of its SeaweedFS.

save_settings() writes the settings a stack chose to var/lifeboat.env (webapp/env_file.py),
which webapp/settings.py reads for any variable the environment does not set: a
`manage.py` command, a Celery worker or gunicorn started later in the checkout finds this
stack without anything exported.

weed_mini_ports() gives every port `weed mini` opens from LIFEBOAT_S3_PORT (S3, default
8333) and LIFEBOAT_S3_INTERNAL_PORT (the first of ten consecutive ports for its master,
volume, filer and admin servers, their gRPC, and its debug port; default: SeaweedFS's
own), so that two stacks can run side by side on one machine; local_address() and
binds_loopback_only() read the web server's LIFEBOAT_BIND.
"""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path

from webapp.env_file import NAME, read_env_file, write_env_file

# The settings a stack's children run with; each is saved when the stack has one.
SAVED = (
    "DEBUG",
    "SECURE_COOKIES",
    "SECRET_KEY",
    "SITE_URL",
    "DATABASE_URL",
    "REDIS_URL",
    "S3_ENDPOINT_URL",
    "S3_REGION",
    "S3_ACCESS_KEY_ID",
    "S3_SECRET_ACCESS_KEY",
    "S3_BUCKET",
    "LIFEBOAT_OUTBOUND_ALLOW",
    "METRICS_PUBLIC",
    "METRICS_TOKEN",
    "LAUNCH_LOCAL_SAME_USER",
    "LAUNCH_RUN_AS",
    "LIFEBOAT_SPOOL_DIR",
)
HEADER = """Settings of the `make run` stack of this checkout (scripts/run_stack.py), rewritten at
every start. Commands run here (manage.py, celery, gunicorn) read them for any variable
the environment does not set. Keep this file private: it holds secrets."""

# weed mini's servers, each with its HTTP and gRPC port; SeaweedFS's defaults.
_INTERNAL = ("master", "volume", "filer")
_DEFAULTS = {"master": 9333, "volume": 9340, "filer": 8888, "admin": 23646}


def settings_file(var: Path) -> Path:
    return var / NAME


def keep_secret_key(var: Path, env: dict[str, str]) -> None:
    """SECRET_KEY from the environment, else the one this stack saved before (sessions
    survive a restart), else a new one."""
    if not env.get("SECRET_KEY"):
        saved = read_env_file(settings_file(var)).get("SECRET_KEY")
        env["SECRET_KEY"] = saved or secrets.token_urlsafe(50)


def save_settings(var: Path, env: dict[str, str]) -> Path:
    path = settings_file(var)
    write_env_file(path, {key: env[key] for key in SAVED if env.get(key)}, HEADER)
    return path


def weed_mini_ports(env: dict[str, str]) -> tuple[int, list[str], list[int]]:
    """(the S3 port, weed mini's port flags, every port they open)."""
    s3 = int(env.get("LIFEBOAT_S3_PORT") or 8333)
    flags = [f"-s3.port={s3}", "-s3.port.iceberg=0", "-s3.port.lance=0"]
    ports = [s3]
    base = env.get("LIFEBOAT_S3_INTERNAL_PORT")
    if base:
        first = int(base)
        for i, server in enumerate(_INTERNAL):
            flags += [f"-{server}.port={first + 2 * i}", f"-{server}.port.grpc={first + 2 * i + 1}"]
        flags += [f"-s3.port.grpc={first + 6}", f"-admin.port={first + 7}"]
        flags += [f"-admin.port.grpc={first + 8}", f"-debug.port={first + 9}"]
        ports += list(range(first, first + 10))
    else:
        # SeaweedFS's defaults: gRPC ports are the HTTP ports + 10000.
        ports += [_DEFAULTS[s] for s in (*_INTERNAL, "admin")]
        ports += [_DEFAULTS[s] + 10000 for s in (*_INTERNAL, "admin")] + [s3 + 10000]
    return s3, flags, ports


def binds_loopback_only(bind: str) -> bool:
    """True when HOST:PORT listens on a loopback address only (not 0.0.0.0, not a LAN
    address): then only this machine can reach the web server."""
    host = bind.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_address(bind: str) -> tuple[str, int]:
    """Where this machine reaches gunicorn's bind address (HOST:PORT)."""
    host, _, port = bind.rpartition(":")
    if host in ("", "0.0.0.0", "[::]"):  # noqa: S104 (we connect to it, not bind)
        host = "127.0.0.1"
    return host, int(port)
