"""Hostnames from the spec or a hostfile are validated before they go anywhere near a
launcher, and always travel as list elements of argv, never through a shell string.

Accepted: an RFC 1123 hostname (labels of letters, digits and '-', not starting or ending with
'-', at most 63 characters each, dots between them, 253 characters in all) whose last label is
not all digits, a dotted-quad IPv4 address, or an IPv6 address, optionally with a zone of
letters, digits, '_', '.' and '-' (`ipaddress` decides, so '::::' is rejected).
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


def validate_hostname(host, path: str) -> str:
    """Return `host` if it is a plain hostname or IP address, else raise SpecError."""
    if not is_valid_hostname(host):
        shown = repr(host) if isinstance(host, str) else type(host).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        raise SpecError(path, f"{shown} is not a valid hostname; accepted: letters, digits, "
                              f"'-' and '.' (RFC 1123) or an IP address")
    return host
