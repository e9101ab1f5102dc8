"""Helpers to parse backend URLs with errors that name the offending part.

Every backend parses its own URL with these, before any network I/O, and
raises :class:`ValueError` whose message quotes the bad piece.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import final
from urllib.parse import parse_qsl, unquote

__all__ = [
    "SECRET_OPTIONS",
    "HostPort",
    "ParsedURL",
    "parse_bool",
    "parse_positive_float",
    "parse_positive_int",
    "parse_url",
    "redact_url",
    "scrub",
    "scrub_exception",
    "split_userinfo",
    "url_secrets",
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
    password: str | None = field(repr=False)
    options: Mapping[str, object] = field(default_factory=dict, repr=False)
    raw: str = field(default="", repr=False)

    @property
    def redacted(self) -> str:
        """The URL as given, with its password and secret options as ``***``."""
        return redact_url(self.raw)


#: query options whose values are secrets: printed as ``***`` like a URL password
SECRET_OPTIONS = frozenset({"password", "sentinel_password", "ssl_password", "token"})

#: a bare secret shorter than this is not searched for in free text by :func:`scrub`
#: (it would mangle ordinary words); URLs holding it are still redacted whole
MIN_SCRUBBED_SECRET = 4


def split_userinfo(rest: str) -> tuple[str | None, str]:
    """``(userinfo, remainder)`` of what follows ``scheme://``.

    The userinfo runs to the *last* ``@`` of the URL, so a password may hold
    ``/``, ``?``, ``#``, ``:`` or ``@`` unencoded (percent-encoding works as
    well); an ``@`` in an option value must then be written ``%40``.
    ``userinfo`` is None when the URL has no ``@``.
    """
    userinfo, at, remainder = rest.rpartition("@")
    if not at:
        return None, rest
    return userinfo, remainder


def _redact_query(query: str) -> str:
    parts = []
    for part in query.split("&"):
        key, eq, _ = part.partition("=")
        parts.append(f"{key}=***" if eq and key in SECRET_OPTIONS else part)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """``url`` with its password and secret options replaced by ``***``.

    Never raises (it builds error messages); whatever characters the
    password holds, none of them is left:

    >>> redact_url("redis://u:pa/ss@h:6379/0?sentinel_password=x")
    'redis://u:***@h:6379/0?sentinel_password=***'
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        # not a URL: anything after a ':' may be a password
        head, colon, _ = url.partition(":")
        return f"{head}:***" if colon and "@" in url else url
    userinfo, remainder = split_userinfo(rest)
    if userinfo is not None and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{remainder}"
    elif userinfo is not None:
        rest = f"{userinfo}@{remainder}"
    base, q, query = rest.partition("?")
    return f"{scheme}://{base}{q}{_redact_query(query) if q else ''}"


def url_secrets(url: str) -> list[str]:
    """The password and secret option values of ``url`` (raw, percent-decoded, and the
    pieces of the password between reserved characters)."""
    found: list[str] = []
    _, sep, rest = url.partition("://")
    userinfo, remainder = split_userinfo(rest) if sep else (None, url)
    if userinfo is not None and ":" in userinfo:
        password = userinfo.split(":", 1)[1]
        # a parser that splits at reserved characters quotes pieces of it
        found += [password, unquote(password), *re.split(r"[/?#@:&=,;]", password)]
    query = remainder.partition("?")[2]
    for part in query.split("&"):
        key, eq, value = part.partition("=")
        if eq and key in SECRET_OPTIONS:
            found += [value, unquote(value)]
    return [s for s in dict.fromkeys(found) if s]


def scrub(text: str, *urls: str) -> str:
    """``text`` with each of ``urls`` redacted, and their secrets replaced by ``***``.

    The one path by which a message that may quote a backend URL is made
    safe to print, log or raise.
    """
    for url in urls:
        if not isinstance(url, str) or not url:
            continue
        text = text.replace(url, redact_url(url))
        for secret in sorted(url_secrets(url), key=len, reverse=True):
            if len(secret) >= MIN_SCRUBBED_SECRET:
                text = text.replace(secret, "***")
    return text


def scrub_exception(exc: BaseException, *urls: str) -> BaseException:
    """Redact ``urls`` (see :func:`scrub`) in the string arguments of ``exc`` and its chain.

    Returns ``exc`` (changed in place, type and traceback kept), so a
    driver's message that quotes a URL or a password is safe to show.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        args = current.args
        cleaned = tuple(scrub(a, *urls) if isinstance(a, str) else a for a in args)
        if cleaned != args:
            try:
                current.args = cleaned
            except (AttributeError, TypeError):  # pragma: no cover - exotic exception types
                pass
        current = current.__cause__ or current.__context__
    return exc


_redact = redact_url


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
    userinfo, rest = split_userinfo(rest)
    username = password = None
    if userinfo is not None:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    if "#" in rest:
        raise ValueError(f"backend URL {_redact(url)!r} must not have a '#fragment'")
    netloc_path, _, query = rest.partition("?")
    netloc, slash, path = netloc_path.partition("/")
    path = slash + path if slash else ""
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
            raise ValueError(
                f"malformed query string {_redact_query(query)!r} in {_redact(url)!r}"
            ) from None
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
