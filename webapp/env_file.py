"""The settings file of a `make run` stack: var/lifeboat.env.

scripts/run_stack.py writes the settings it chose (SECRET_KEY, SITE_URL, REDIS_URL, the S3
endpoint and keys, ...) there, so that a command run later in the same checkout
(`.venv/bin/python manage.py ...`, `.venv/bin/celery -A workers worker ...`) finds the
running stack without anything exported. Format: `KEY=VALUE` lines, `#` comments; the
value is everything after the first `=`, unquoted. Mode 0600: it holds secrets.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

NAME = "lifeboat.env"


def read_env_file(path: Path) -> dict[str, str]:
    """The KEY=VALUE pairs of PATH; {} when there is no such file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ImproperlyConfigured(f"the settings file {path} cannot be read: {exc}") from exc
    pairs = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ImproperlyConfigured(f"{path}:{number}: expected KEY=VALUE, got {line!r}")
        pairs[key.strip()] = value
    return pairs


def write_env_file(path: Path, values: dict[str, str], header: str) -> None:
    """Write VALUES to PATH whole or not at all, readable by its owner only."""
    for key, value in values.items():
        if "\n" in value or "\r" in value:
            raise ValueError(f"{key}: a value on more than one line cannot be kept in {path}")
    text = "".join(f"# {line}\n" for line in header.splitlines())
    text += "".join(f"{key}={value}\n" for key, value in values.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
