"""One spelling of a storage target's place (its endpoint URL and prefix), so that two
targets naming one place look alike: StorageTarget.save() writes it, namespace.py
compares by it. Below the models, so that they can use it."""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


def normal_prefix(prefix: str) -> str:
    """The prefix as object keys use it (targets._prefix): no leading or trailing '/'."""
    return (prefix or "").strip("/")


def normal_endpoint(url: str) -> str:
    """An endpoint URL as one spelling: lower-case scheme and host, no default port, no
    trailing '/'. Empty stays empty (the deployment's endpoint)."""
    url = (url or "").strip()
    if not url:
        return ""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:
        return url.rstrip("/")  # not ours to fix: the outbound policy refuses it
    netloc = f"[{host}]" if ":" in host else host
    if port not in (None, DEFAULT_PORTS.get(scheme)):
        netloc += f":{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"
