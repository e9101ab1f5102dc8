"""postgresql:// URL parsing: checked options, clear errors before any I/O."""

from __future__ import annotations

import re

import pytest

from aiolocks._core.urls import HostPort
from aiolocks.postgres._sql import TableNames
from aiolocks.postgres._url import parse_postgres_url


def test_defaults() -> None:
    opts = parse_postgres_url("postgresql://db.example")
    assert opts.hosts == (HostPort("db.example", 5432),)
    assert (opts.user, opts.database, opts.password) == ("postgres", "postgres", None)
    assert (opts.mode, opts.heartbeat, opts.lease_time, opts.connect_timeout) == (
        "advisory",
        5.0,
        30.0,
        10.0,
    )
    assert opts.tables == TableNames() and opts.create_tables is True
    assert opts.sslmode is None and opts.application_name == "aiolocks"


def test_full_url_and_postgres_alias() -> None:
    opts = parse_postgres_url(
        "postgres://app:p%40ss@h1:5433,h2/locks%20db?mode=lease&lease_time=12.5"
        "&connect_timeout=5&schema=ops&table_prefix=locks&create_tables=false"
        "&sslmode=verify-full&application_name=worker-7"
    )
    assert opts.hosts == (HostPort("h1", 5433), HostPort("h2", 5432))
    assert (opts.user, opts.password, opts.database) == ("app", "p@ss", "locks db")
    assert (opts.mode, opts.lease_time, opts.connect_timeout) == ("lease", 12.5, 5.0)
    assert opts.tables.fencing == '"ops"."locks_fencing"'
    assert opts.create_tables is False and opts.sslmode == "verify-full"
    kwargs = opts.connect_kwargs()
    assert kwargs["host"] == ["h1", "h2"] and kwargs["port"] == [5433, 5432]
    assert kwargs["password"] == "p@ss" and kwargs["ssl"] == "verify-full"
    assert kwargs["statement_cache_size"] == 0  # lease mode may run behind a pooler
    assert kwargs["server_settings"] == {"application_name": "worker-7"}
    assert "p@ss" not in repr(opts)


def test_database_defaults_to_the_user() -> None:
    assert parse_postgres_url("postgresql://alice@h").database == "alice"
    assert "statement_cache_size" not in parse_postgres_url("postgresql://h").connect_kwargs()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://h/db", "scheme 'mysql'"),
        ("postgresql:///db", "names no host"),
        ("postgresql://h:99999/db", "invalid port 99999"),
        ("postgresql://h/db/extra", "one database name"),
        ("postgresql://h/db?mode=session", "mode='session'"),
        ("postgresql://h/db?heartbeat=0", "heartbeat='0'"),
        ("postgresql://h/db?heartbeat=soon", "heartbeat='soon' is not a number"),
        ("postgresql://h/db?heartbeat=inf", "heartbeat='inf'"),
        ("postgresql://h/db?heartbeat=99999", "at most 3600"),
        ("postgresql://h/db?connect_timeout=-1", "connect_timeout='-1'"),
        ("postgresql://h/db?lease_time=10", "lease_time applies to mode=lease only"),
        ("postgresql://h/db?mode=lease&heartbeat=2", "heartbeat applies to mode=advisory"),
        ("postgresql://h/db?mode=lease&lease_time=0.1", "at least 0.5"),
        ("postgresql://h/db?schema=a.b", "schema 'a.b'"),
        ("postgresql://h/db?table_prefix=x;drop", "table prefix 'x;drop'"),
        ("postgresql://h/db?create_tables=maybe", "create_tables='maybe'"),
        ("postgresql://h/db?sslmode=on", "sslmode='on'"),
        ("postgresql://h/db?pool=1", "unknown option 'pool'"),
        ("postgresql://h/db?mode=lease&mode=advisory", "given twice"),
        ("postgresql://u:secret@h/db?bogus=1", "u:***@"),
    ],
)
def test_bad_urls_name_the_bad_part(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        parse_postgres_url(url)
    assert "secret" not in str(info.value)
