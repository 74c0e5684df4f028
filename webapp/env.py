"""Typed readers for settings that come from the environment.

Each reader fails loudly (ImproperlyConfigured) on a value it cannot parse, so a typo
in a deployment stops the process at start instead of running with a silent default.
A variable NAME may also be given as NAME_FILE, the path of a file holding the value
(Docker and Kubernetes secrets).

A variable the environment does not set may come from the settings file `make run` writes
(var/lifeboat.env, see webapp/env_file.py), once webapp/settings.py has named it with
use_env_file(): a real environment variable always wins over the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import overload

from django.core.exceptions import ImproperlyConfigured

from webapp.env_file import read_env_file

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_FROM_FILE: dict[str, str] = {}


def use_env_file(path: Path) -> bool:
    """Take the variables the environment lacks from PATH (KEY=VALUE lines) from now on.
    Returns whether the file was there; a missing file is no error (make run never ran)."""
    _FROM_FILE.clear()
    _FROM_FILE.update(read_env_file(path))
    return path.exists()


def _raw(name: str) -> str | None:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    if name in os.environ:
        return os.environ[name]
    return _FROM_FILE.get(name)


# With a str default the answer is a str (an unset or empty variable gives the default).
@overload
def env_str(name: str, default: str, *, required: bool = False) -> str: ...
@overload
def env_str(name: str, default: None = None, *, required: bool = False) -> str | None: ...
def env_str(name: str, default: str | None = None, *, required: bool = False) -> str | None:
    value = _raw(name)
    if value is None or value == "":
        if required:
            raise ImproperlyConfigured(f"the environment variable {name} must be set")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use 1/0, true/false)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be at least {minimum}")
    return number


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]
