"""mode=advisory SQL against a real PostgreSQL: grants, fencing, stacking, cancellation, loss."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Awaitable, Callable
from functools import partial

import asyncpg
import pytest
import pytest_asyncio

from aiolocks.postgres._asyncpg_compat import client_socket
from aiolocks.postgres._sql import (
    AdvisoryQueries,
    TableNames,
    advisory_key,
    configure_keepalives,
    ensure_schema,
    held_advisory_locks,
    lost_keys,
    slot_keys,
)
from aiolocks.testing import PostgresServer

from ..polling import eventually
from .conftest import Connect

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

NAMES = TableNames()
Q = AdvisoryQueries.build(NAMES)


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait for server-side state (a queued waiter...) before the next step; no timing asserted."""
    await eventually(check, 20, what=what)


async def _waiting(observer: asyncpg.Connection, pid: int) -> bool:
    count = await observer.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 AND NOT granted",
        pid,
    )
    return bool(count)


async def _locks_of(observer: asyncpg.Connection, pid: int) -> list[tuple[int, str]]:
    rows = await observer.fetch(
        "SELECT (classid::int8 << 32) | objid::int8, mode FROM pg_locks "
        "WHERE locktype = 'advisory' AND pid = $1 AND granted ORDER BY 1, 2",
        pid,
    )
    return [(int(r[0]), str(r[1])) for r in rows]


@pytest_asyncio.fixture
async def schema(connect: Connect) -> None:
    await ensure_schema(await connect(), NAMES)


async def test_session_locks_stack_per_session_not_per_task(connect: Connect, unique: str) -> None:
    holder, other = await connect(), await connect()
    key = advisory_key("mutex", unique)
    # Two tasks sharing one session would both "win": the server cannot tell
    # them apart, so reentrancy must be decided by the library, per task.
    assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", key)
    assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", key)
    assert not await other.fetchval("SELECT pg_try_advisory_lock($1)", key)
    # Stacked: one unlock per lock.
    assert await holder.fetchval(Q.unlock_exclusive, key)
    assert not await other.fetchval("SELECT pg_try_advisory_lock($1)", key)
    assert await holder.fetchval(Q.unlock_exclusive, key)
    assert await other.fetchval("SELECT pg_try_advisory_lock($1)", key)
    # Another session cannot unlock it (the pooled-connection trap).
    assert not await holder.fetchval(Q.unlock_exclusive, key)
    assert await other.fetchval(Q.unlock_exclusive, key)


async def test_try_grant_draws_a_token_only_when_granted(
    schema: None, connect: Connect, unique: str
) -> None:
    a, b = await connect(), await connect()
    key, fence = advisory_key("mutex", unique), f"mutex/{unique}"
    row_of = "SELECT epoch FROM aiolocks_fencing WHERE name = $1"
    assert await a.fetchval(row_of, fence) is None
    first = await a.fetchval(Q.try_exclusive_register, key, fence)
    assert first is not None and await a.fetchval(row_of, fence) == first  # name recorded
    last = "SELECT last_value FROM aiolocks_fencing_seq"
    drawn = await a.fetchval(last)
    for _ in range(3):  # refused tries draw nothing and write nothing
        assert await b.fetchrow(Q.try_exclusive, key) is None
        assert await b.fetchrow(Q.try_exclusive_register, key, fence) is None
    assert await a.fetchval(last) == drawn
    assert await a.fetchval(Q.unlock_exclusive, key)
    second = await b.fetchval(Q.try_exclusive, key)
    assert second > first
    assert await a.fetchval(row_of, fence) == first  # the plain form writes no row
    assert await b.fetchval(Q.unlock_exclusive, key)
    third = await a.fetchval(Q.try_exclusive_register, key, fence)
    assert third > second and await a.fetchval(row_of, fence) == third
    assert await a.fetchval(Q.unlock_exclusive, key)


async def test_the_sequence_starts_above_existing_fencing_rows(
    connect: Connect, unique: str
) -> None:
    """An upgrade from per-name fencing rows: no name's token goes backwards."""
    conn = await connect()
    names = TableNames(prefix=f"up_{unique.replace('-', '_')}")
    queries = AdvisoryQueries.build(names)
    await conn.execute(
        f"CREATE TABLE {names.fencing} (name text PRIMARY KEY, epoch bigint NOT NULL); "
        f"INSERT INTO {names.fencing} VALUES ('mutex/a', 7), ('mutex/b', 4100)"
    )
    assert await ensure_schema(conn, names)
    key = advisory_key("mutex", "a")
    assert await conn.fetchval(queries.try_exclusive, key) == 4101
    assert await conn.fetchval(queries.unlock_exclusive, key)
    # created once: a later bootstrap never sets a running sequence back
    assert not await ensure_schema(conn, names)
    signature = "(text, int8, text, text, int4, float8)"
    await conn.execute(f"DROP FUNCTION {names.acquire_function}{signature}")
    assert await ensure_schema(conn, names)
    assert await conn.fetchval(queries.try_exclusive, key) == 4102
    assert await conn.fetchval(queries.unlock_exclusive, key)


async def test_blocking_waiters_are_granted_in_order_with_increasing_epochs(
    schema: None, connect: Connect, unique: str
) -> None:
    holder, observer = await connect(), await connect()
    waiters = [await connect() for _ in range(4)]
    key, fence = advisory_key("mutex", unique), f"mutex/{unique}"
    base = await holder.fetchval(Q.try_exclusive_register, key, fence)
    order: list[int] = []

    async def wait(index: int) -> int:
        epoch = int(await waiters[index].fetchval(Q.lock_exclusive, key))
        order.append(index)
        assert await waiters[index].fetchval(Q.unlock_exclusive, key)
        return epoch

    tasks = []
    for index, conn in enumerate(waiters):
        tasks.append(asyncio.create_task(wait(index)))
        await _until(partial(_waiting, observer, conn.get_server_pid()), f"waiter {index} queued")
    assert await holder.fetchval(Q.unlock_exclusive, key)
    epochs = await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3]  # the server grants advisory waiters FIFO
    assert base < epochs[0] < epochs[1] < epochs[2] < epochs[3]


async def test_cancelled_wait_that_the_server_granted_is_found_and_unlocked(
    schema: None, connect: Connect, unique: str
) -> None:
    """The grant wins the race with the cancel: the session lock outlives the aborted statement."""
    holder, waiter, blocker, observer = await asyncio.gather(
        connect(), connect(), connect(), connect()
    )
    key, fence = advisory_key("mutex", unique), f"mutex/{unique}"
    await holder.fetchval(Q.try_exclusive_register, key, fence)
    # Park the waiter's statement *after* its grant: the fencing row is locked.
    blocker_tx = blocker.transaction()
    await blocker_tx.start()
    await blocker.execute("SELECT 1 FROM aiolocks_fencing WHERE name = $1 FOR UPDATE", fence)
    task = asyncio.create_task(waiter.fetchval(Q.lock_exclusive_register, key, fence))
    pid = waiter.get_server_pid()
    await _until(lambda: _waiting(observer, pid), "waiter queued on the advisory lock")
    assert await holder.fetchval(Q.unlock_exclusive, key)
    # Granted, now waiting for the row lock inside the same statement.
    await _until(lambda: _has_lock(observer, pid, key), "waiter granted the advisory lock")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await blocker_tx.rollback()
    # The statement was cancelled and rolled back, the session lock was not.
    assert await _locks_of(observer, pid) == [(key, "ExclusiveLock")]
    assert not await observer.fetchval("SELECT pg_try_advisory_lock($1)", key)
    # Check and unlock, without a WARNING when there is nothing to unlock.
    assert await waiter.fetch(Q.unlock_if_held, key, "ExclusiveLock") == [(True,)]
    assert await waiter.fetch(Q.unlock_if_held, key, "ExclusiveLock") == []
    assert await _locks_of(observer, pid) == []
    assert await observer.fetchval(Q.try_exclusive, key) is not None
    assert await observer.fetchval(Q.unlock_exclusive, key)


async def _has_lock(observer: asyncpg.Connection, pid: int, key: int) -> bool:
    return (key, "ExclusiveLock") in await _locks_of(observer, pid)


async def test_cancelled_wait_before_the_grant_holds_nothing(
    schema: None, connect: Connect, unique: str
) -> None:
    holder, waiter, observer = await asyncio.gather(connect(), connect(), connect())
    key, fence = advisory_key("mutex", unique), f"mutex/{unique}"
    await holder.fetchval(Q.try_exclusive, key)
    task = asyncio.create_task(waiter.fetchval(Q.lock_exclusive_register, key, fence))
    pid = waiter.get_server_pid()
    await _until(lambda: _waiting(observer, pid), "waiter queued")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The connection stays usable and holds nothing; the queue is empty.
    assert await waiter.fetch(Q.unlock_if_held, key, "ExclusiveLock") == []
    assert await _locks_of(observer, pid) == []
    assert not await _waiting(observer, pid)
    assert await holder.fetchval(Q.unlock_exclusive, key)


async def test_shared_locks_for_readers_and_writer_preference(
    schema: None, connect: Connect, unique: str
) -> None:
    r1, r2, writer, late_reader, observer = await asyncio.gather(*(connect() for _ in range(5)))
    key, fence = advisory_key("rwlock", unique), f"rwlock/{unique}"
    e1 = await r1.fetchval(Q.try_shared_register, key, fence)
    e2 = await r2.fetchval(Q.try_shared, key)
    assert e2 > e1  # readers and writers share one fencing sequence
    assert await writer.fetchrow(Q.try_exclusive, key) is None
    task = asyncio.create_task(writer.fetchval(Q.lock_exclusive, key))
    wpid = writer.get_server_pid()
    await _until(lambda: _waiting(observer, wpid), "writer queued")
    # A queued writer keeps new readers out (no writer starvation).
    assert await late_reader.fetchrow(Q.try_shared_register, key, fence) is None
    assert await r1.fetchval(Q.unlock_shared, key)
    assert not task.done()
    assert await r2.fetchval(Q.unlock_shared, key)
    e3 = await task
    assert e3 > e2
    # A writer may also read (downgrade): the heartbeat sees both modes.
    assert await writer.fetchval(Q.try_shared, key) > e3
    held = await held_advisory_locks(writer, Q)
    assert held == {key: frozenset({"ExclusiveLock", "ShareLock"})}
    assert lost_keys([(key, True), (key, False)], held) == set()
    assert await writer.fetch(Q.unlock_if_held, key, "ShareLock") == [(True,)]
    assert await writer.fetchval(Q.unlock_exclusive, key)
    assert await _locks_of(observer, wpid) == []


async def test_semaphore_slots_take_exactly_one_lock_each(
    schema: None, connect: Connect, unique: str
) -> None:
    conns = await asyncio.gather(*(connect() for _ in range(4)))
    observer = await connect()
    keys, fence = slot_keys(unique, 3), f"semaphore/{unique}"
    grants = [await conns[0].fetchrow(Q.try_slot_register, keys, fence)]
    grants += [await conn.fetchrow(Q.try_slot, keys) for conn in conns[1:3]]
    assert [g["slot"] for g in grants] == [0, 1, 2]
    epochs = [g["epoch"] for g in grants]
    assert epochs == sorted(epochs) and len(set(epochs)) == 3
    for conn, slot in zip(conns[:3], range(3), strict=True):
        assert await _locks_of(observer, conn.get_server_pid()) == [(keys[slot], "ExclusiveLock")]
    assert await conns[3].fetchrow(Q.try_slot, keys) is None
    assert await conns[3].fetchrow(Q.try_slot_register, keys, fence) is None
    assert await _locks_of(observer, conns[3].get_server_pid()) == []
    # Free slot 1; a blocking wait on it is granted when it frees.
    task = asyncio.create_task(conns[3].fetchrow(Q.lock_slot_register, keys, fence, 1))
    pid = conns[3].get_server_pid()
    await _until(lambda: _waiting(observer, pid), "slot waiter queued")
    assert await conns[1].fetchval(Q.unlock_exclusive, keys[1])
    row = await task
    assert row["slot"] == 1 and row["epoch"] > epochs[-1]
    assert await conns[3].fetchval(Q.unlock_exclusive, keys[1])
    assert await conns[0].fetchval(Q.unlock_exclusive, keys[0])
    task = asyncio.create_task(conns[3].fetchrow(Q.lock_slot, keys, 0))
    assert (await task)["slot"] == 0
    for conn in conns:
        await conn.execute("SELECT pg_advisory_unlock_all()")


async def test_heartbeat_reports_only_this_sessions_locks(connect: Connect, unique: str) -> None:
    a, b = await connect(), await connect()
    k1, k2, k3 = (advisory_key("mutex", f"{unique}/{i}") for i in range(3))
    await a.fetchval("SELECT pg_try_advisory_lock($1)", k1)
    await a.fetchval("SELECT pg_try_advisory_lock_shared($1)", k2)
    await b.fetchval("SELECT pg_try_advisory_lock_shared($1)", k2)
    # An (int4, int4) key is another key space and never shows up.
    await a.fetchval("SELECT pg_try_advisory_lock(1, 2)")
    assert await held_advisory_locks(a, Q) == {
        k1: frozenset({"ExclusiveLock"}),
        k2: frozenset({"ShareLock"}),
    }
    held_b = await held_advisory_locks(b, Q)
    assert held_b == {k2: frozenset({"ShareLock"})}
    expected = [(k1, False), (k2, True), (k3, False)]
    assert lost_keys(expected, await held_advisory_locks(a, Q)) == {k3}
    assert lost_keys([(k2, False)], held_b) == {k2}  # held, but in the wrong mode


async def test_terminated_session_loses_its_locks_and_says_so(
    postgres_server: PostgresServer, schema: None, connect: Connect, unique: str
) -> None:
    holder = await connect(server_settings={"application_name": unique})
    other = await connect()
    key = advisory_key("mutex", unique)
    assert await holder.fetchval(Q.try_exclusive, key) is not None
    ended = asyncio.Event()
    holder.add_termination_listener(lambda _conn: ended.set())
    assert postgres_server.terminate_backends(application_name=unique) == 1
    await asyncio.wait_for(ended.wait(), 30)  # noticed without any query of ours
    assert holder.is_closed()
    with pytest.raises((asyncpg.exceptions.ConnectionDoesNotExistError, asyncpg.InterfaceError)):
        await held_advisory_locks(holder, Q)
    assert await other.fetchval(Q.try_exclusive, key) is not None
    assert await other.fetchval(Q.unlock_exclusive, key)


async def test_keepalives_are_set_on_both_ends(
    postgres_server: PostgresServer, connect: Connect
) -> None:
    conn = await connect()
    assert await configure_keepalives(conn, idle=7, interval=2, count=3, user_timeout=9.5)
    settings = await conn.fetchrow(
        "SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'),"
        " current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout')"
    )
    assert tuple(settings) == ("7", "2", "3", "9500")  # seconds, seconds, probes, ms
    sock = client_socket(conn)  # (the one reader of asyncpg's transport)
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 2
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
    with pytest.raises(ValueError, match=">= 1"):
        await configure_keepalives(conn, idle=0, interval=2, count=3)


async def test_fencing_epoch_survives_restart_and_crash(
    postgres_restartable: PostgresServer,
) -> None:
    pg = postgres_restartable
    key, fence = advisory_key("mutex", "durable"), "mutex/durable"
    epochs: list[int] = []

    def crash() -> None:
        pg.kill()
        pg.start()

    for stop in (pg.restart, crash):
        conn = await asyncpg.connect(pg.url)
        try:
            await ensure_schema(conn, NAMES)
            for query, args in ((Q.try_exclusive_register, (fence,)), (Q.try_exclusive, ())) * 2:
                epochs.append(int(await conn.fetchval(query, key, *args)))
                assert await conn.fetchval(Q.unlock_exclusive, key)
        finally:
            await conn.close()
        stop()
    conn = await asyncpg.connect(pg.url)
    try:
        epochs.append(int(await conn.fetchval(Q.try_exclusive, key)))
    finally:
        await conn.close()
    # strictly increasing (a crash may skip values of the sequence, never repeat one)
    assert all(a < b for a, b in itertools.pairwise(epochs)), epochs


async def test_idle_session_timeout_ends_an_idle_holder(
    schema: None, connect: Connect, unique: str
) -> None:
    """The trap the heartbeat exists for: an idle holder's session is ended by the server."""
    holder, other = await connect(), await connect()
    key = advisory_key("mutex", unique)
    assert await holder.fetchval(Q.try_exclusive, key) is not None
    ended = asyncio.Event()
    holder.add_termination_listener(lambda _conn: ended.set())
    await holder.execute("SET idle_session_timeout = '300ms'")
    await asyncio.wait_for(ended.wait(), 60)  # nothing ran on the holder: it was idle
    assert holder.is_closed()
    assert await other.fetchval(Q.try_exclusive, key) is not None
    assert await other.fetchval(Q.unlock_exclusive, key)


async def test_participants_list_holders_then_waiters_in_queue_order(
    connect: Connect, unique: str
) -> None:
    holder, observer = await connect(), await connect()
    waiters = [await connect(server_settings={"application_name": f"w{i}"}) for i in range(3)]
    key = advisory_key("mutex", unique)
    assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", key)
    tasks = []
    for waiter in waiters:
        tasks.append(asyncio.create_task(waiter.execute("SELECT pg_advisory_lock($1)", key)))
        await _until(partial(_waiting, observer, waiter.get_server_pid()), "waiter queued")
    rows = await observer.fetch(Q.participants, key)
    assert [(r["pid"], r["granted"]) for r in rows] == [
        (holder.get_server_pid(), True),
        *((w.get_server_pid(), False) for w in waiters),
    ]
    assert [r["application_name"] for r in rows[1:]] == ["w0", "w1", "w2"]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert await holder.fetchval(Q.unlock_exclusive, key)
    # The cancels may still be on their way: a waiter can be granted after its
    # task saw CancelledError. asyncpg runs the next statement only once the
    # cancelled one ended, so check-and-unlock on each waiter is reliable.
    for waiter in waiters:
        assert len(await waiter.fetch(Q.unlock_if_held, key, "ExclusiveLock")) <= 1
    assert await observer.fetch(Q.participants, key) == []


async def test_failed_grant_statement_keeps_the_session_lock_until_unlocked(
    schema: None, connect: Connect, unique: str
) -> None:
    """A session lock ignores ROLLBACK: the grant's statement failing after the lock
    was taken (here: lock_timeout on the fencing row) still leaves it held."""
    waiter, blocker, observer = await asyncio.gather(connect(), connect(), connect())
    key, fence = advisory_key("mutex", unique), f"mutex/{unique}"
    await observer.fetchval(Q.try_exclusive_register, key, fence)  # the fencing row exists
    assert await observer.fetchval(Q.unlock_exclusive, key)
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute("SELECT 1 FROM aiolocks_fencing WHERE name = $1 FOR UPDATE", fence)
    await waiter.execute("SET lock_timeout = '50ms'")
    with pytest.raises(asyncpg.exceptions.LockNotAvailableError):
        await waiter.fetchval(Q.try_exclusive_register, key, fence)
    await tx.rollback()
    assert await _locks_of(observer, waiter.get_server_pid()) == [(key, "ExclusiveLock")]
    assert await waiter.fetch(Q.unlock_if_held, key, "ExclusiveLock") == [(True,)]
    assert await _locks_of(observer, waiter.get_server_pid()) == []
