"""``etcd://`` URLs: parsed and checked into :class:`EtcdOptions` before any I/O.

``etcd://h1:2379,h2:2379[/prefix][?lease_ttl=10&connect_timeout=5&request_timeout=5]``

* hosts: a comma list of ``host[:port]`` (port 2379 when left out; IPv6 in
  ``[...]``), tried in that order with failover;
* ``/prefix``: every key the backend writes lives under it (segments
  separated by ``/``; no empty, ``.`` or ``..`` segment, no control
  character; none = the root of the key space);
* ``lease_ttl``: the session lease's TTL, whole seconds >= 1 (default 10);
* ``connect_timeout``: seconds to find a member that answers (default 5);
* ``request_timeout``: deadline of one request, in seconds (default 5).

Options may also be given as keywords (they win over the query). Any
problem is a :class:`ValueError` that names the offending part.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, final

from .._core.timeouts import SETTING_RANGE, check_seconds
from .._core.urls import parse_positive_float, parse_url

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_PORT",
    "DEFAULT_REQUEST_TIMEOUT",
    "EtcdOptions",
    "parse_etcd_url",
]

DEFAULT_PORT: Final = 2379
DEFAULT_LEASE_TTL: Final = 10
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
DEFAULT_REQUEST_TIMEOUT: Final = 5.0
# etcd refuses longer leases (its MaxLeaseTTL is 9,000,000,000 s); a day is
# far more than any lock session needs, and a typo such as 100000 is caught.
_MAX_LEASE_TTL: Final = 86400


def _parse_lease_ttl(name: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"option {name}={text!r} must be a whole number of seconds >= 1")
    return _check_lease_ttl(name, int(text))


def _check_lease_ttl(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be a whole number of seconds >= 1, got {value!r}")
    if not 1 <= value <= _MAX_LEASE_TTL:
        raise ValueError(f"{name}={value} must be between 1 and {_MAX_LEASE_TTL} seconds")
    return value


def _check_seconds(name: str, value: object) -> float:
    return check_seconds(value, name, SETTING_RANGE)


_URL_OPTIONS: Final[Mapping[str, Callable[[str, str], object]]] = {
    "lease_ttl": _parse_lease_ttl,
    "connect_timeout": parse_positive_float,
    "request_timeout": parse_positive_float,
}


@final
@dataclass(frozen=True, slots=True)
class EtcdOptions:
    """A checked ``etcd://`` URL."""

    endpoints: tuple[str, ...]
    """``host:port`` of each member, in the order given (IPv6 in ``[...]``)."""
    prefix: str
    """Key prefix without leading or trailing ``/`` (``""``: the root)."""
    lease_ttl: int
    """TTL of the session lease, in seconds."""
    connect_timeout: float
    """Seconds to find an answering member."""
    request_timeout: float
    """Deadline of one request, in seconds."""

    @property
    def description(self) -> str:
        """The URL without options, for messages and ``repr``: ``etcd://h1:2379,h2:2379/prefix``."""
        path = f"/{self.prefix}" if self.prefix else ""
        return f"etcd://{','.join(self.endpoints)}{path}"


def _check_prefix(path: str, url: str) -> str:
    if path in ("", "/"):
        return ""
    body = path[1:]
    if body.endswith("/"):
        raise ValueError(f"key prefix {path!r} in {url!r} must not end with '/'")
    for segment in body.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"key prefix {path!r} in {url!r} has an invalid segment {segment!r}")
        if any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in segment):
            raise ValueError(f"key prefix {path!r} in {url!r} contains a control character")
    return body


def parse_etcd_url(url: str, **options: object) -> EtcdOptions:
    """Check ``url`` (and keyword ``options``, which win) without any I/O.

    >>> parse_etcd_url("etcd://10.0.0.1,10.0.0.2:2380/app?lease_ttl=5").endpoints
    ('10.0.0.1:2379', '10.0.0.2:2380')

    :raises ValueError: naming the bad part (scheme, host, port, prefix,
        credentials, unknown option or bad value).
    """
    parsed = parse_url(url, schemes=("etcd",), default_port=DEFAULT_PORT, options=_URL_OPTIONS)
    if parsed.username is not None or parsed.password is not None:
        raise ValueError(
            "credentials in an etcd:// URL are not supported (etcd authentication is not "
            "implemented by aiolocks yet)"
        )
    prefix = _check_prefix(parsed.path, url)
    values: dict[str, object] = dict(parsed.options)
    for key, value in options.items():
        if key not in _URL_OPTIONS:
            raise ValueError(
                f"unknown option {key!r} for etcd:// (allowed: {', '.join(sorted(_URL_OPTIONS))})"
            )
        values[key] = value
    return EtcdOptions(
        endpoints=tuple(str(host) for host in parsed.hosts),
        prefix=prefix,
        lease_ttl=_check_lease_ttl("lease_ttl", values.get("lease_ttl", DEFAULT_LEASE_TTL)),
        connect_timeout=_check_seconds(
            "connect_timeout", values.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        ),
        request_timeout=_check_seconds(
            "request_timeout", values.get("request_timeout", DEFAULT_REQUEST_TIMEOUT)
        ),
    )
