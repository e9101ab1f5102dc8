"""Fixtures of the PostgreSQL tests: asyncpg connections to the shared server and bouncer."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
import pytest_asyncio

from aiolocks.testing import PgBouncer, PostgresServer

pytestmark = pytest.mark.postgres

Connect = Callable[..., Awaitable[asyncpg.Connection]]


@pytest.fixture
def unique() -> str:
    """A name part of this test only (the shared server keeps rows between tests)."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest_asyncio.fixture
async def connect(postgres_server: PostgresServer) -> AsyncIterator[Connect]:
    """Open direct asyncpg connections to the shared server; all are closed at teardown."""
    opened: list[asyncpg.Connection] = []

    async def _connect(**kwargs: object) -> asyncpg.Connection:
        conn = await asyncpg.connect(postgres_server.url, **kwargs)
        opened.append(conn)
        return conn

    try:
        yield _connect
    finally:
        for conn in opened:
            conn.terminate()


@pytest_asyncio.fixture
async def connect_bouncer(pgbouncer: PgBouncer) -> AsyncIterator[Connect]:
    """Open asyncpg connections through pgbouncer (transaction pooling, no statement cache)."""
    opened: list[asyncpg.Connection] = []

    async def _connect(**kwargs: object) -> asyncpg.Connection:
        conn = await asyncpg.connect(pgbouncer.url, statement_cache_size=0, **kwargs)
        opened.append(conn)
        return conn

    try:
        yield _connect
    finally:
        for conn in opened:
            conn.terminate()
