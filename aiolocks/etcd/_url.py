"""``etcd://`` URLs: parsed and checked into :class:`EtcdOptions` before any I/O.

``etcd://[user:password@]h1:2379,h2:2379[/prefix][?lease_ttl=10&connect_timeout=5&request_timeout=5]``
(``etcds://`` for TLS)

* ``user:password@``: etcd user authentication (the password is never kept
  in a message or ``repr``);

* hosts: a comma list of ``host[:port]`` (port 2379 when left out; IPv6 in
  ``[...]``), tried in that order with failover;
* ``/prefix``: every key the backend writes lives under it (segments
  separated by ``/``; no empty, ``.`` or ``..`` segment, no control
  character; none = the root of the key space);
* ``lease_ttl``: the session lease's TTL, whole seconds >= 1 (default 10);
* ``connect_timeout``: seconds to find a member that answers (default 5);
* ``request_timeout``: deadline of one request, in seconds (default 5);
* ``tls`` (``true``/``false``; ``etcds://`` means ``true``), ``ssl_ca_certs``
  (the authority that signed the members' certificates; default: the
  system's), ``ssl_certfile`` and ``ssl_keyfile`` (a client certificate, for
  members started with ``--client-cert-auth``): readable PEM files, checked
  here.

Options may also be given as keywords (they win over the query). Any
problem is a :class:`ValueError` that names the offending part.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, final

from .._core.timeouts import SETTING_RANGE, check_seconds
from .._core.urls import parse_bool, parse_positive_float, parse_url, redact_url

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_PORT",
    "DEFAULT_REQUEST_TIMEOUT",
    "EtcdOptions",
    "EtcdTLS",
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


def _text(name: str, text: str) -> str:
    return text


_URL_OPTIONS: Final[Mapping[str, Callable[[str, str], object]]] = {
    "lease_ttl": _parse_lease_ttl,
    "connect_timeout": parse_positive_float,
    "request_timeout": parse_positive_float,
    "tls": parse_bool,
    "ssl_ca_certs": _text,
    "ssl_certfile": _text,
    "ssl_keyfile": _text,
}
_SSL_FILES: Final = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


@final
@dataclass(frozen=True, slots=True)
class EtcdTLS:
    """TLS settings of an ``etcds://`` (or ``?tls=true``) URL: paths of PEM files.

    The files are read when the client opens its channels, so a renewed
    certificate is picked up by a new backend without a restart.
    """

    ca_certs: str | None = None
    """The authority that signed the members' certificates (``None``: the system's)."""
    certfile: str | None = None
    """The client certificate (members started with ``--client-cert-auth``)."""
    keyfile: str | None = None
    """The client certificate's private key (``None``: inside ``certfile``)."""


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
    username: str | None = None
    """The etcd user to authenticate as (``None``: no authentication)."""
    password: str | None = field(default=None, repr=False)
    """That user's password (never in a message or ``repr``)."""
    tls: EtcdTLS | None = None
    """TLS settings (``None``: plain-text gRPC)."""

    @property
    def description(self) -> str:
        """The URL without options or password, for messages and ``repr``:
        ``etcd://user@h1:2379,h2:2379/prefix`` (``etcds://`` with TLS)."""
        path = f"/{self.prefix}" if self.prefix else ""
        user = f"{self.username}@" if self.username else ""
        scheme = "etcds" if self.tls is not None else "etcd"
        return f"{scheme}://{user}{','.join(self.endpoints)}{path}"


def _check_prefix(path: str, url: str) -> str:
    url = redact_url(url)
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
    parsed = parse_url(
        url, schemes=("etcd", "etcds"), default_port=DEFAULT_PORT, options=_URL_OPTIONS
    )
    if parsed.password is not None and parsed.username is None:
        raise ValueError("an etcd:// URL with a password needs the user name too (user:pass@)")
    if parsed.username is not None and parsed.password is None:
        raise ValueError(f"etcd user {parsed.username!r} needs a password (user:pass@)")
    prefix = _check_prefix(parsed.path, url)
    values: dict[str, object] = dict(parsed.options)
    for key, value in options.items():
        if key not in _URL_OPTIONS:
            raise ValueError(
                f"unknown option {key!r} for etcd:// (allowed: {', '.join(sorted(_URL_OPTIONS))})"
            )
        values[key] = value
    return EtcdOptions(
        username=parsed.username,
        password=parsed.password,
        tls=_check_tls(parsed.scheme, values),
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


def _check_tls(scheme: str, values: Mapping[str, object]) -> EtcdTLS | None:
    """``tls``/``etcds://`` and the ``ssl_*`` files (readable, and only with TLS on)."""
    tls = values.get("tls")
    if tls is not None and not isinstance(tls, bool):
        raise ValueError(f"tls must be true or false, got {tls!r}")
    if scheme == "etcds" and tls is False:
        raise ValueError("tls=false contradicts the etcds:// scheme (TLS)")
    enabled = scheme == "etcds" or tls is True
    files: dict[str, str | None] = {}
    for name in _SSL_FILES:
        value = values.get(name)
        if value is None:
            files[name] = None
            continue
        if not enabled:
            raise ValueError(f"{name} needs TLS: use etcds:// or ?tls=true")
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be the path of a PEM file, got {value!r}")
        if not (os.path.isfile(value) and os.access(value, os.R_OK)):
            raise ValueError(f"{name}={value!r}: no such readable file")
        files[name] = value
    if files["ssl_keyfile"] is not None and files["ssl_certfile"] is None:
        raise ValueError("ssl_keyfile needs ssl_certfile (the client certificate)")
    if not enabled:
        return None
    return EtcdTLS(files["ssl_ca_certs"], files["ssl_certfile"], files["ssl_keyfile"])
