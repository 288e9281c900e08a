"""Hostnames from the spec or a hostfile are validated before they go anywhere near a
launcher, and always travel as list elements of argv, never through a shell string."""
from __future__ import annotations

import re

from .errors import SpecError

# RFC 1123 labels, dots between them; or an IPv4 / bracket-less IPv6 address.
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_IPV6 = re.compile(r"^[0-9A-Fa-f:]{2,39}$")


def validate_hostname(host, path: str) -> str:
    """Return `host` if it is a plain hostname or IP address, else raise SpecError."""
    if not isinstance(host, str) or not (_HOSTNAME.match(host) or _IPV6.match(host)):
        raise SpecError(path, f"{host!r} is not a valid hostname; accepted: letters, digits, "
                              f"'-' and '.' (RFC 1123) or an IP address")
    return host
