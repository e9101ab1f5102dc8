"""mode=lease SQL through pgbouncer in transaction pooling mode, and schema bootstrap."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from aiolocks.postgres._sql import (
    LeaseQueries,
    PostgresSetupError,
    TableNames,
    advisory_key,
    ddl,
    ensure_schema,
)
from aiolocks.testing import PgBouncer, PostgresServer

from .conftest import Connect

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

NAMES = TableNames()
Q = LeaseQueries.build(NAMES)


def _owner() -> str:
    return uuid.uuid4().hex


async def _acquire(
    conn: asyncpg.Connection, name: str, mode: str = "exclusive", slots: int = 1, ttl: float = 30
) -> tuple[str, int, int] | None:
    owner = _owner()
    row = await conn.fetchrow(Q.acquire, name, advisory_key("lease", name), owner, mode, slots, ttl)
    return None if row is None else (owner, int(row["slot"]), int(row["epoch"]))


async def _rows(conn: asyncpg.Connection, name: str) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM aiolocks_leases WHERE name = $1", name))


async def test_exclusive_lease_through_a_transaction_pooler(
    pgbouncer: PgBouncer, connect_bouncer: Connect, unique: str
) -> None:
    a, b = await connect_bouncer(), await connect_bouncer()
    await ensure_schema(a, NAMES)
    name = f"mutex/{unique}"
    held = await _acquire(a, name)
    assert held is not None
    owner, slot, epoch = held
    assert slot == 0
    assert await _acquire(b, name) is None
    # Renewal needs the owner and the epoch; a stranger renews nothing.
    assert await a.fetchval(Q.renew, name, slot, owner, epoch, 30.0) is not None
    assert await b.fetchrow(Q.renew, name, slot, _owner(), epoch, 30.0) is None
    assert await b.fetchrow(Q.renew, name, slot, owner, epoch + 1, 30.0) is None
    assert [tuple(r)[:3] for r in await b.fetch(Q.holders, name)] == [(0, owner, epoch)]
    # A stranger's release removes nothing; the owner's does, and was live.
    assert (await b.fetchrow(Q.release, name, slot, _owner(), epoch))["live"] is False
    assert (await a.fetchrow(Q.release, name, slot, owner, epoch))["live"] is True
    assert await _rows(b, name) == 0
    again = await _acquire(b, name)
    assert again is not None and again[2] == epoch + 1
    assert (await b.fetchrow(Q.release, name, 0, again[0], again[2]))["live"] is True
    assert await _rows(a, name) == 0


async def test_loss_behind_our_back_is_seen_by_the_next_renewal(
    connect_bouncer: Connect, unique: str
) -> None:
    a, admin = await connect_bouncer(), await connect_bouncer()
    await ensure_schema(a, NAMES)
    deleted, expired = f"mutex/{unique}-deleted", f"mutex/{unique}-expired"
    first = await _acquire(a, deleted)
    second = await _acquire(a, expired)
    assert first is not None and second is not None
    await admin.execute("DELETE FROM aiolocks_leases WHERE name = $1", deleted)
    await admin.execute(
        "UPDATE aiolocks_leases SET expires_at = clock_timestamp() - interval '1 second' "
        "WHERE name = $1",
        expired,
    )
    for name, (owner, slot, epoch) in ((deleted, first), (expired, second)):
        assert await a.fetchrow(Q.renew, name, slot, owner, epoch, 30.0) is None
        assert (await a.fetchrow(Q.release, name, slot, owner, epoch))["live"] is False
    # The expired row does not block the next acquirer, who gets a newer epoch.
    fresh = await _acquire(admin, expired)
    assert fresh is not None and fresh[2] > second[2]
    assert (await admin.fetchrow(Q.release, expired, 0, fresh[0], fresh[2]))["live"]
    assert await _rows(admin, expired) == 0 and await _rows(admin, deleted) == 0


async def test_readers_writers_and_semaphore_slots(connect_bouncer: Connect, unique: str) -> None:
    conn = await connect_bouncer()
    await ensure_schema(conn, NAMES)
    rw, sem = f"rwlock/{unique}", f"semaphore/{unique}"
    r1, r2 = await _acquire(conn, rw, "shared"), await _acquire(conn, rw, "shared")
    assert r1 is not None and r2 is not None
    assert (r1[1], r2[1]) == (1, 2) and r2[2] == r1[2] + 1
    assert await _acquire(conn, rw, "exclusive") is None
    for owner, slot, epoch in (r1, r2):
        assert (await conn.fetchrow(Q.release, rw, slot, owner, epoch))["live"]
    writer = await _acquire(conn, rw, "exclusive")
    assert writer is not None and writer[1] == 0 and writer[2] == r2[2] + 1
    assert await _acquire(conn, rw, "shared") is None
    assert (await conn.fetchrow(Q.release, rw, 0, writer[0], writer[2]))["live"]

    leases = [await _acquire(conn, sem, "slots", 3) for _ in range(3)]
    assert [lease[1] for lease in leases if lease is not None] == [0, 1, 2]
    assert await _acquire(conn, sem, "slots", 3) is None
    owner, slot, epoch = leases[1]  # type: ignore[misc]
    assert (await conn.fetchrow(Q.release, sem, slot, owner, epoch))["live"]
    refill = await _acquire(conn, sem, "slots", 3)
    assert refill is not None and refill[1] == 1
    for lease in (*leases, refill):
        if lease is not None:
            await conn.fetchrow(Q.release, sem, lease[1], lease[0], lease[2])
    assert await _rows(conn, sem) == 0 and await _rows(conn, rw) == 0
    with pytest.raises(asyncpg.exceptions.InvalidParameterValueError, match="unknown lease mode"):
        await _acquire(conn, sem, "upgrade")


async def test_a_waiting_writer_keeps_new_readers_out(
    connect_bouncer: Connect, unique: str
) -> None:
    conn = await connect_bouncer()
    await ensure_schema(conn, NAMES)
    rw = f"rwlock/{unique}"
    key = advisory_key("lease", rw)
    reader = await _acquire(conn, rw, "shared")
    assert reader is not None
    writer, other_writer = _owner(), _owner()

    async def write(owner: str) -> tuple[int, int] | None:
        row = await conn.fetchrow(Q.acquire, rw, key, owner, "write", 1, 30.0)
        return None if row is None else (int(row["slot"]), int(row["epoch"]))

    assert await write(writer) is None  # refused, and now marked as waiting
    assert await write(writer) is None  # a second try renews its mark, adds none
    assert await write(other_writer) is None
    marks = await conn.fetch(
        "SELECT slot, owner FROM aiolocks_leases WHERE name = $1 AND slot < 0 ORDER BY slot", rw
    )
    assert sorted(r["owner"] for r in marks) == sorted([writer, other_writer])
    assert await _acquire(conn, rw, "shared") is None  # new readers wait behind the writers
    assert [r["slot"] for r in await conn.fetch(Q.holders, rw)] == [reader[1]]  # marks hidden
    owner, slot, epoch = reader
    assert (await conn.fetchrow(Q.release, rw, slot, owner, epoch))["live"]
    granted = await write(writer)
    assert granted is not None and granted[0] == 0 and granted[1] > epoch
    # the granted writer's mark is gone, the other writer's stays
    left = await conn.fetch("SELECT owner FROM aiolocks_leases WHERE name = $1 AND slot < 0", rw)
    assert [r["owner"] for r in left] == [other_writer]
    assert (await conn.fetchrow(Q.release, rw, 0, writer, granted[1]))["live"]
    assert await _acquire(conn, rw, "shared") is None
    # a writer that gives up takes its mark with it: readers go again
    assert (await conn.fetchrow(Q.abandon, rw, other_writer))["removed"] == 1
    again = await _acquire(conn, rw, "shared")
    assert again is not None
    await conn.fetchrow(Q.release, rw, again[1], again[0], again[2])
    assert await _rows(conn, rw) == 0


async def test_concurrent_acquirers_through_the_pooler_never_overlap(
    connect_bouncer: Connect, unique: str
) -> None:
    conns = await asyncio.gather(*(connect_bouncer() for _ in range(8)))
    await ensure_schema(conns[0], NAMES)
    name = f"mutex/{unique}"
    holding: set[int] = set()
    overlaps = 0
    epochs: list[int] = []

    async def worker(index: int) -> None:
        nonlocal overlaps
        conn = conns[index]
        grants = 0
        while grants < 5:
            held = await _acquire(conn, name)
            if held is None:
                await asyncio.sleep(0)  # contended: let another worker run
                continue
            grants += 1
            if holding:
                overlaps += 1
            holding.add(index)
            epochs.append(held[2])
            await asyncio.sleep(0)
            holding.discard(index)
            assert (await conn.fetchrow(Q.release, name, 0, held[0], held[2]))["live"]

    await asyncio.gather(*(worker(i) for i in range(8)))
    assert overlaps == 0
    assert epochs == sorted(epochs) and len(set(epochs)) == 40
    assert await _rows(conns[0], name) == 0


async def test_release_notifies_listeners(
    connect: Connect, connect_bouncer: Connect, unique: str
) -> None:
    listener, conn = await connect(), await connect_bouncer()
    await ensure_schema(conn, NAMES)
    name = f"mutex/{unique}"
    heard: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener(NAMES.channel, lambda *args: heard.put_nowait(args[3]))
    held = await _acquire(conn, name)
    assert held is not None
    assert (await conn.fetchrow(Q.release, name, 0, held[0], held[2]))["live"]
    assert await asyncio.wait_for(heard.get(), 30) == name


async def test_schema_is_created_once_even_by_racing_callers(
    connect: Connect, connect_bouncer: Connect, unique: str
) -> None:
    schema = unique.replace("-", "_")
    admin = await connect()
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    names = TableNames(schema=schema, prefix="locks")
    conns = [await connect() for _ in range(3)] + [await connect_bouncer() for _ in range(3)]
    created = await asyncio.gather(*(ensure_schema(c, names) for c in conns))
    assert any(created)
    assert await ensure_schema(admin, names) is False  # nothing to do: no DDL runs
    row = await admin.fetchrow(names.lookup_sql())
    assert tuple(row) == (True, True, True, True)
    await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def test_a_role_without_rights_gets_the_ddl(
    postgres_server: PostgresServer, connect: Connect, unique: str
) -> None:
    schema, role = unique.replace("-", "_"), f"r_{unique.replace('-', '_')}"
    admin = await connect()
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    await admin.execute(f'CREATE ROLE "{role}" LOGIN')
    await admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
    try:
        names = TableNames(schema=schema)
        weak = await connect(user=role)
        with pytest.raises(PostgresSetupError) as info:
            await ensure_schema(weak, names)
        assert info.value.ddl == ddl(names)
        assert "may not create" in str(info.value)
        assert f'CREATE TABLE IF NOT EXISTS "{schema}"."aiolocks_leases"' in str(info.value)
        with pytest.raises(PostgresSetupError, match="creation is turned off"):
            await ensure_schema(admin, names, create=False)
        # Once an owner ran the DDL, the weak role needs no DDL rights.
        await admin.execute(ddl(names))
        await admin.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"'
        )
        assert await ensure_schema(weak, names) is False
    finally:
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.execute(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
        )
        await admin.execute(f'DROP ROLE "{role}"')


async def test_abandon_removes_what_a_cancelled_acquire_won(
    connect_bouncer: Connect, unique: str
) -> None:
    conn = await connect_bouncer()
    await ensure_schema(conn, NAMES)
    name, owner = f"semaphore/{unique}", _owner()
    key = advisory_key("lease", name)
    # The acquire's answer never reached the caller; only the minted owner is known.
    for _ in range(2):
        await conn.fetchrow(Q.acquire, name, key, owner, "slots", 3, 30.0)
    other = await _acquire(conn, name, "slots", 3)
    assert other is not None and await _rows(conn, name) == 3
    assert (await conn.fetchrow(Q.abandon, name, owner))["removed"] == 2
    assert (await conn.fetchrow(Q.abandon, name, owner))["removed"] == 0  # idempotent
    assert [row["owner"] for row in await conn.fetch(Q.holders, name)] == [other[0]]
    assert (await conn.fetchrow(Q.release, name, other[1], other[0], other[2]))["live"]
    assert await _rows(conn, name) == 0
