"""Which S3 endpoint and which credentials a project's storage target may use.

A project admin types a target's endpoint_url and credentials_ref; the workers then
sign requests with the keys that reference names, from their own environment. So:

* credentials_ref must be a name the deployment admin granted to that project in
  S3_CREDENTIALS_REFS ("S3_BACKUP=ml-team|vision,S3_ARCHIVE=*"); an empty one means the
  deployment's own keys (S3_ACCESS_KEY_ID), for the projects in
  S3_DEFAULT_CREDENTIALS_PROJECTS (every project unless narrowed);
* endpoint_url must pass the outbound policy (webapp.domain.outbound): no loopback,
  link-local or private address unless LIFEBOAT_OUTBOUND_ALLOW names it. An empty
  endpoint_url is the deployment's own S3_ENDPOINT_URL (or AWS), which is not checked.

Both are checked when the target is saved (the settings form) and again whenever a
client is made (target_access), so a grant withdrawn later takes effect at once.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from webapp.domain import outbound

# A checked endpoint is trusted this long by one process: the API presigns URLs on every
# read and should not ask DNS each time.
ENDPOINT_CHECK_TTL_S = 60.0
_checked: dict[str, float] = {}
_checked_lock = threading.Lock()


class TargetRefused(Exception):
    """The target's endpoint or credentials are not this project's to use; the message
    says why, fit for a form error and a replica's last error."""


@dataclass(frozen=True)
class TargetAccess:
    endpoint: str | None
    region: str
    key: str | None
    secret: str | None


def _grants() -> dict[str, set[str]]:
    grants: dict[str, set[str]] = {}
    for entry in settings.S3_CREDENTIALS_REFS:
        name, _, slugs = entry.partition("=")
        grants.setdefault(name.strip(), set()).update(
            s.strip() for s in slugs.split("|") if s.strip()
        )
    return grants


def refs_for(project_slug: str) -> list[str]:
    """The credential names this project may put in a target's credentials_ref."""
    return sorted(
        name for name, slugs in _grants().items() if "*" in slugs or project_slug in slugs
    )


def may_use_default_keys(project_slug: str) -> bool:
    allowed = settings.S3_DEFAULT_CREDENTIALS_PROJECTS
    return "*" in allowed or project_slug in allowed


def check_credentials_ref(project_slug: str, ref: str) -> None:
    ref = (ref or "").strip()
    if not ref:
        if not may_use_default_keys(project_slug):
            raise TargetRefused(
                "This project may not use the deployment's own S3 keys: name credentials "
                "the deployment's administrator granted it (S3_CREDENTIALS_REFS)."
            )
        return
    if ref not in refs_for(project_slug):
        granted = ", ".join(refs_for(project_slug)) or "none"
        raise TargetRefused(
            f"The credentials {ref!r} are not granted to this project by the deployment's "
            f"administrator (S3_CREDENTIALS_REFS); granted: {granted}."
        )


def check_endpoint(url: str, *, saving: bool = False) -> None:
    """Refuse an endpoint the outbound policy refuses (TargetRefused). A host DNS cannot
    resolve now is accepted when saving (it is checked again on use) and is a
    ConnectionError on use, which the callers retry like any unreachable target."""
    if not url:
        return
    now = time.monotonic()
    with _checked_lock:
        if _checked.get(url, 0) > now:
            return
    try:
        outbound.check(url, what="The S3 endpoint URL")
    except outbound.OutboundRefused as exc:
        raise TargetRefused(str(exc)) from None
    except outbound.OutboundUnresolvable as exc:
        if saving:
            return
        raise ConnectionError(str(exc)) from None
    with _checked_lock:
        _checked[url] = now + ENDPOINT_CHECK_TTL_S


@receiver(setting_changed)
def forget_checked_endpoints(setting=None, **kwargs) -> None:
    """When the outbound allowances change (tests), check every endpoint again."""
    if setting in (None, "OUTBOUND_ALLOW"):
        with _checked_lock:
            _checked.clear()


def target_access(target) -> TargetAccess:
    """The endpoint, region and keys to reach `target` with, after checking that its
    project may use them. Raises TargetRefused."""
    slug = target.project.slug
    check_credentials_ref(slug, target.credentials_ref)
    check_endpoint(target.endpoint_url)
    key, secret = settings.S3_ACCESS_KEY_ID, settings.S3_SECRET_ACCESS_KEY
    ref = (target.credentials_ref or "").strip()
    if ref:
        named_key = os.environ.get(f"{ref}_ACCESS_KEY_ID")
        named_secret = os.environ.get(f"{ref}_SECRET_ACCESS_KEY")
        if named_key and named_secret:
            key, secret = named_key, named_secret
        elif not may_use_default_keys(slug):
            # Falling back to the deployment's keys would hand them to a project that
            # may not use them.
            raise TargetRefused(
                f"The credentials {ref!r} are not configured on this worker "
                f"({ref}_ACCESS_KEY_ID and {ref}_SECRET_ACCESS_KEY)."
            )
    return TargetAccess(
        endpoint=target.endpoint_url or settings.S3_ENDPOINT_URL or None,
        region=target.region or settings.S3_REGION,
        key=key,
        secret=secret,
    )
