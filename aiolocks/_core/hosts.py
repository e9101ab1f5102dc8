"""Whether a server address is this machine's loopback (for the ``*-no-tls`` doctor findings)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

__all__ = ["all_loopback", "is_loopback"]


def is_loopback(host: str) -> bool:
    """``host`` (a name or an address, IPv6 with or without ``[...]``) is the loopback.

    >>> is_loopback("127.0.0.1"), is_loopback("[::1]"), is_loopback("db.example")
    (True, True, False)
    """
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def all_loopback(hosts: Sequence[str]) -> bool:
    """There is at least one host in ``hosts``, and every one is the loopback."""
    return bool(hosts) and all(is_loopback(host) for host in hosts)
