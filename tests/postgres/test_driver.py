"""The advisory-mode driver against a real PostgreSQL: loss, sessions, cancellation, poolers."""

from __future__ import annotations

import asyncio
import random
import uuid

import asyncpg
import pytest

import aiolocks
from aiolocks.postgres import PostgresBackend, PostgresPoolerError
from aiolocks.postgres._driver import PostgresAdvisoryDriver
from aiolocks.postgres._sql import advisory_key, slot_keys
from aiolocks.testing import PgBouncer, PostgresServer, TcpProxy

from ..polling import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


def _app() -> str:
    return f"aiolocks-test-{uuid.uuid4().hex[:8]}"


def _url(server: PostgresServer, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{server.url}?{query}" if query else server.url


def _driver(backend: aiolocks.Backend) -> PostgresAdvisoryDriver:
    driver = backend._engine.driver
    assert isinstance(driver, PostgresAdvisoryDriver)
    return driver


async def _our_locks(server: PostgresServer, app: str) -> list[tuple[int, int, str, bool]]:
    pids = set(await asyncio.to_thread(server.backend_pids, application_name=app))
    locks = await asyncio.to_thread(server.advisory_locks)
    return [row for row in locks if row[0] in pids]


async def test_terminated_session_cancels_the_body(postgres_server: PostgresServer) -> None:
    app = _app()
    url = _url(postgres_server, heartbeat=1, application_name=app)
    async with aiolocks.connect(url) as backend:
        lock = backend.mutex(f"driver/terminate/{app}")
        async with asyncio.timeout(30):
            with pytest.raises(aiolocks.LockLostError):
                async with lock:
                    ended = await asyncio.to_thread(
                        postgres_server.terminate_backends, application_name=app
                    )
                    assert ended >= 1
                    await asyncio.sleep(60)
        # a fresh session takes over: the backend keeps working
        async with lock:
            assert lock.fencing_token is not None


async def test_lock_dropped_behind_our_back_is_found_by_the_heartbeat(
    postgres_server: PostgresServer,
) -> None:
    """A ``pg_advisory_unlock_all()`` on our session (a pool reset) is a loss, not silence."""
    app = _app()
    url = _url(postgres_server, heartbeat=0.5, application_name=app)
    async with aiolocks.connect(url) as backend:
        lock = backend.mutex(f"driver/unlock-all/{app}")
        async with asyncio.timeout(30):
            with pytest.raises(aiolocks.LockLostError):
                async with lock:
                    primary = backend._driver._primary
                    async with primary.io:
                        await primary.conn.execute("SELECT pg_advisory_unlock_all()")
                    await asyncio.sleep(60)
        assert await _our_locks(postgres_server, app) == []


async def test_two_tasks_of_one_backend_exclude_each_other(
    postgres_server: PostgresServer,
) -> None:
    """Advisory locks stack per session: the driver must not let a second task re-take one."""
    app = _app()
    name = f"driver/stack/{app}"
    async with aiolocks.connect(_url(postgres_server, application_name=app)) as backend:
        holder = backend.mutex(name)
        await holder.acquire()
        other = asyncio.create_task(backend.mutex(name).acquire(timeout=0.3))
        assert await other is False
        key = advisory_key("mutex", name)
        held = [row for row in await _our_locks(postgres_server, app) if row[1] == key]
        assert [(mode, granted) for _, _, mode, granted in held] == [("ExclusiveLock", True)]
        await holder.release()
        assert await _our_locks(postgres_server, app) == []


async def test_waiters_use_a_bounded_number_of_connections(
    postgres_server: PostgresServer,
) -> None:
    app = _app()
    name = f"driver/bound/{app}"
    state = {"inside": 0, "max": 0, "done": 0}
    peak_connections = 0
    backend = PostgresBackend(_url(postgres_server, application_name=app), max_sessions=3)
    async with backend:
        lock_name = name

        async def worker() -> None:
            nonlocal peak_connections
            for _ in range(3):
                async with backend.mutex(lock_name):
                    state["inside"] += 1
                    state["max"] = max(state["max"], state["inside"])
                    pids = await asyncio.to_thread(
                        postgres_server.backend_pids, application_name=app
                    )
                    peak_connections = max(peak_connections, len(pids))
                    await asyncio.sleep(0.005)
                    state["inside"] -= 1
                    state["done"] += 1

        async with asyncio.timeout(120):
            await asyncio.gather(*(asyncio.create_task(worker()) for _ in range(12)))
        assert state == {"inside": 0, "max": 1, "done": 36}
        # the primary plus at most max_sessions extra ones
        assert 1 <= peak_connections <= 4
        assert await _our_locks(postgres_server, app) == []


async def test_cancelled_waiters_leave_no_lock_behind(postgres_server: PostgresServer) -> None:
    """Cancel blocked acquires at random moments (around the grant too): nothing stays held."""
    app = _app()
    name = f"driver/cancel/{app}"
    rng = random.Random(1313)
    async with (
        aiolocks.connect(_url(postgres_server, application_name=app)) as backend,
        aiolocks.connect(_url(postgres_server, application_name=app + "-b")) as other,
    ):
        tokens: list[int] = []
        for _round in range(15):
            # semaphore mutexes: the blocker is released from another task
            blocker = other.semaphore_mutex(name)
            await blocker.acquire()
            waiter_lock = backend.semaphore_mutex(name)

            async def wait_for_it(lock: aiolocks.SemaphoreMutex = waiter_lock) -> None:
                async with lock:
                    assert lock.fencing_token is not None
                    tokens.append(lock.fencing_token)

            waiter = asyncio.create_task(wait_for_it())
            await asyncio.sleep(rng.uniform(0, 0.02))
            release = asyncio.create_task(blocker.release())
            await asyncio.sleep(rng.uniform(0, 0.01))
            waiter.cancel()
            await asyncio.gather(waiter, release, return_exceptions=True)
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
        # let the owned cleanups finish, then nothing of ours is held
        await eventually(
            lambda: not len(backend._tasks) and not len(other._tasks),
            30,
            what="the owned cleanups to finish",
        )
        assert await _our_locks(postgres_server, app) == []
        assert await _our_locks(postgres_server, app + "-b") == []
        async with backend.semaphore_mutex(name):
            pass


async def test_semaphore_waiter_wakes_on_another_process_release(
    postgres_server: PostgresServer,
) -> None:
    app = _app()
    name = f"driver/sem/{app}"
    async with (
        aiolocks.connect(_url(postgres_server, application_name=app)) as backend,
        aiolocks.connect(_url(postgres_server, application_name=app)) as other,
    ):
        first = await other.semaphore(name, 2).acquire()
        second = await other.semaphore(name, 2).acquire()
        assert first is not None and second is not None
        waiting = asyncio.create_task(backend.semaphore(name, 2).acquire(timeout=30))
        # the waiter tried, found no slot, and waits for a release NOTIFY
        driver: PostgresAdvisoryDriver = backend._driver

        def waiting_for_notify() -> bool:
            change = driver._change
            return change is not None and not change.done()

        await eventually(waiting_for_notify, what="the waiter to wait for a slot")
        assert not waiting.done()
        await first.release()
        lease = await waiting
        assert lease is not None
        held = {row[1] for row in await _our_locks(postgres_server, app)}
        assert held <= set(slot_keys(name, 2)) and len(held) == 2
        await lease.release()
        await second.release()
        assert await _our_locks(postgres_server, app) == []


async def test_pool_wrapped_backend(postgres_server: PostgresServer) -> None:
    app = _app()
    pool = await asyncpg.create_pool(
        postgres_server.url, min_size=1, max_size=6, server_settings={"application_name": app}
    )
    try:
        async with PostgresBackend(pool, max_sessions=2) as backend:
            rw = backend.read_write_lock(f"driver/pool/{app}")
            inside = asyncio.Event()
            leave = asyncio.Event()

            async def reader() -> None:
                async with rw.read:
                    inside.set()
                    await leave.wait()

            other_reader = asyncio.create_task(reader())
            async with rw.read:
                await inside.wait()
                # two readers of one backend: one session's shared lock, counted twice
                held = await _our_locks(postgres_server, app)
                assert [(mode, granted) for _, _, mode, granted in held] == [("ShareLock", True)]
                holders = [p for p in await rw.read.participants() if p.is_holder]
                assert len(holders) == 2
                leave.set()
                await other_reader
        assert await _our_locks(postgres_server, app) == []
    finally:
        await pool.close()


async def test_advisory_mode_refuses_a_transaction_pooler(pgbouncer: PgBouncer) -> None:
    with pytest.raises(PostgresPoolerError, match="mode=lease"):
        async with aiolocks.connect(pgbouncer.url):
            pass


async def test_bad_input_is_refused_before_io() -> None:
    with pytest.raises(ValueError, match="lease_time applies to mode=lease only"):
        aiolocks.connect("postgresql://nobody@127.0.0.1:1/x?lease_time=3")
    with pytest.raises(TypeError, match=r"asyncpg\.Pool"):
        PostgresBackend(42)
    with pytest.raises(ValueError, match="max_sessions"):
        PostgresBackend("postgresql://nobody@127.0.0.1:1/x", max_sessions=0)


async def _lease_rows(server: PostgresServer, name: str) -> list[tuple[str | None, ...]]:
    literal = name.replace("'", "''")
    return await asyncio.to_thread(
        server.query, f"SELECT owner FROM aiolocks_leases WHERE name LIKE '%{literal}'"
    )


async def test_lease_mode_through_pgbouncer(
    pgbouncer: PgBouncer, postgres_server: PostgresServer
) -> None:
    """Transaction pooling: exclusion holds, waiters wake on NOTIFY via a direct listener."""
    name = f"driver/lease/{uuid.uuid4().hex[:8]}"
    url = f"{pgbouncer.url}?mode=lease&lease_time=5&sslmode=disable"
    state = {"inside": 0, "max": 0, "done": 0}
    async with (
        PostgresBackend(url, listen_url=postgres_server.url) as one,
        PostgresBackend(url, listen_url=postgres_server.url) as two,
    ):

        async def worker(backend: aiolocks.Backend) -> None:
            for _ in range(5):
                async with backend.mutex(name):
                    state["inside"] += 1
                    state["max"] = max(state["max"], state["inside"])
                    await asyncio.sleep(0.002)
                    state["inside"] -= 1
                    state["done"] += 1

        async with asyncio.timeout(60):
            await asyncio.gather(*(worker(b) for b in (one, two, one, two)))
        assert state == {"inside": 0, "max": 1, "done": 20}
        assert await _lease_rows(postgres_server, name) == []


async def test_lease_row_deleted_behind_our_back_is_a_loss(
    postgres_server: PostgresServer,
) -> None:
    name = f"driver/lease-delete/{uuid.uuid4().hex[:8]}"
    url = f"{postgres_server.url}?mode=lease&lease_time=1&sslmode=disable"
    async with aiolocks.connect(url) as backend:
        lock = backend.mutex(name)
        async with asyncio.timeout(30):
            with pytest.raises(aiolocks.LockLostError):
                async with lock:
                    assert len(await _lease_rows(postgres_server, name)) == 1
                    literal = name.replace("'", "''")
                    await asyncio.to_thread(
                        postgres_server.query,
                        f"DELETE FROM aiolocks_leases WHERE name LIKE '%{literal}'",
                    )
                    await asyncio.sleep(60)
        async with lock:
            assert lock.fencing_token is not None


async def test_lease_cancelled_waiters_leave_no_rows(postgres_server: PostgresServer) -> None:
    name = f"driver/lease-cancel/{uuid.uuid4().hex[:8]}"
    url = f"{postgres_server.url}?mode=lease&lease_time=5&sslmode=disable"
    rng = random.Random(1314)
    tokens: list[int | None] = []
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as other:
        for _round in range(15):
            blocker = other.semaphore_mutex(name)
            await blocker.acquire()
            waiter_lock = backend.semaphore_mutex(name)

            async def wait_for_it(lock: aiolocks.SemaphoreMutex = waiter_lock) -> None:
                async with lock:
                    tokens.append(lock.fencing_token)

            waiter = asyncio.create_task(wait_for_it())
            await asyncio.sleep(rng.uniform(0, 0.02))
            release = asyncio.create_task(blocker.release())
            await asyncio.sleep(rng.uniform(0, 0.01))
            waiter.cancel()
            await asyncio.gather(waiter, release, return_exceptions=True)
        assert all(t is not None for t in tokens)
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)  # type: ignore[type-var]
        await eventually(
            lambda: not len(backend._tasks) and not len(other._tasks),
            30,
            what="the owned cleanups to finish",
        )
        assert await _lease_rows(postgres_server, name) == []


async def test_fencing_survives_a_server_restart(postgres_restartable: PostgresServer) -> None:
    url = _url(postgres_restartable, heartbeat=0.5, connect_timeout=5)
    async with aiolocks.connect(url) as backend:
        lock = backend.mutex("driver/restart")
        async with lock:
            before = lock.fencing_token
        assert before is not None
        restart: asyncio.Task[None] | None = None
        async with asyncio.timeout(60):
            with pytest.raises(aiolocks.LockLostError):
                async with lock:
                    restart = asyncio.create_task(asyncio.to_thread(postgres_restartable.restart))
                    await asyncio.sleep(60)
            assert restart is not None
            await restart
        async with lock:
            after = lock.fencing_token
        assert after is not None and after > before


async def test_stalled_link_is_a_loss(postgres_server: PostgresServer) -> None:
    """No byte gets through, the session is not ended: the heartbeat's timeout declares the loss."""
    app = _app()
    async with TcpProxy(postgres_server.host, postgres_server.port) as proxy:
        url = (
            f"postgresql://{postgres_server.user}@{proxy.netloc}/{postgres_server.database}"
            f"?heartbeat=0.5&sslmode=disable&application_name={app}"
        )
        async with aiolocks.connect(url) as backend:
            lock = backend.mutex(f"driver/stall/{app}")
            async with asyncio.timeout(30):
                with pytest.raises(aiolocks.LockLostError):
                    async with lock:
                        proxy.stall()
                        await asyncio.sleep(60)
            proxy.heal()
            # the old session may still hold the server lock: end it as an operator would
            await asyncio.to_thread(postgres_server.terminate_backends, application_name=app)
            async with asyncio.timeout(30), lock:
                assert lock.fencing_token is not None


async def test_local_hand_offs_keep_exclusion_order_and_let_other_processes_in(
    postgres_server: PostgresServer,
) -> None:
    """Tasks of one backend pass the server lock on (one ``nextval`` each); tokens
    keep increasing in hold order, and another process's waiter still gets its turn."""
    from aiolocks.postgres._driver import MAX_HANDOFFS

    app = _app()
    name = f"driver/handoff/{app}"
    inside = 0
    order: list[tuple[str, int]] = []
    foreign_done = asyncio.Event()
    async with (
        aiolocks.connect(_url(postgres_server, application_name=app)) as backend,
        aiolocks.connect(_url(postgres_server, application_name=app + "-f")) as foreign,
    ):

        async def hold(lock: aiolocks.Mutex, who: str) -> None:
            nonlocal inside
            async with lock:
                inside += 1
                assert inside == 1
                assert lock.fencing_token is not None
                order.append((who, lock.fencing_token))
                await asyncio.sleep(0)
                inside -= 1

        async def local(index: int) -> None:
            lock = backend.mutex(name)
            # keep hammering until the other process got the lock once
            while not foreign_done.is_set():
                await hold(lock, f"local-{index}")

        async def other() -> None:
            # queue on the server once the local tasks are busy handing off
            await eventually(lambda: len(order) >= 3 * MAX_HANDOFFS, 60, what="the hand-offs")
            await hold(foreign.mutex(name), "foreign")
            foreign_done.set()

        async with asyncio.timeout(120):
            await asyncio.gather(*(local(i) for i in range(6)), other())
        tokens = [token for _who, token in order]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
        assert ("foreign", tokens[[w for w, _t in order].index("foreign")]) in order
        assert len({who for who, _t in order if who != "foreign"}) == 6
        assert _driver(backend)._queued == {}
        assert await _our_locks(postgres_server, app) == []


async def test_cancelled_hand_off_waiters_leave_nothing_behind(
    postgres_server: PostgresServer,
) -> None:
    """Cancel queued and handed-off tasks at random moments: no lock, no queue entry left."""
    app = _app()
    name = f"driver/handoff-cancel/{app}"
    rng = random.Random(2718)
    tokens: list[int] = []
    async with aiolocks.connect(_url(postgres_server, application_name=app)) as backend:

        async def hold() -> None:
            lock = backend.mutex(name)
            async with lock:
                assert lock.fencing_token is not None
                tokens.append(lock.fencing_token)
                await asyncio.sleep(rng.uniform(0, 0.003))

        async with asyncio.timeout(120):
            for _round in range(12):
                tasks = [asyncio.create_task(hold()) for _ in range(6)]
                await asyncio.sleep(rng.uniform(0, 0.02))
                for task in rng.sample(tasks, 3):
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await eventually(lambda: not len(backend._tasks), 60, what="the owned cleanups")
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
        driver = _driver(backend)
        assert driver._queued == {} and driver._server_waiters == {}
        assert await _our_locks(postgres_server, app) == []
        async with backend.mutex(name):  # still usable
            pass


async def test_a_handed_off_hold_is_lost_with_its_session(postgres_server: PostgresServer) -> None:
    app = _app()
    name = f"driver/handoff-loss/{app}"
    async with aiolocks.connect(_url(postgres_server, heartbeat=1, application_name=app)) as b:
        held, go = asyncio.Event(), asyncio.Event()

        async def first() -> None:
            async with b.mutex(name):
                held.set()
                await go.wait()

        holder = asyncio.create_task(first())
        await held.wait()
        second = b.mutex(name)

        async def let_go() -> None:
            # the acquire below is queued for the hand-off
            await eventually(lambda: _driver(b)._queued, 30, what="the queued acquire")
            go.set()

        async with asyncio.timeout(30):
            releaser = asyncio.create_task(let_go())
            with pytest.raises(aiolocks.LockLostError):
                async with second:
                    await holder
                    await releaser
                    ended = await asyncio.to_thread(
                        postgres_server.terminate_backends, application_name=app
                    )
                    assert ended >= 1
                    await asyncio.sleep(60)


async def test_lease_readers_do_not_overtake_a_waiting_writer(
    postgres_server: PostgresServer,
) -> None:
    """Reader held, writer waiting (another backend): a new reader waits behind the writer."""
    app = _app()
    name = f"driver/lease-writer/{app}"
    url = _url(postgres_server, mode="lease", lease_time=10, application_name=app)
    events: list[str] = []
    raw = await asyncpg.connect(postgres_server.url)
    try:
        async with aiolocks.connect(url) as readers, aiolocks.connect(url) as writers:
            first = readers.read_write_lock(name)
            assert await first.read.acquire(timeout=10)

            async def write() -> None:
                async with writers.read_write_lock(name).write:
                    events.append("write")

            async def late_read() -> None:
                async with readers.read_write_lock(name).read:
                    events.append("late-read")

            async with asyncio.timeout(60):
                writer = asyncio.create_task(write())

                async def writer_marked() -> object:  # the writer is marked as waiting
                    return await raw.fetchval(
                        "SELECT count(*) FROM aiolocks_leases WHERE name = $1 AND slot < 0",
                        f"rwlock/{name}",
                    )

                await eventually(writer_marked, what="the writer's waiting mark")
                # refused while a writer waits (in another task: this one reads already)
                late = readers.read_write_lock(name)
                assert not await asyncio.create_task(late.read.acquire(timeout=0))
                reader = asyncio.create_task(late_read())
                # the late reader tried, was refused, and waits for a release NOTIFY
                waiters = readers._driver._waiters
                await eventually(lambda: f"rwlock/{name}" in waiters, what="the late reader")
                assert events == []
                await first.read.release()
                await asyncio.gather(writer, reader)
            assert events == ["write", "late-read"]
            # nothing left: the writer's mark went with its grant
            assert (
                await raw.fetchval(
                    "SELECT count(*) FROM aiolocks_leases WHERE name = $1", f"rwlock/{name}"
                )
                == 0
            )
    finally:
        await raw.close()


def _in_use(pool: asyncpg.Pool) -> int:
    """Connections of ``pool`` checked out and not given back."""
    return sum(1 for holder in pool._holders if holder._in_use is not None)


async def test_pool_gets_back_sessions_the_server_ended_or_that_broke(
    postgres_server: PostgresServer,
) -> None:
    """Terminated, cut and stalled sessions of a pool-wrapped backend go back to the
    user's pool (closed): it never shrinks for good nor leaks checked-out connections."""
    app = _app()
    async with TcpProxy(postgres_server.host, postgres_server.port) as proxy:
        pool = await asyncpg.create_pool(
            host=proxy.host,
            port=proxy.port,
            user=postgres_server.user,
            database=postgres_server.database,
            min_size=0,
            max_size=3,
            server_settings={"application_name": app},
        )
        try:
            async with PostgresBackend(pool, heartbeat=0.5, max_sessions=2) as backend:
                raw = await asyncpg.connect(postgres_server.url)
                try:
                    for fault in ("terminate", "cut", "stall"):
                        lock = backend.mutex(f"driver/pool-fault/{app}/{fault}")
                        assert await lock.acquire(timeout=10)
                        (holder,) = await lock.participants()
                        pid = int(str(holder.node).removeprefix("pid:"))
                        if fault == "terminate":
                            assert await raw.fetchval("SELECT pg_terminate_backend($1)", pid)
                        elif fault == "cut":
                            proxy.cut()
                        else:
                            proxy.stall()
                        await eventually(lambda: lock.is_lost, 30, what="the loss")  # noqa: B023
                        proxy.heal()
                        with pytest.raises(aiolocks.LockLostError):
                            await lock.release()
                        await raw.execute("SELECT pg_terminate_backend($1)", pid)  # a stalled one
                        # the backend works on, within the pool's limit
                        async with asyncio.timeout(30), backend.mutex(f"driver/pool/{app}"):
                            assert _in_use(pool) <= 3
                finally:
                    await raw.close()
            # closing hands the last ones back
            await eventually(lambda: not _in_use(pool), 30, what="the pool's connections")
            conns = [await asyncio.wait_for(pool.acquire(), 10) for _ in range(3)]
            for conn in conns:
                assert await conn.fetchval("SELECT 1") == 1
                await pool.release(conn)
        finally:
            pool.terminate()
