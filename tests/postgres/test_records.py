"""The PostgreSQL record store against a real server: sessions killed, clocks, rows
deleted behind its back, cancellation at every await, and the least-privilege role.

The contract itself is tested for every backend in ``tests/conformance/test_records.py``;
these are the PostgreSQL-specific ways it can break.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import asyncpg
import pytest
import pytest_asyncio

import aiolocks
from aiolocks._core.records import Entry, Records, SupportsRecords
from aiolocks.postgres import PostgresBackend, PostgresSetupError
from aiolocks.postgres._driver import PostgresAdvisoryDriver
from aiolocks.postgres._records import PostgresRecords
from aiolocks.testing import PgBouncer, PostgresServer, TcpProxy

from ..polling import eventually, settle
from .conftest import Connect

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

#: URL options per mode (no TLS on the test server; short heartbeat and lease)
OPTIONS = {
    "advisory": "heartbeat=1&sslmode=disable",
    "lease": "mode=lease&lease_time=2&sslmode=disable",
}

#: bound of every wait in these tests (a guard against a hang, not a timing claim)
GUARD = 15.0


def _url(server: PostgresServer, mode: str, extra: str = "") -> str:
    return f"{server.url}?{OPTIONS[mode]}{extra}"


def _store(backend: aiolocks.Backend) -> PostgresRecords:
    driver = backend._driver
    assert isinstance(driver, SupportsRecords)
    store = driver.records()
    assert isinstance(store, PostgresRecords)
    assert driver.records() is store, "one store per driver"
    return store


@pytest.fixture
def prefix() -> str:
    return f"pg-records/{uuid.uuid4().hex[:10]}"


@pytest_asyncio.fixture
async def admin(connect: Connect) -> asyncpg.Connection:
    """A direct connection for looking at (and tampering with) the table."""
    return await connect()


async def _rows(admin: asyncpg.Connection, where: str, *args: object) -> int:
    return int(await admin.fetchval(f"SELECT count(*) FROM aiolocks_records WHERE {where}", *args))


async def _no_row(admin: asyncpg.Connection, key: str) -> bool:
    return await _rows(admin, "key = $1", key) == 0


def _loss(entry: Entry) -> asyncio.Future[str]:
    lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def tell(e: Entry) -> None:
        if not lost.done():
            lost.set_result(e.lost_reason or "")

    entry.add_loss_listener(tell)
    return lost


async def _until_absent_in_snapshots(store: Records, prefix: str, child: str) -> None:
    """Snapshots of ``prefix`` until ``child`` is gone, each waiting in ``changed(None)``."""
    snap = await store.snapshot(prefix)
    try:
        while child in snap.records:
            await snap.changed(None)  # no bound: only the store's own re-check can end it
            snap.close()
            snap = await store.snapshot(prefix)
    finally:
        snap.close()


# --------------------------------------------------------------------------- sessions


async def test_a_terminated_session_loses_its_entries_and_others_see_them_go(
    postgres_server: PostgresServer, admin: asyncpg.Connection, prefix: str
) -> None:
    url = _url(postgres_server, "advisory")
    async with aiolocks.connect(url) as member, aiolocks.connect(url) as watcher:
        await member.open()
        await watcher.open()
        mine, theirs = _store(member), _store(watcher)
        entry = await mine.join(f"{prefix}/m", b"hello")
        assert entry is not None
        lost = _loss(entry)
        snap = await theirs.snapshot(prefix)
        try:
            assert "m" in snap.records and snap.records["m"].ephemeral
            waiter = asyncio.ensure_future(snap.changed(None))
            driver = cast(PostgresAdvisoryDriver, member._driver)
            primary = driver._primary
            assert primary is not None
            # The server ends the member's session, as an operator or a crash
            # would: nobody publishes anything; the watcher, waiting without a
            # bound, must find out by itself.
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", primary.pid)
            reason = await asyncio.wait_for(lost, GUARD)
            assert "session" in reason and str(primary.pid) in reason
            await asyncio.wait_for(waiter, GUARD)
        finally:
            snap.close()
        await asyncio.wait_for(_until_absent_in_snapshots(theirs, prefix, "m"), GUARD)
        assert await theirs.read(f"{prefix}/m") is None
        # The member gets a new session (and a new session key): it can join again,
        # and the new record is live for others.
        again = await mine.join(f"{prefix}/m", b"back")
        assert again is not None and not again.lost and again.version != entry.version
        record = await theirs.read(f"{prefix}/m")
        assert record is not None and record.value == b"back"
    # closed in order: the record went, and that is not a loss
    assert not again.lost
    assert await _rows(admin, "parent = $1", prefix) == 0


async def test_a_call_right_after_the_session_was_ended_goes_to_a_new_one(
    postgres_server: PostgresServer, admin: asyncpg.Connection, prefix: str
) -> None:
    """The server ended the primary session; the client may not have read that yet.

    The next call must not fail for it (nothing was sent on the dead session)
    and a backend closing then still deletes its records.
    """
    url = _url(postgres_server, "advisory")
    for round_ in range(8):
        async with aiolocks.connect(url) as backend:
            await backend.open()
            store = _store(backend)
            assert await store.create(f"{prefix}/r{round_}", b"x") is not None
            primary = cast(PostgresAdvisoryDriver, backend._driver)._primary
            assert primary is not None
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", primary.pid)
            await eventually(
                lambda pid=primary.pid: _session_gone(admin, pid),  # type: ignore[misc]
                GUARD,
                what="the server to end the session",
            )
            record = await store.read(f"{prefix}/r{round_}")
            assert record is not None and record.value == b"x"
            assert await store.delete(f"{prefix}/r{round_}")
    assert await _rows(admin, "parent = $1", prefix) == 0


async def _session_gone(admin: asyncpg.Connection, pid: int) -> bool:
    return not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)


@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_a_row_deleted_behind_its_back_is_lost(
    postgres_server: PostgresServer, admin: asyncpg.Connection, prefix: str, mode: str
) -> None:
    async with aiolocks.connect(_url(postgres_server, mode)) as backend:
        await backend.open()
        store = _store(backend)
        kept = await store.join(f"{prefix}/kept", b"k")
        gone = await store.join(f"{prefix}/gone", b"g")
        assert kept is not None and gone is not None
        lost = _loss(gone)
        assert await admin.execute("DELETE FROM aiolocks_records WHERE key = $1", gone.key) == (
            "DELETE 1"
        )
        reason = await asyncio.wait_for(lost, GUARD)
        assert "gone" in reason
        # the other entry stays, and its row too (renewed, in lease mode, past lease_time)
        assert not kept.lost
        assert await _rows(admin, "key = $1", kept.key) == 1
        assert await store.delete(kept.key, version=kept.version)
        assert not kept.lost


async def test_a_lease_ephemeral_record_outlives_its_lease_time_only_by_renewals(
    postgres_server: PostgresServer, admin: asyncpg.Connection, prefix: str
) -> None:
    async with aiolocks.connect(_url(postgres_server, "lease")) as backend:
        await backend.open()
        store = _store(backend)
        entry = await store.join(f"{prefix}/m", b"x")
        assert entry is not None
        first = await admin.fetchval(
            "SELECT expires_at FROM aiolocks_records WHERE key = $1", entry.key
        )

        async def renewed() -> bool:
            now = await admin.fetchval(
                "SELECT expires_at FROM aiolocks_records WHERE key = $1", entry.key
            )
            return bool(now is not None and now > first)

        await eventually(renewed, GUARD, what="the lease row to be renewed")
        assert not entry.lost
        record = await store.read(entry.key)
        assert record is not None and record.ephemeral and record.ttl is None
        with pytest.raises(ValueError, match="ephemeral"):
            await store.update(entry.key, b"y", version=entry.version, ttl=5)
        newer = await store.update(entry.key, b"y", version=entry.version)
        assert newer is not None
        record = await store.read(entry.key)
        assert record is not None and record.ephemeral and record.value == b"y"


@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_a_stalled_link_loses_the_entries(
    postgres_server: PostgresServer, prefix: str, mode: str
) -> None:
    """No answer (a partition): advisory gives up on the session, lease stops renewing."""
    watcher_url = _url(postgres_server, mode)
    async with (
        TcpProxy(postgres_server.host, postgres_server.port) as proxy,
        aiolocks.connect(watcher_url) as watcher,
    ):
        url = (
            f"postgresql://{postgres_server.user}@{proxy.host}:{proxy.port}/"
            f"{postgres_server.database}?{OPTIONS[mode]}"
        )
        async with aiolocks.connect(url) as member:
            await member.open()
            await watcher.open()
            entry = await _store(member).join(f"{prefix}/m", b"m")
            assert entry is not None
            assert await _store(watcher).read(entry.key) is not None
            lost = _loss(entry)
            proxy.stall()
            reason = await asyncio.wait_for(lost, GUARD)
            assert ("session" in reason) if mode == "advisory" else ("renewed" in reason)
            if mode == "lease":
                # the server lets the unrenewed row go by its own clock
                await eventually(
                    lambda: _absent(_store(watcher), entry.key), GUARD, what="the row to expire"
                )
            proxy.heal()
        # advisory: the server ends the session once the link is back (or its
        # keep-alives give up): the row goes with it
        await eventually(
            lambda: _absent(_store(watcher), entry.key), GUARD, what="the record to go"
        )


async def _absent(store: Records, key: str) -> bool:
    return await store.read(key) is None


@pytest.mark.parametrize("listen", [True, False], ids=["listen_url", "no-listener"])
async def test_lease_records_work_through_a_transaction_pooler(
    postgres_server: PostgresServer,
    pgbouncer: PgBouncer,
    admin: asyncpg.Connection,
    prefix: str,
    listen: bool,
) -> None:
    """Every statement through pgbouncer; without a direct listener, snapshots re-read."""
    pooled = f"{pgbouncer.url}?mode=lease&lease_time=2&sslmode=disable"
    direct = f"{postgres_server.url}?sslmode=disable" if listen else None
    async with (
        PostgresBackend(pooled, listen_url=direct) as backend,
        aiolocks.connect(_url(postgres_server, "lease")) as other,
    ):
        await backend.open()
        await other.open()
        store, theirs = _store(backend), _store(other)
        entry = await store.join(f"{prefix}/m", b"m")
        assert entry is not None
        with await store.snapshot(prefix) as snap:
            assert sorted(snap.records) == ["m"]
            waiter = asyncio.ensure_future(snap.changed(None))
            assert await theirs.create(f"{prefix}/p", b"p") is not None
            await asyncio.wait_for(waiter, GUARD)  # a NOTIFY, or (no listener) a re-read
        record = await theirs.read(entry.key)
        assert record is not None and record.ephemeral
        # renewed through the pooler
        first = await admin.fetchval(
            "SELECT expires_at FROM aiolocks_records WHERE key = $1", entry.key
        )

        async def renewed() -> bool:
            now = await admin.fetchval(
                "SELECT expires_at FROM aiolocks_records WHERE key = $1", entry.key
            )
            return bool(now is not None and now > first)

        await eventually(renewed, GUARD, what="a renewal through the pooler")
        assert not entry.lost
        assert await theirs.delete(f"{prefix}/p")
    assert await _no_row(admin, entry.key), "the backend's close did not delete its record"
    assert not entry.lost


# --------------------------------------------------------------------------- server time


@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_expiry_is_judged_by_the_servers_clock(
    postgres_server: PostgresServer, admin: asyncpg.Connection, prefix: str, mode: str
) -> None:
    async with aiolocks.connect(_url(postgres_server, mode)) as backend:
        await backend.open()
        store = _store(backend)
        key = f"{prefix}/t"
        assert await store.create(key, b"v", ttl=600) is not None
        # The server's deadline moves; the app's idea of it (600 s) does not matter.
        await admin.execute(
            "UPDATE aiolocks_records SET expires_at = clock_timestamp() + interval '3 hours' "
            "WHERE key = $1",
            key,
        )
        record = await store.read(key)
        assert record is not None and record.ttl is not None and record.ttl > 3 * 3600 - 60
        await admin.execute(
            "UPDATE aiolocks_records SET expires_at = clock_timestamp() - interval '1 second' "
            "WHERE key = $1",
            key,
        )
        with await store.snapshot(prefix) as snap:
            assert snap.records == {}, "an expired row was listed"
        assert await store.read(key) is None
        assert await _rows(admin, "key = $1", key) == 0, "an expired row met was not deleted"
        assert not await store.delete(key)
        again = await store.create(key, b"w")
        assert again is not None
        assert await store.update(key, b"w2", version=again, ttl=0.5) is not None
        # expired rows are written over by create, in the same statement
        await admin.execute(
            "UPDATE aiolocks_records SET expires_at = clock_timestamp() - interval '1 second' "
            "WHERE key = $1",
            key,
        )
        third = await store.create(key, b"z")
        assert third is not None
        record = await store.read(key)
        assert record is not None and (record.value, record.ttl) == (b"z", None)
        assert await store.delete(key, version=third)


async def test_a_snapshot_wakes_at_the_servers_expiry(
    postgres_server: PostgresServer, admin: asyncpg.Connection, prefix: str
) -> None:
    """No NOTIFY is sent for an expiry: ``changed(None)`` must end by itself."""
    async with aiolocks.connect(_url(postgres_server, "advisory")) as backend:
        await backend.open()
        store = _store(backend)
        assert await store.create(f"{prefix}/short", b"x", ttl=0.5) is not None
        await asyncio.wait_for(_until_absent_in_snapshots(store, prefix, "short"), GUARD)


# --------------------------------------------------------------------------- cancellation


@contextlib.asynccontextmanager
async def _answers_lost(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[asyncio.Event]:
    """Record writes reach the server, but their answers never come back (until cancelled)."""
    real = asyncpg.Connection.fetch
    applied = asyncio.Event()

    async def fetch(self: asyncpg.Connection, query: str, *args: Any, **kwargs: Any) -> Any:
        rows = await real(self, query, *args, **kwargs)
        if "INSERT INTO" in query and "_records" in query and not applied.is_set():
            applied.set()
            await asyncio.Event().wait()  # the answer is lost: wait to be cancelled
        return rows

    with monkeypatch.context() as patch:
        patch.setattr(asyncpg.Connection, "fetch", fetch)
        yield applied


@pytest.mark.parametrize("method", ["create", "join"])
@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_a_write_cancelled_after_the_server_took_it_leaves_no_row(
    postgres_server: PostgresServer,
    admin: asyncpg.Connection,
    prefix: str,
    mode: str,
    method: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = f"{prefix}/w"
    async with aiolocks.connect(_url(postgres_server, mode)) as backend:
        await backend.open()
        store = _store(backend)
        assert await store.read(key) is None  # (the table exists before the fault)
        async with _answers_lost(monkeypatch) as applied:
            write: Awaitable[object] = (
                store.create(key, b"x") if method == "create" else store.join(key, b"x")
            )
            task = asyncio.ensure_future(write)
            await asyncio.wait_for(applied.wait(), GUARD)
            assert await _rows(admin, "key = $1", key) == 1, "the write did not reach the server"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await eventually(lambda: _no_row(admin, key), GUARD, what="the cleanup to delete it")
        await settle(backend)
        assert store._cleanups == {}
        assert await store.read(key) is None
        assert await store.create(key, b"after") is not None
        assert await store.delete(key)


async def _cancel_at_every_await(make: Callable[[int], Awaitable[object]]) -> dict[int, object]:
    """Run ``make(n)`` cancelled after n loop turns, for n = 0, 1, … until one finishes.

    Returns what the calls that finished returned (the last one, and any that
    finished before their cancellation landed), by n.
    """
    finished: dict[int, object] = {}
    for turns in range(400):
        task = asyncio.ensure_future(make(turns))
        for _ in range(turns):
            await asyncio.sleep(0)
        if task.done():
            finished[turns] = task.result()
            return finished
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            finished[turns] = await task
    raise AssertionError("the call never finished within 400 loop turns")


@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_cancelling_writes_at_each_await_leaves_no_stray_row(
    postgres_server: PostgresServer, admin: asyncpg.Connection, prefix: str, mode: str
) -> None:
    async with aiolocks.connect(_url(postgres_server, mode)) as backend:
        await backend.open()
        store = _store(backend)
        assert await store.read(f"{prefix}/none") is None  # (the table exists)
        created = await _cancel_at_every_await(lambda n: store.create(f"{prefix}/c{n}", b"x"))
        joined = await _cancel_at_every_await(lambda n: store.join(f"{prefix}/j{n}", b"x"))
        await settle(backend)  # the cleanups of cancelled writes ran
        assert store._cleanups == {}
        expected = sorted(
            [f"c{n}" for n, version in created.items() if version is not None]
            + [f"j{n}" for n, entry in joined.items() if entry is not None]
        )
        assert len(expected) >= 2, "the last call of each sweep wrote its record"
        with await store.snapshot(prefix) as snap:
            assert sorted(snap.records) == expected, "a cancelled write left a record"
        assert await _rows(admin, "parent = $1", prefix) == len(expected)
        assert sorted(store._entries) == [f"{prefix}/{c}" for c in expected if c[0] == "j"]
        for child in expected:
            assert await store.delete(f"{prefix}/{child}")
    assert await _rows(admin, "parent = $1", prefix) == 0


@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_cancelling_reads_updates_and_deletes_at_each_await(
    postgres_server: PostgresServer, admin: asyncpg.Connection, prefix: str, mode: str
) -> None:
    async with aiolocks.connect(_url(postgres_server, mode)) as backend:
        await backend.open()
        store = _store(backend)
        key = f"{prefix}/base"
        assert await store.create(key, b"0") is not None
        await _cancel_at_every_await(lambda n: store.read(key))
        await _cancel_at_every_await(lambda n: _snapshot_closed(store, prefix))
        assert store._waiters == {}, "a cancelled snapshot left its waiter behind"

        async def bump(n: int) -> object:
            current = await store.read(key)
            assert current is not None
            return await store.update(key, b"%d" % n, version=current.version)

        done = await _cancel_at_every_await(bump)
        record = await store.read(key)
        last = max(done)
        assert record is not None
        if done[last] is not None:
            assert record.value == b"%d" % last
        else:
            # the last bump lost its compare-and-set: a cancelled one's statement
            # ran on the server after its caller gave up, between its read and write
            assert record.value in {b"%d" % n for n in range(last)}
        assert await store.delete(key)

        # An ephemeral record deleted by calls cancelled at each await: whichever
        # call deleted it, the entry is dropped quietly, never reported lost.
        entry = await store.join(f"{prefix}/member", b"m")
        assert entry is not None
        await _cancel_at_every_await(lambda n: store.delete(entry.key))
        assert await store.read(entry.key) is None
        await eventually(
            lambda: entry.key not in store._entries, GUARD, what="the entry to be dropped"
        )
        assert not entry.lost, "an ephemeral record we deleted was reported lost"
    assert await _rows(admin, "parent = $1", prefix) == 0


async def _snapshot_closed(store: Records, prefix: str) -> None:
    with await store.snapshot(prefix):
        pass


# --------------------------------------------------------------------------- privileges


@pytest_asyncio.fixture
async def locker(
    postgres_server: PostgresServer, admin: asyncpg.Connection
) -> AsyncIterator[tuple[str, str]]:
    """(role, table prefix): every table made by the owner; the role has the documented grants."""
    tag = uuid.uuid4().hex[:8]
    role, tables = f"rec_locker_{tag}", f"rec_{tag}"
    owner_url = f"{postgres_server.url}?table_prefix={tables}&sslmode=disable"
    async with aiolocks.connect(owner_url) as owner:  # lock tables at open, records at first use
        await owner.open()
        assert await _store(owner).read("setup/x") is None
    database = postgres_server.database
    # the GRANT lines of docs/security.md
    grants = f"""
        CREATE ROLE {role} LOGIN;
        GRANT CONNECT ON DATABASE {database} TO {role};
        GRANT USAGE ON SCHEMA public TO {role};
        GRANT SELECT, INSERT, UPDATE, DELETE
            ON {tables}_fencing, {tables}_leases, {tables}_records TO {role};
        GRANT USAGE ON SEQUENCE {tables}_fencing_seq TO {role};
        GRANT EXECUTE ON FUNCTION {tables}_lease_acquire_v2(text, int8, text, text, int4, float8)
            TO {role};
    """
    try:
        await admin.execute(grants)
        yield role, tables
    finally:
        await admin.execute(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}';"
            f"DROP TABLE IF EXISTS {tables}_fencing, {tables}_leases, {tables}_records CASCADE;"
            f"DROP SEQUENCE IF EXISTS {tables}_fencing_seq;"
            f"DROP FUNCTION IF EXISTS {tables}_lease_acquire_v2;"
            f"DROP OWNED BY {role}; DROP ROLE {role};"
        )


def _role_url(server: PostgresServer, role: str, tables: str, mode: str) -> str:
    return (
        f"postgresql://{role}@{server.host}:{server.port}/{server.database}"
        f"?table_prefix={tables}&create_tables=false&{OPTIONS[mode]}"
    )


@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_the_documented_grants_suffice_for_records(
    postgres_server: PostgresServer, locker: tuple[str, str], prefix: str, mode: str
) -> None:
    role, tables = locker
    url = _role_url(postgres_server, role, tables, mode)
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as other:
        await backend.open()
        await other.open()
        store, theirs = _store(backend), _store(other)
        version = await store.create(f"{prefix}/p", b"1", ttl=60)
        assert version is not None
        assert await store.update(f"{prefix}/p", b"2", version=version) is not None
        entry = await store.join(f"{prefix}/m", b"m")
        assert entry is not None
        with await theirs.snapshot(prefix) as snap:
            assert sorted(snap.records) == ["m", "p"]
            assert snap.records["m"].ephemeral  # the session check reads pg_locks: no grant
            waiter = asyncio.ensure_future(snap.changed(None))
            assert await store.delete(f"{prefix}/p")
            await asyncio.wait_for(waiter, GUARD)  # NOTIFY and LISTEN need no grant either
    assert not entry.lost


async def test_a_role_without_the_record_grant_is_access_denied(
    postgres_server: PostgresServer, admin: asyncpg.Connection, locker: tuple[str, str]
) -> None:
    role, tables = locker
    await admin.execute(f"REVOKE ALL ON {tables}_records FROM {role}")
    url = _role_url(postgres_server, role, tables, "advisory")
    async with aiolocks.connect(url) as backend:
        await backend.open()
        store = _store(backend)
        with pytest.raises(aiolocks.AccessDeniedError, match="refused access"):
            await store.create("denied/x", b"x")
        with pytest.raises(aiolocks.AccessDeniedError):
            await store.join("denied/y", b"y")
        # the lock tables are still the role's: locks work
        async with backend.mutex("denied/lock"):
            pass


async def test_a_missing_record_table_without_create_tables_names_the_ddl(
    postgres_server: PostgresServer, admin: asyncpg.Connection, locker: tuple[str, str]
) -> None:
    role, tables = locker
    await admin.execute(f"DROP TABLE {tables}_records")
    url = _role_url(postgres_server, role, tables, "lease")
    async with aiolocks.connect(url) as backend:
        await backend.open()  # locks need no record table: opening works
        with pytest.raises(PostgresSetupError) as info:
            await _store(backend).create("setup/x", b"x")
        assert f'CREATE TABLE IF NOT EXISTS "{tables}_records"' in info.value.ddl


@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_bad_input_is_a_value_error_before_any_io(mode: str) -> None:
    # nothing listens there: any I/O would fail with BackendUnavailableError instead
    url = f"postgresql://nobody@127.0.0.1:1/db?connect_timeout=1&{OPTIONS[mode]}"
    store = _store(aiolocks.connect(url)._backend)
    for call in (
        lambda: store.create("no-child", b"x"),
        lambda: store.create("p/bad child", b"x"),
        lambda: store.create("p/x", "text"),  # type: ignore[arg-type]
        lambda: store.create("p/x", b"x", ttl=0),
        lambda: store.update("p/x", b"x", version="1"),  # type: ignore[arg-type]
        lambda: store.snapshot("p/"),
        lambda: store.read("/x"),
        lambda: store.join("p/" + "x" * 65, b"x"),
        lambda: store.delete("p/x", version=True),
    ):
        with pytest.raises(ValueError, match="record"):
            await call()
