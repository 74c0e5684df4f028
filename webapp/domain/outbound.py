"""Which URLs this server may contact when a user gave the URL (webhooks, S3 endpoints).

A project admin types these URLs; the server (web process or worker) then connects from
inside the deployment's network, where a cloud metadata service, the database or an
on-prem S3 holding another project's data may answer. So, like GitLab's "allow requests
to the local network", a URL is refused when its host resolves to a loopback,
link-local, private, shared, unspecified, multicast or reserved address (IPv4-mapped and
6to4 forms included), unless the deployment lists the host or its network in
OUTBOUND_ALLOW (LIFEBOAT_OUTBOUND_ALLOW: `minio.internal,10.0.0.0/8,127.0.0.1:8333`).

check() resolves the host once and returns the address it checked; callers that can
(webapp/domain/channels/http_post.py) connect to that address, so a DNS answer that
changes between the check and the connection (rebinding) cannot move them elsewhere.
Only http and https; no user:password@ in the URL.

It lives at the top of the domain, not under health/, because alert channels and the
storage targets of replication both send requests to addresses an admin typed.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from django.conf import settings

SETTING = "LIFEBOAT_OUTBOUND_ALLOW"


class OutboundRefused(ValueError):
    """The URL may not be contacted from this deployment; the message says why, in words
    fit for a form error or an attempt's log."""


class OutboundUnresolvable(OSError):
    """The host has no address right now (DNS): worth another try later."""


@dataclass(frozen=True)
class Destination:
    scheme: str
    host: str  # as written in the URL: the Host header and the TLS server name
    port: int
    address: str  # the checked IP address to connect to
    target: str  # path and query, what goes on the request line


def _unwrap(ip: ipaddress.IPv4Address | ipaddress.IPv6Address):
    """The IPv4 address an IPv6 one carries (::ffff:a.b.c.d, 2002:a.b.c.d::), if any:
    it is where the packets end up."""
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


def is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True for a global unicast address; False for loopback, link-local, private,
    shared (100.64/10), unspecified, multicast, reserved and their IPv6-wrapped forms."""
    ip = _unwrap(ip)
    return not (
        ip.is_loopback
        or ip.is_link_local
        or ip.is_private
        or ip.is_unspecified
        or ip.is_multicast
        or ip.is_reserved
        or not ip.is_global
    )


@dataclass(frozen=True)
class Allowances:
    hosts: frozenset[str]
    host_ports: frozenset[tuple[str, int]]
    networks: tuple


def allowances() -> Allowances:
    """OUTBOUND_ALLOW parsed: host names, host:port pairs, IP addresses and networks."""
    hosts, host_ports, networks = set(), set(), []
    for raw in getattr(settings, "OUTBOUND_ALLOW", []) or []:
        entry = raw.strip().lower().rstrip(".")
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        host, sep, port = entry.rpartition(":")
        if sep and port.isdigit() and host and "]" not in port:
            host = host.strip("[]")
            host_ports.add((host, int(port)))
        else:
            hosts.add(entry.strip("[]"))
    return Allowances(frozenset(hosts), frozenset(host_ports), tuple(networks))


def _named(allowed: Allowances, host: str, port: int) -> bool:
    return host in allowed.hosts or (host, port) in allowed.host_ports


def _address_allowed(allowed: Allowances, ip) -> bool:
    return is_public(ip) or any(ip in net or _unwrap(ip) in net for net in allowed.networks)


def _resolve(host: str, port: int) -> list[str]:
    try:
        return [ipaddress.ip_address(host).compressed]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise OutboundUnresolvable(f"{host} cannot be resolved: {exc}") from None
    seen: list[str] = []
    for info in infos:
        # SOCK_STREAM answers are (host, port, ...) tuples: the host is a str.
        address = cast(str, info[4][0]).split("%", 1)[0]  # no IPv6 zone
        if address not in seen:
            seen.append(address)
    return seen


def check(url: str, *, what: str = "this URL") -> Destination:
    """The destination of `url` if this deployment may contact it, else OutboundRefused.
    Every address the host resolves to must be allowed (a name with one public and one
    private address is refused). Raises OutboundUnresolvable when DNS has no answer."""
    text = (url or "").strip()
    if any(c.isspace() or ord(c) < 32 for c in text):
        raise OutboundRefused(
            f"{what} contains spaces or control characters: give an http:// or https:// URL."
        )
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise OutboundRefused(f"{what} must be an http:// or https:// URL.")
    if parts.username is not None or parts.password is not None:
        raise OutboundRefused(f"{what} must not carry a user name or password (user@host).")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise OutboundRefused(f"{what} has no host: give an http:// or https:// URL.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise OutboundRefused(f"{what} has an invalid port.") from None
    allowed = allowances()
    addresses = _resolve(host, port)
    if not addresses:
        raise OutboundUnresolvable(f"{host} has no address")
    if not _named(allowed, host, port):
        for address in addresses:
            ip = ipaddress.ip_address(address)
            if not _address_allowed(allowed, ip):
                shown = host if host == address else f"{host} ({address})"
                kind = describe(ip)
                article = "an" if kind[0] in "aeiou" else "a"
                raise OutboundRefused(
                    f"{what} points at {shown}, {article} {kind} address; this deployment "
                    f"does not contact those unless its administrator allows the host or "
                    f"network in {SETTING}."
                )
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return Destination(parts.scheme, host, port, addresses[0], target)


def describe(ip) -> str:
    inner = _unwrap(ip)
    for name in ("loopback", "link_local", "unspecified", "multicast", "private", "reserved"):
        if getattr(inner, f"is_{name}"):
            return name.replace("_", "-")
    return "non-public"


def masked(url: str) -> str:
    """scheme://host[:port]/… : what pages, audit messages and events show of a URL whose
    path, query or user part may hold a secret (a Slack hook's token is its path)."""
    parts = urlsplit((url or "").strip())
    if not parts.scheme or not parts.hostname:
        return "…"
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}/…"
