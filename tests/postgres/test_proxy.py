"""What a pooler does to session advisory locks, and detecting it."""

from __future__ import annotations

import asyncpg
import pytest

from aiolocks.postgres._sql import advisory_key, probe_session
from aiolocks.testing import PostgresServer, TcpProxy

from .conftest import Connect

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def test_direct_session_is_not_reported(connect: Connect) -> None:
    probe = await probe_session(await connect())
    assert not probe.pooled and not probe.session_moved
    assert probe.backend_pids == (probe.login_pid,) * 3
    assert probe.server_version >= 120000
    assert "direct session" in probe.describe()


async def test_plain_tcp_proxy_keeps_the_session_and_is_not_reported(
    postgres_server: PostgresServer,
) -> None:
    async with TcpProxy(postgres_server.host, postgres_server.port) as proxy:
        conn = await asyncpg.connect(
            host=proxy.host,
            port=proxy.port,
            user=postgres_server.user,
            database=postgres_server.database,
        )
        try:
            probe = await probe_session(conn)
        finally:
            await conn.close()
    assert not probe.pooled


async def test_pgbouncer_is_detected_at_once(connect_bouncer: Connect) -> None:
    probe = await probe_session(await connect_bouncer(), statements=1)
    assert probe.pooled
    assert "pooler" in probe.describe()


async def test_transaction_pooling_moves_statements_and_strands_session_locks(
    connect: Connect, connect_bouncer: Connect, unique: str
) -> None:
    """Why mode=advisory refuses a pooler: a lock taken by one statement sits in a
    server session that the client's next statement may not reach."""
    client = await connect_bouncer()
    observer = await connect()
    key = advisory_key("mutex", unique)
    assert await client.fetchval("SELECT pg_try_advisory_lock($1)", key)
    first_pid = await client.fetchval("SELECT pg_backend_pid()")
    # Pin the server session our lock lives in with other clients' open
    # transactions until one of them lands on it (LIFO reuse: soon).
    others = []
    for _ in range(8):
        other = await connect_bouncer()
        tx = other.transaction()
        await tx.start()
        others.append((other, tx))
        if await other.fetchval("SELECT pg_backend_pid()") == first_pid:
            break
    else:
        pytest.fail("no pinned transaction reached the locked server session")
    # The client's next statements run elsewhere: the lock is out of its reach.
    probe = await probe_session(client)
    assert probe.session_moved or probe.backend_pids[0] != first_pid
    assert first_pid not in probe.backend_pids
    assert not await client.fetchval("SELECT pg_advisory_unlock($1)", key)
    # ...and it stays held by a pooled server session nobody controls.
    holders = await observer.fetch(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND classid = (($1::int8 >> 32) & 4294967295)::oid "
        "AND objid = ($1::int8 & 4294967295)::oid",
        key,
    )
    assert [row[0] for row in holders] == [first_pid]
    for _other, tx in others:
        await tx.rollback()
    await observer.execute("SELECT pg_terminate_backend($1)", first_pid)
