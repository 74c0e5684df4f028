"""Where the client sends events and keeps its spool: arguments first, then the
environment (LIFEBOAT_URL, LIFEBOAT_TOKEN, LIFEBOAT_PROJECT, LIFEBOAT_RUN, ...)."""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it."""


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {raw!r}") from None


def default_run_key() -> str:
    """A run key for a job that did not name one: the script, the scheduler's job id when
    there is one (so a requeued Slurm job keeps its run), else the start time."""
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python"
    script = script or "python"
    for variable in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"):
        if os.environ.get(variable):
            return f"{script}-{os.environ[variable]}"
    return f"{script}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def default_spool_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lifeboat" / "spool"


@dataclass(frozen=True)
class Config:
    url: str
    token: str
    project: str = ""
    spool_root: Path = Path()
    spool_max_bytes: int = 256 * 1024 * 1024
    batch_size: int = 500
    timeout_s: float = 30.0
    max_backoff_s: float = 60.0

    @classmethod
    def resolve(
        cls,
        url: str | None = None,
        token: str | None = None,
        project: str | None = None,
        spool_dir: str | os.PathLike | None = None,
        **overrides,
    ) -> Config:
        url = (url or os.environ.get("LIFEBOAT_URL", "")).strip().rstrip("/")
        token = (token or os.environ.get("LIFEBOAT_TOKEN", "")).strip()
        if not token and os.environ.get("LIFEBOAT_TOKEN_FILE"):
            token = Path(os.environ["LIFEBOAT_TOKEN_FILE"]).read_text().strip()
        if not url:
            raise ConfigError("no server: pass url= or set LIFEBOAT_URL (e.g. http://host:8000)")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"LIFEBOAT_URL must start with http:// or https://, not {url!r}")
        if not token:
            raise ConfigError(
                "no token: pass token= or set LIFEBOAT_TOKEN (or LIFEBOAT_TOKEN_FILE)"
            )
        root = spool_dir or os.environ.get("LIFEBOAT_SPOOL_DIR") or default_spool_root()
        values = {
            "url": url,
            "token": token,
            "project": project or os.environ.get("LIFEBOAT_PROJECT", ""),
            "spool_root": Path(root),
            "spool_max_bytes": _int_env("LIFEBOAT_SPOOL_MAX_BYTES", 256 * 1024 * 1024),
        }
        values.update(overrides)
        return cls(**values)

    @property
    def spool_dir(self) -> Path:
        """One spool per server and token, so that a restarted job (same server, same
        token) delivers what its predecessor left, and two servers never mix."""
        digest = hashlib.sha256(f"{self.url}\n{self.token}".encode()).hexdigest()[:16]
        return self.spool_root / digest


def hostname() -> str:
    return socket.gethostname()


def process_rank() -> int:
    """This process's rank in a distributed job (0 when not distributed)."""
    for variable in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        raw = os.environ.get(variable, "").strip()
        if raw.isdigit():
            return int(raw)
    return 0


def process_world_size() -> int:
    """How many ranks the distributed job has (1 when not distributed), from the same
    launchers as process_rank(): torchrun, Slurm, Open MPI, MPICH/Intel MPI."""
    for variable in ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        raw = os.environ.get(variable, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return 1
