"""``postgresql://`` (and ``postgres://``) URLs parsed into checked options, before any I/O.

::

    postgresql://user:password@host:5432/database?heartbeat=5&mode=lease&connect_timeout=5

Query options (all optional):

=================  ========  ====================================================
option             default   meaning
=================  ========  ====================================================
``mode``           advisory  ``advisory`` (session advisory locks on a dedicated
                             connection) or ``lease`` (the lease table; works
                             behind a transaction-pooling proxy)
``heartbeat``      5         seconds between the checks of our locks in
                             ``pg_locks`` (``advisory``); a hold is declared
                             lost within ``heartbeat`` + 1 s of its session's end
``lease_time``     30        seconds a lease lives unless renewed (``lease``);
                             renewed every third of it
``connect_timeout`` 10       seconds for each connection attempt
``schema``         (none)    schema of the fencing and lease tables (default:
                             the ``search_path``)
``table_prefix``   aiolocks  the tables are ``<prefix>_fencing`` and
                             ``<prefix>_leases``
``create_tables``  true      create missing tables on first use; when false, a
                             missing table is an error that shows the DDL
``sslmode``        (none)    ``disable``, ``allow``, ``prefer``, ``require``,
                             ``verify-ca`` or ``verify-full`` (as libpq)
``sslrootcert``    (none)    CA file the server's certificate must chain to
``sslcert``        (none)    client certificate file (with ``sslkey``)
``sslkey``         (none)    the client certificate's key file
``application_name`` aiolocks  shown in ``pg_stat_activity``
=================  ========  ====================================================

Several hosts (``h1:5432,h2:5432``) are tried in order, as asyncpg does. The
database defaults to the user name, the user to ``postgres``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, final
from urllib.parse import unquote

from .._core.urls import HostPort, parse_bool, parse_positive_float, parse_url
from ._sql import TableNames

__all__ = ["SCHEMES", "PostgresOptions", "parse_postgres_url"]

#: The URL schemes of the PostgreSQL backend.
SCHEMES: Final = ("postgresql", "postgres")

_MODES: Final = ("advisory", "lease")
_SSL_MODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_DEFAULT_PORT: Final = 5432


@final
@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """A checked ``postgresql://`` URL."""

    hosts: tuple[HostPort, ...]
    database: str
    user: str
    password: str | None
    mode: Literal["advisory", "lease"]
    heartbeat: float
    lease_time: float
    connect_timeout: float
    tables: TableNames
    create_tables: bool
    sslmode: str | None
    application_name: str
    sslrootcert: str | None = None
    sslcert: str | None = None
    sslkey: str | None = None

    def ssl_argument(self) -> object:
        """asyncpg's ``ssl=``: libpq's mode name, or a context built from the files.

        With no file option asyncpg applies libpq's rules itself (``PGSSLROOTCERT``,
        ``~/.postgresql/root.crt``). With ``sslrootcert`` the server's certificate
        must chain to it (``require`` then verifies the chain, as libpq does);
        ``verify-full`` also checks the host name.
        """
        if self.sslrootcert is None and self.sslcert is None:
            return self.sslmode
        import ssl

        context = ssl.create_default_context(cafile=self.sslrootcert)
        if self.sslmode != "verify-full":
            context.check_hostname = False
            if self.sslrootcert is None:  # require, no CA given: encrypted, not verified
                context.verify_mode = ssl.CERT_NONE
        if self.sslcert is not None:
            context.load_cert_chain(self.sslcert, self.sslkey)
        return context

    def connect_kwargs(self) -> dict[str, object]:
        """Keyword arguments for ``asyncpg.connect()`` (password included)."""
        kwargs: dict[str, object] = {
            "host": [hp.host for hp in self.hosts],
            "port": [hp.port for hp in self.hosts],
            "user": self.user,
            "database": self.database,
            "timeout": self.connect_timeout,
            "server_settings": {"application_name": self.application_name},
        }
        if self.password is not None:
            kwargs["password"] = self.password
        if self.sslmode is not None:
            kwargs["ssl"] = self.ssl_argument()
        if self.mode == "lease":
            # A transaction pooler cannot keep prepared statements per client.
            kwargs["statement_cache_size"] = 0
        return kwargs

    def __repr__(self) -> str:
        # Never show the password.
        hosts = ",".join(str(hp) for hp in self.hosts)
        return (
            f"PostgresOptions({self.user}@{hosts}/{self.database}, mode={self.mode}, "
            f"heartbeat={self.heartbeat:g}, lease_time={self.lease_time:g})"
        )


def _choice(values: tuple[str, ...]) -> Callable[[str, str], str]:
    def convert(name: str, text: str) -> str:
        if text not in values:
            raise ValueError(f"option {name}={text!r} must be one of {', '.join(values)}")
        return text

    return convert


def _text(name: str, text: str) -> str:
    if not text or any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise ValueError(f"option {name}={text!r} must be non-empty printable text")
    return text


def _seconds(limit: float) -> Callable[[str, str], float]:
    def convert(name: str, text: str) -> float:
        value = parse_positive_float(name, text)
        if value > limit:
            raise ValueError(f"option {name}={text!r} must be at most {limit:g} seconds")
        return value

    return convert


_OPTIONS: Final[Mapping[str, Callable[[str, str], object]]] = {
    "mode": _choice(_MODES),
    "heartbeat": _seconds(3600.0),
    "lease_time": _seconds(86400.0),
    "connect_timeout": _seconds(3600.0),
    "schema": _text,
    "table_prefix": _text,
    "create_tables": parse_bool,
    "sslmode": _choice(_SSL_MODES),
    "sslrootcert": _text,
    "sslcert": _text,
    "sslkey": _text,
    "application_name": _text,
}


def _ssl_files(options: Mapping[str, object]) -> dict[str, str | None]:
    """``sslrootcert``/``sslcert``/``sslkey``: readable files, and only with TLS on."""
    files: dict[str, str | None] = {}
    for name in ("sslrootcert", "sslcert", "sslkey"):
        value = options.get(name)
        if value is not None and not (
            os.path.isfile(str(value)) and os.access(str(value), os.R_OK)
        ):
            raise ValueError(f"option {name}={value!r}: no such readable file")
        files[name] = None if value is None else str(value)
    given = [name for name, value in files.items() if value is not None]
    if given and options.get("sslmode") not in ("require", "verify-ca", "verify-full"):
        raise ValueError(f"option {given[0]} needs sslmode=require, verify-ca or verify-full")
    if files["sslkey"] is not None and files["sslcert"] is None:
        raise ValueError("option sslkey needs sslcert (the client certificate)")
    return files


def _float(options: Mapping[str, object], name: str, default: float) -> float:
    value = options.get(name, default)
    assert isinstance(value, float)  # the converters above made it
    return value


def parse_postgres_url(url: str) -> PostgresOptions:
    """Parse and check a ``postgresql://`` or ``postgres://`` URL (no network I/O).

    >>> parse_postgres_url("postgres://app@db:5433/locks?mode=lease").mode
    'lease'

    :raises ValueError: naming the bad part (scheme, host, port, option, value).
    """
    parsed = parse_url(url, schemes=SCHEMES, default_port=_DEFAULT_PORT, options=_OPTIONS)
    options = parsed.options
    database = parsed.path.lstrip("/")
    if "/" in database:
        raise ValueError(
            f"the path of a {parsed.scheme}:// URL is one database name, got {parsed.path!r}"
        )
    database = unquote(database)
    user = parsed.username or "postgres"
    mode = str(options.get("mode", "advisory"))
    if mode == "advisory" and "lease_time" in options:
        raise ValueError(
            "option lease_time applies to mode=lease only (advisory locks do not expire)"
        )
    if mode == "lease" and "heartbeat" in options:
        raise ValueError(
            "option heartbeat applies to mode=advisory only (mode=lease renews every lease_time/3)"
        )
    heartbeat = _float(options, "heartbeat", 5.0)
    lease_time = _float(options, "lease_time", 30.0)
    if mode == "lease" and lease_time < 0.5:
        raise ValueError(f"option lease_time={lease_time:g} must be at least 0.5 seconds")
    connect_timeout = _float(options, "connect_timeout", 10.0)
    schema = options.get("schema")
    prefix = options.get("table_prefix", "aiolocks")
    tables = TableNames(
        schema=None if schema is None else str(schema),
        prefix=str(prefix),
    )
    sslmode = options.get("sslmode")
    return PostgresOptions(
        hosts=parsed.hosts,
        database=database or user,
        user=user,
        password=parsed.password,
        mode="lease" if mode == "lease" else "advisory",
        heartbeat=heartbeat,
        lease_time=lease_time,
        connect_timeout=connect_timeout,
        tables=tables,
        create_tables=bool(options.get("create_tables", True)),
        sslmode=None if sslmode is None else str(sslmode),
        application_name=str(options.get("application_name", "aiolocks")),
        **_ssl_files(options),
    )
