"""Network faults between a holder and PostgreSQL, through the test proxy."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from aiolocks.postgres._sql import AdvisoryQueries, TableNames, advisory_key, held_advisory_locks
from aiolocks.testing import PostgresServer, TcpProxy

from ..polling import eventually
from .conftest import Connect

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

Q = AdvisoryQueries.build(TableNames())


async def _through(proxy: TcpProxy, pg: PostgresServer) -> asyncpg.Connection:
    return await asyncpg.connect(
        host=proxy.host, port=proxy.port, user=pg.user, database=pg.database
    )


async def _free(observer: asyncpg.Connection, key: int) -> bool:
    if await observer.fetchval("SELECT pg_try_advisory_lock($1)", key):
        assert await observer.fetchval(Q.unlock_exclusive, key)
        return True
    return False


async def _until_free(observer: asyncpg.Connection, key: int) -> None:
    await eventually(lambda: _free(observer, key), 30, what="the lock freed on the server")


async def test_cut_connection_is_noticed_and_the_server_frees_the_lock(
    postgres_server: PostgresServer, connect: Connect, unique: str
) -> None:
    observer = await connect()
    key = advisory_key("mutex", unique)
    async with TcpProxy(postgres_server.host, postgres_server.port) as proxy:
        holder = await _through(proxy, postgres_server)
        try:
            ended = asyncio.Event()
            holder.add_termination_listener(lambda _conn: ended.set())
            assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", key)
            assert not await _free(observer, key)
            assert proxy.cut() == 1
            await asyncio.wait_for(ended.wait(), 30)  # noticed without a query
            assert holder.is_closed()
            # The server saw its socket close too: the session and its lock end.
            await _until_free(observer, key)
        finally:
            holder.terminate()


async def test_stalled_connection_keeps_the_server_lock_until_the_session_is_ended(
    postgres_server: PostgresServer, connect: Connect, unique: str
) -> None:
    """A partition is not a session end: the heartbeat times out on our side while
    the server still holds the lock, so the holder must count it lost at once
    (the next holder relies on fencing) and end its old session from a fresh
    connection (a role may terminate its own sessions) to free it for others."""
    observer = await connect()
    key = advisory_key("mutex", unique)
    async with TcpProxy(postgres_server.host, postgres_server.port) as proxy:
        holder = await _through(proxy, postgres_server)
        try:
            pid = holder.get_server_pid()
            assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", key)
            proxy.stall()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(held_advisory_locks(holder, Q), 0.5)
            assert not await _free(observer, key)  # still held on the server
            assert await observer.fetchval("SELECT pg_terminate_backend($1)", pid)
            await _until_free(observer, key)
            proxy.heal()
        finally:
            holder.terminate()
