"""The advisory driver's uncontended cycle (prepared lock/unlock calls on the session's
protocol) against a real PostgreSQL: cancellation at every step, exclusion, fencing,
the public-API fallback, and nothing left behind."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import asyncpg
import pytest

import aiolocks
from aiolocks.postgres import PostgresBackend
from aiolocks.postgres._driver import PostgresAdvisoryDriver
from aiolocks.testing import PgBouncer, PostgresServer

from ..polling import settle

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


def _app() -> str:
    return f"aiolocks-test-{uuid.uuid4().hex[:8]}"


async def _our_locks(server: PostgresServer, app: str) -> list[tuple[int, int, str, bool]]:
    pids = set(await asyncio.to_thread(server.backend_pids, application_name=app))
    locks = await asyncio.to_thread(server.advisory_locks)
    return [row for row in locks if row[0] in pids]


class _Exclusion:
    """Counts holders inside the critical section; a second one is a broken lock."""

    def __init__(self) -> None:
        self.inside = 0
        self.overlaps = 0
        self.tokens: list[int] = []

    async def body(self, lock: aiolocks.Mutex) -> None:
        self.inside += 1
        try:
            if self.inside != 1:
                self.overlaps += 1
            assert lock.fencing_token is not None
            self.tokens.append(lock.fencing_token)
            await asyncio.sleep(0)
        finally:
            self.inside -= 1


async def test_cancel_at_every_step_of_the_cycle_leaks_nothing(
    postgres_server: PostgresServer,
) -> None:
    """Cancel ``async with`` at random moments of the cycle (inside the lock call, the
    body, the unlock call), alone and while another backend hammers the same name:
    never two holders, tokens strictly increasing, no lock left on any session."""
    app = _app()
    name = f"cycle/cancel/{app}"
    url = f"{postgres_server.url}?application_name={app}"
    rng = random.Random(4242)
    seen = _Exclusion()
    async with aiolocks.connect(url) as mine, aiolocks.connect(url) as other:
        driver = mine._engine.driver
        assert isinstance(driver, PostgresAdvisoryDriver)
        in_flight = 0
        unlock_pending = driver._unlock_pending

        async def counting(a: Any) -> None:
            # a lock call whose answer the cancelled attempt never read
            nonlocal in_flight
            in_flight += bool(a.pending)
            await unlock_pending(a)

        driver._unlock_pending = counting  # type: ignore[method-assign]
        lock = mine.mutex(name)
        stop = asyncio.Event()

        async def hammer() -> None:
            rival = other.mutex(name)
            while not stop.is_set():
                async with rival:
                    await seen.body(rival)
                await asyncio.sleep(0)

        async def cycle() -> None:
            async with lock:
                await seen.body(lock)

        # time one cycle, then cancel anywhere within about two of them
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(5):
            await cycle()
        span = 2 * (loop.time() - started) / 5
        cancelled = 0
        rival: asyncio.Task[None] | None = None
        # (a lock left behind would block the rival for good: bounded)
        async with asyncio.timeout(60):
            for round_ in range(400):
                if round_ == 200:
                    rival = asyncio.create_task(hammer())
                task = asyncio.create_task(cycle())
                await asyncio.sleep(rng.uniform(0, span))
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled += 1
                if round_ >= 200 and in_flight >= 3 and cancelled >= 20:
                    break
            stop.set()
            assert rival is not None
            await rival
        await settle(mine, other, timeout=30)
        assert cancelled > 0
        assert in_flight > 0, "no cancellation landed inside a lock call"
        assert seen.overlaps == 0
        assert seen.tokens == sorted(seen.tokens)
        assert len(set(seen.tokens)) == len(seen.tokens)
        assert await _our_locks(postgres_server, app) == []
        # the session is still in step (no answer of a cancelled call is read as ours)
        async with lock:
            assert lock.fencing_token is not None
            assert lock.fencing_token > max(seen.tokens)
            held = await _our_locks(postgres_server, app)
            assert [(mode, granted) for _, _, mode, granted in held] == [("ExclusiveLock", True)]
        assert await _our_locks(postgres_server, app) == []


class _HiddenProtocol:
    """An asyncpg connection seen through an object without ``_protocol`` (as a
    connection wrapper of another library may be)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        if name == "_protocol":
            raise AttributeError(name)
        return getattr(self._conn, name)


class _Pool:
    """The ``acquire``/``release`` pair ``PostgresBackend`` borrows sessions from."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.out: list[asyncpg.Connection] = []

    async def acquire(self) -> _HiddenProtocol:
        conn = await asyncpg.connect(self.url)
        self.out.append(conn)
        return _HiddenProtocol(conn)

    async def release(self, conn: _HiddenProtocol) -> None:
        raw = conn._conn
        if raw in self.out:
            self.out.remove(raw)
        raw.terminate()


async def test_connection_without_a_protocol_takes_the_public_calls(
    postgres_server: PostgresServer,
) -> None:
    app = _app()
    pool = _Pool(f"{postgres_server.url}?application_name={app}")
    async with PostgresBackend(pool) as backend:
        driver = backend._engine.driver
        assert isinstance(driver, PostgresAdvisoryDriver)
        lock = backend.mutex(f"cycle/hidden/{app}")
        tokens = []
        for _ in range(3):
            async with lock:
                assert lock.fencing_token is not None
                tokens.append(lock.fencing_token)
                held = await _our_locks(postgres_server, app)
                assert [(mode, granted) for _, _, mode, granted in held] == [
                    ("ExclusiveLock", True)
                ]
            assert await _our_locks(postgres_server, app) == []
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
        primary = driver._primary
        assert primary is not None
        # every statement of the cycle went through a prepared statement, none
        # through the protocol (there is none to see)
        assert primary.statements
        assert all(state is None for _prepared, state in primary.statements.values())
    assert pool.out == []


async def test_the_cycle_binds_on_the_protocol_and_prepares_once(
    postgres_server: PostgresServer,
) -> None:
    app = _app()
    async with aiolocks.connect(f"{postgres_server.url}?application_name={app}") as backend:
        driver = backend._engine.driver
        assert isinstance(driver, PostgresAdvisoryDriver)
        lock = backend.mutex(f"cycle/bind/{app}")
        for _ in range(3):
            async with lock:
                pass
        primary = driver._primary
        assert primary is not None
        prepared = dict(primary.statements)
        # the first grant registers the name; later ones lock, and every one unlocks
        queries = driver._queries
        cycle = {queries.try_exclusive_register, queries.try_exclusive, queries.unlock_exclusive}
        assert cycle <= set(prepared)
        assert all(state is not None for _p, state in prepared.values())
        for _ in range(3):
            async with lock:
                pass
        assert {q: id(p) for q, (p, _s) in primary.statements.items()} == {
            q: id(p) for q, (p, _s) in prepared.items()
        }


# -- mode=lease ----------------------------------------------------------------


async def _lease_cycles(backend: aiolocks.Backend, name: str, cycles: int) -> list[int]:
    lock = backend.mutex(name)
    tokens = []
    for _ in range(cycles):
        async with lock:
            assert lock.fencing_token is not None
            tokens.append(lock.fencing_token)
    return tokens


async def test_lease_statements_are_prepared_on_a_direct_server(
    postgres_server: PostgresServer,
) -> None:
    """One round trip per statement: the pool keeps them prepared (the listener's
    probe found the server itself), on a connection the driver keeps between
    statements."""
    name = f"cycle/lease-direct/{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(f"{postgres_server.url}?mode=lease&lease_time=5") as backend:
        tokens = await _lease_cycles(backend, name, 3)
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
        # the cycle ran on one connection, kept checked out between statements
        kept = backend._engine.driver._idle  # type: ignore[attr-defined]
        assert len(kept) == 1
        rows = await kept[0].fetch("SELECT statement FROM pg_prepared_statements")
        statements = " ".join(str(r[0]) for r in rows)
        assert "aiolocks_lease_acquire_v2" in statements
        assert "DELETE FROM" in statements


async def test_lease_statements_are_not_prepared_through_a_pooler(
    pgbouncer: PgBouncer, postgres_server: PostgresServer
) -> None:
    """Behind a transaction pooler (no listen_url: the listener's probe sees the
    pooler) every statement goes unprepared, and cycles from two backends work
    (a statement prepared on one server session would be missing on another)."""
    name = f"cycle/lease-bouncer/{uuid.uuid4().hex[:8]}"
    url = f"{pgbouncer.url}?mode=lease&lease_time=5&sslmode=disable"
    async with PostgresBackend(url) as one, PostgresBackend(url) as two:
        # two backends on two names at once: the pooler moves their statements
        # between its server sessions
        async with asyncio.timeout(60):
            first, second = await asyncio.gather(
                _lease_cycles(one, name, 15), _lease_cycles(two, name + "-2", 15)
            )
        assert first == sorted(first) and len(set(first)) == 15
        assert second == sorted(second) and len(set(second)) == 15
    rows = await asyncio.to_thread(
        postgres_server.query,
        "SELECT count(*) FROM aiolocks_leases WHERE name = 'mutex/" + name + "'",
    )
    assert rows == [("0",)]


async def test_lease_kept_connection_ended_by_the_server_is_replaced(
    postgres_server: PostgresServer,
) -> None:
    """The connection kept between statements is ended behind our back: the
    statement that finds it gone fails as unavailable (as a pooled one would),
    its attempt cleans up on a fresh connection, and later cycles work."""
    app = _app()
    name = f"cycle/lease-ended/{app}"
    url = f"{postgres_server.url}?mode=lease&lease_time=5&application_name={app}"
    async with aiolocks.connect(url) as backend:
        before = await _lease_cycles(backend, name, 2)
        driver = backend._engine.driver
        assert len(driver._idle) == 1  # type: ignore[attr-defined]
        ended = await asyncio.to_thread(postgres_server.terminate_backends, application_name=app)
        assert ended >= 1
        failures = 0
        after: list[int] = []
        async with asyncio.timeout(30):
            while len(after) < 3:
                try:
                    after += await _lease_cycles(backend, name, 1)
                except aiolocks.BackendUnavailableError:
                    failures += 1
                    assert failures <= 2
        assert min(after) > max(before) and len(set(after)) == 3
        # the release of the last cycle found its row (no loss was reported)
    rows = await asyncio.to_thread(
        postgres_server.query,
        "SELECT count(*) FROM aiolocks_leases WHERE name = 'mutex/" + name + "'",
    )
    assert rows == [("0",)]


@pytest.mark.parametrize("how", ["terminated", "ended by the server"])
async def test_a_prepared_call_on_a_closed_session_raises_interface_error(
    postgres_server: PostgresServer, how: str
) -> None:
    """A call that waited for the session's turn while the session closed fails the
    way asyncpg's public calls do (an error the driver treats as a lost session)."""
    app = _app()
    async with aiolocks.connect(f"{postgres_server.url}?application_name={app}") as backend:
        driver = backend._engine.driver
        assert isinstance(driver, PostgresAdvisoryDriver)
        async with backend.mutex(f"cycle/closed/{app}"):
            pass
        session = driver._primary
        assert session is not None
        query = driver._queries.unlock_exclusive
        assert query in session.statements
        if how == "terminated":
            session.conn.terminate()
        else:
            await asyncio.to_thread(postgres_server.terminate_backends, application_name=app)
            async with asyncio.timeout(10):
                while not session.conn.is_closed():
                    await asyncio.sleep(0.01)
        with pytest.raises(asyncpg.InterfaceError):
            await session.rows(query, (1,))


async def test_an_untested_asyncpg_version_takes_the_public_calls(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The protocol call is private to asyncpg: outside the versions it was tested
    on, the cycle goes through the public prepared statements, and still works."""
    from aiolocks.postgres import _asyncpg_compat

    monkeypatch.setattr(_asyncpg_compat, "ENABLED", False)
    app = _app()
    async with aiolocks.connect(f"{postgres_server.url}?application_name={app}") as backend:
        driver = backend._engine.driver
        assert isinstance(driver, PostgresAdvisoryDriver)
        lock = backend.mutex(f"cycle/untested/{app}")
        tokens = []
        for _ in range(2):
            async with lock:
                assert lock.fencing_token is not None
                tokens.append(lock.fencing_token)
                assert len(await _our_locks(postgres_server, app)) == 1
            assert await _our_locks(postgres_server, app) == []
        assert tokens[0] < tokens[1]
        primary = driver._primary
        assert primary is not None and primary.statements
        assert all(state is None for _prepared, state in primary.statements.values())
