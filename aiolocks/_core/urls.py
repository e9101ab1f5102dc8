"""Helpers to parse backend URLs with errors that name the offending part.

Every backend parses its own URL with these, before any network I/O, and
raises :class:`ValueError` whose message quotes the bad piece.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import final
from urllib.parse import parse_qsl, unquote

__all__ = [
    "HostPort",
    "ParsedURL",
    "parse_bool",
    "parse_positive_float",
    "parse_positive_int",
    "parse_url",
]


@final
@dataclass(frozen=True, slots=True)
class HostPort:
    """One ``host:port`` of a URL."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@final
@dataclass(frozen=True, slots=True)
class ParsedURL:
    """A backend URL split into checked parts."""

    scheme: str
    hosts: tuple[HostPort, ...]
    path: str
    username: str | None
    password: str | None
    options: Mapping[str, object] = field(default_factory=dict)
    raw: str = ""


def _redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (never raises: it builds error messages)."""
    scheme, sep, rest = url.partition("://")
    netloc = rest.split("/", 1)[0].split("?", 1)[0]
    userinfo, at, _ = netloc.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{rest[len(userinfo) + 1 :]}"


def _parse_port(text: str, url: str) -> int:
    if not text.isdigit():
        raise ValueError(f"invalid port {text!r} in {_redact(url)!r}: a port is a number 1-65535")
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"invalid port {port} in {_redact(url)!r}: a port is a number 1-65535")
    return port


def _parse_host(item: str, default_port: int | None, url: str) -> HostPort:
    if not item:
        raise ValueError(f"empty host in {_redact(url)!r} (check for a stray ',')")
    if item.startswith("["):
        end = item.find("]")
        if end < 0:
            raise ValueError(f"unclosed '[' in host {item!r} of {_redact(url)!r}")
        host, rest = item[1:end], item[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"invalid host {item!r} in {_redact(url)!r}")
        port_text = rest[1:] if rest else ""
    elif item.count(":") > 1:
        raise ValueError(f"invalid host {item!r} in {_redact(url)!r}: put IPv6 addresses in [...]")
    else:
        host, _, port_text = item.partition(":")
        if ":" in item and not port_text:
            raise ValueError(f"empty port after {host!r} in {_redact(url)!r}")
    if not host:
        raise ValueError(f"missing host name in {item!r} of {_redact(url)!r}")
    bad = [ch for ch in host if ch.isspace() or ch in "/?#@"]
    if bad:
        raise ValueError(f"invalid character {bad[0]!r} in host {host!r} of {_redact(url)!r}")
    if port_text:
        port = _parse_port(port_text, url)
    elif default_port is None:
        raise ValueError(f"host {host!r} in {_redact(url)!r} needs a port")
    else:
        port = default_port
    return HostPort(host, port)


def parse_url(
    url: str,
    *,
    schemes: tuple[str, ...],
    default_port: int | None,
    options: Mapping[str, Callable[[str, str], object]],
    require_host: bool = True,
) -> ParsedURL:
    """Split ``url`` into hosts, path, credentials and converted query options.

    ``options`` maps each allowed query option to a converter ``(name, text) ->
    value`` that raises :class:`ValueError` naming the option. An option not
    in ``options`` is a :class:`ValueError` that names it and lists the allowed
    ones.
    """
    if not isinstance(url, str):
        raise ValueError(f"backend URL must be a str, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"invalid backend URL {_redact(url)!r}: expected 'scheme://...'")
    if scheme not in schemes:
        raise ValueError(f"URL scheme {scheme!r} is not one of {', '.join(schemes)}")
    if "#" in rest:
        raise ValueError(f"backend URL {_redact(url)!r} must not have a '#fragment'")
    netloc_path, _, query = rest.partition("?")
    netloc, slash, path = netloc_path.partition("/")
    path = slash + path if slash else ""
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    hosts: tuple[HostPort, ...] = ()
    if netloc:
        hosts = tuple(_parse_host(item.strip(), default_port, url) for item in netloc.split(","))
    elif require_host:
        raise ValueError(f"backend URL {_redact(url)!r} names no host")
    parsed_options: dict[str, object] = {}
    if query:
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            raise ValueError(f"malformed query string {query!r} in {_redact(url)!r}") from None
        for key, value in pairs:
            if key not in options:
                allowed = ", ".join(sorted(options)) or "none"
                raise ValueError(
                    f"unknown option {key!r} in {_redact(url)!r} "
                    f"(allowed for {scheme}://: {allowed})"
                )
            if key in parsed_options:
                raise ValueError(f"option {key!r} given twice in {_redact(url)!r}")
            parsed_options[key] = options[key](key, value)
    return ParsedURL(scheme, hosts, path, username, password, parsed_options, url)


def parse_positive_float(name: str, text: str) -> float:
    """Converter for a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"option {name}={text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"option {name}={text!r} must be a finite number > 0")
    return value


def parse_positive_int(name: str, text: str) -> int:
    """Converter for an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"option {name}={text!r} must be an integer >= 1")
    return int(text)


def parse_bool(name: str, text: str) -> bool:
    """Converter for ``true/false/1/0/yes/no``."""
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"option {name}={text!r} must be true or false")
