"""Hostnames from the spec or a hostfile are validated before they go anywhere near a
launcher, and always travel as list elements of argv, never through a shell string.

Accepted: an RFC 1123 hostname (labels of letters, digits and '-', not starting or ending with
'-', at most 63 characters each, dots between them, 253 characters in all) whose last label is
not all digits, a dotted-quad IPv4 address, or an IPv6 address, optionally with a zone of
letters, digits, '_', '.' and '-' (`ipaddress` decides, so '::::' is rejected).

`is_loopback_host` tells which of them name this machine without any lookup: the name
`localhost` and the loopback addresses (all of 127.0.0.0/8, ::1, and 127.x as an IPv4-mapped
IPv6 address). Launchers start those nodes' processes here, without ssh, which lets two
"nodes" of one machine (127.0.0.1 and 127.0.0.2) rendezvous for real.
"""
from __future__ import annotations

import ipaddress
import re

from .errors import SpecError

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_MAX_CHARS = 253


_SCOPE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")   # an IPv6 zone such as 'eth0' in fe80::1%eth0


def _is_ip(host: str) -> bool:
    addr, _, scope = host.partition("%")
    if "%" in host and not (":" in addr and _SCOPE.match(scope)):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_valid_hostname(host) -> bool:
    """True for a plain hostname, an IPv4 or an IPv6 address."""
    if not isinstance(host, str) or not 0 < len(host) <= _MAX_CHARS:
        return False
    if _is_ip(host):
        return True
    # a name whose last label is all digits would be read as a (here invalid) IPv4 address
    return bool(_HOSTNAME.match(host)) and not host.rsplit(".", 1)[-1].isdigit()


LOOPBACK_NAMES = ("localhost",)
"""Host names that are this machine by definition (compared case-insensitively). Only these:
a name such as `localhost.example.com`, or this machine's own hostname, needs a lookup to tell,
and is treated as remote."""


def is_loopback_host(host) -> bool:
    """True when `host` is this machine by its spelling alone: 'localhost' (any case) or a
    loopback IP address: 127.0.0.0/8, ::1 (with or without a zone), ::ffff:127.x.y.z. No
    name resolution; anything else (0.0.0.0, ::, this machine's hostname or its LAN address,
    an invalid name) is False. Only well-formed hosts qualify (`is_valid_hostname`)."""
    if not is_valid_hostname(host):
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    if not _is_ip(host):
        return False
    addr = ipaddress.ip_address(host)
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def validate_hostname(host, path: str) -> str:
    """Return `host` if it is a plain hostname or IP address, else raise SpecError."""
    if not is_valid_hostname(host):
        shown = repr(host) if isinstance(host, str) else type(host).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        raise SpecError(path, f"{shown} is not a valid hostname; accepted: letters, digits, "
                              f"'-' and '.' (RFC 1123) or an IP address")
    return host
