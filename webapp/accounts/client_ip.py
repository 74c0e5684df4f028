"""The client address that login attempts are counted against (django-axes)."""

from __future__ import annotations

from django.conf import settings


def client_ip(request) -> str:
    """REMOTE_ADDR; behind a proxy named by LOGIN_CLIENT_IP_HEADER, the last address of
    that header: the one the proxy itself appended (the ones before it are whatever the
    client sent, so a client could pick any of them)."""
    header = settings.LOGIN_CLIENT_IP_HEADER
    if header:
        value = request.META.get("HTTP_" + header.strip().upper().replace("-", "_"), "")
        last = value.split(",")[-1].strip()
        if last:
            return last
    return request.META.get("REMOTE_ADDR", "")
