"""Advisory mode: many holders of one name need neither a session each nor a heartbeat's wait.

The backends here have a heartbeat far longer than the tests' bounds: the
periodic retry that an overflowing waiter falls back on never comes in
time, so every grant below has to come from a release, a notification or a
shared hold of the backend itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiolocks
from aiolocks.postgres import PostgresBackend
from aiolocks.postgres._driver import _answer_payloads
from aiolocks.postgres._sql import advisory_key
from aiolocks.testing import PostgresServer

pytestmark = [pytest.mark.postgres]

#: far beyond every bound below: no grant may wait for a periodic retry
_SLOW_HEARTBEAT = 120
#: turns a hang into a failure (never reached when the backend is right)
_BOUND = 30


def _app() -> str:
    return f"aiolocks-test-{uuid.uuid4().hex[:8]}"


def _backend(server: PostgresServer, app: str, max_sessions: int) -> PostgresBackend:
    url = f"{server.url}?heartbeat={_SLOW_HEARTBEAT}&sslmode=disable&application_name={app}"
    return PostgresBackend(url, max_sessions=max_sessions)


@contextlib.asynccontextmanager
async def _workers(tasks: list[asyncio.Task[None]]) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(_BOUND):
            yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _sessions(server: PostgresServer, app: str) -> int:
    return len(await asyncio.to_thread(server.backend_pids, application_name=app))


@pytest.mark.asyncio
@pytest.mark.parametrize(("readers", "max_sessions"), [(20, 2), (50, 1), (30, 8), (300, 1)])
async def test_readers_share_a_session_and_are_all_inside(
    postgres_server: PostgresServer, readers: int, max_sessions: int
) -> None:
    app = _app()
    name = f"many/readers/{app}"
    inside = 0
    full = asyncio.Event()
    release = asyncio.Event()
    tokens: list[int] = []

    async def reader(b: aiolocks.Backend) -> None:
        nonlocal inside
        rw = b.read_write_lock(name)
        async with rw.read:
            assert rw.read.fencing_token is not None
            tokens.append(rw.read.fencing_token)
            inside += 1
            if inside == readers:
                full.set()
            await release.wait()
            inside -= 1

    async with _backend(postgres_server, app, max_sessions) as one:
        async with _backend(postgres_server, app, max_sessions) as two:
            tasks = [asyncio.create_task(reader(one if i % 2 else two)) for i in range(readers)]
            async with _workers(tasks):
                await full.wait()
                assert await _sessions(postgres_server, app) <= 2 * (1 + max_sessions)
                for b in (one, two):
                    seen = await b.read_write_lock(name).read.participants()
                    holders = [p for p in seen if p.is_holder]
                    assert len(holders) == readers
                    assert sorted(p.fencing_token for p in holders) == sorted(tokens)  # type: ignore[type-var]
                release.set()
                await asyncio.gather(*tasks)
            assert len(set(tokens)) == readers
            rw = one.read_write_lock(name)
            assert await rw.write.acquire(timeout=_BOUND)
            assert rw.write.fencing_token is not None
            assert rw.write.fencing_token > max(tokens)
            await rw.write.release()
        locks = await asyncio.to_thread(postgres_server.advisory_locks)
        pids = set(await asyncio.to_thread(postgres_server.backend_pids, application_name=app))
        assert [row for row in locks if row[0] in pids] == []


@pytest.mark.asyncio
async def test_a_waiting_writer_keeps_new_readers_of_a_shared_hold_out(
    postgres_server: PostgresServer,
) -> None:
    """A reader does not join our shared hold past a writer queued on the server."""
    app = _app()
    name = f"many/writer-first/{app}"
    order: list[str] = []
    async with (
        _backend(postgres_server, app, 2) as one,
        _backend(postgres_server, app, 2) as two,
    ):
        first = one.read_write_lock(name)
        await first.read.acquire()

        async def writer() -> None:
            async with two.read_write_lock(name).write:
                order.append("write")

        async def late_reader() -> None:
            async with one.read_write_lock(name).read:
                order.append("read")

        async with asyncio.timeout(_BOUND):
            w = asyncio.create_task(writer())
            key = advisory_key("rwlock", name)
            while not any(
                row[1] == key and not row[3]
                for row in await asyncio.to_thread(postgres_server.advisory_locks)
            ):
                await asyncio.sleep(0.01)
            r = asyncio.create_task(late_reader())
            while len(await first.write.participants()) < 3:
                await asyncio.sleep(0.01)
            assert order == []
            await first.read.release()
            await asyncio.gather(w, r)
        assert order == ["write", "read"]


@pytest.mark.asyncio
@pytest.mark.parametrize(("leases", "clients"), [(5, 10), (12, 30), (3, 40)])
async def test_every_free_lease_is_taken_at_once(
    postgres_server: PostgresServer, leases: int, clients: int
) -> None:
    app = _app()
    name = f"many/leases/{app}"
    inside = 0
    peak = 0
    entered = 0
    full = asyncio.Event()
    tokens: list[int] = []

    async def client(b: aiolocks.Backend) -> None:
        nonlocal inside, peak, entered
        async with b.semaphore(name, max_leases=leases).lease() as lease:
            assert lease.fencing_token is not None
            tokens.append(lease.fencing_token)
            inside += 1
            entered += 1
            peak = max(peak, inside)
            if inside == leases:
                full.set()
            try:
                if entered <= leases:
                    await full.wait()  # the first ones in: every lease is usable together
                await asyncio.sleep(0.02)  # workload
            finally:
                inside -= 1

    async with (
        _backend(postgres_server, app, 2) as one,
        _backend(postgres_server, app, 2) as two,
    ):
        tasks = [asyncio.create_task(client(one if i % 2 else two)) for i in range(clients)]
        async with _workers(tasks):
            await asyncio.gather(*tasks)
    assert entered == clients
    assert peak == leases
    assert len(set(tokens)) == clients


@pytest.mark.asyncio
@pytest.mark.parametrize("family", ["mutex", "write", "semaphore_mutex"])
async def test_another_process_sees_a_handed_on_holder_at_once(
    postgres_server: PostgresServer, family: str
) -> None:
    """A hold passed between two tasks of one backend (no unlock): others see the new holder.

    Its participant id and token, as soon as it is inside; and the tasks
    still queued in that backend are listed as waiters.
    """
    app = _app()
    name = f"many/hand-off/{app}"
    views: list[tuple[list[Any], list[Any], int | None]] = []
    first_in = asyncio.Event()
    let_go = asyncio.Event()

    def lock_of(b: aiolocks.Backend) -> aiolocks.Lock | aiolocks.SemaphoreMutex:
        if family == "mutex":
            return b.mutex(name)
        if family == "write":
            return b.read_write_lock(name).write
        return b.semaphore_mutex(name)

    def view(seen: list[aiolocks.Participant]) -> list[Any]:
        return [(p.id, p.fencing_token, p.is_holder) for p in seen]

    async with (
        _backend(postgres_server, app, 2) as one,
        _backend(postgres_server, app, 2) as two,
    ):

        async def holder(index: int) -> None:
            lock = lock_of(one)
            async with lock:
                if index == 0:
                    first_in.set()
                    await let_go.wait()
                elif index == 1:
                    own = view(await lock.participants())
                    other = view(await lock_of(two).participants())
                    views.append((own, other, lock.fencing_token))

        async with asyncio.timeout(_BOUND):
            first = asyncio.create_task(holder(0))
            await first_in.wait()
            second = asyncio.create_task(holder(1))
            while len(await lock_of(one).participants()) < 2:
                await asyncio.sleep(0.01)
            third = asyncio.create_task(holder(2))
            while len(await lock_of(one).participants()) < 3:
                await asyncio.sleep(0.01)
            let_go.set()
            await asyncio.gather(first, second, third)
    [(own, other, token)] = views
    assert [entry for entry in own if entry[2]] == [(own[0][0], token, True)]
    assert len(own) == 2 and not own[1][2]  # the third task, queued in the backend
    assert other == own


@pytest.mark.asyncio
async def test_cancelled_readers_and_writers_leave_nothing_behind(
    postgres_server: PostgresServer,
) -> None:
    """Cancel readers (joining, queued, blocked) and writers at random moments.

    Readers and writers never overlap, every token is new, and afterwards
    no advisory lock of ours is left and no shared hold is counted.
    """
    app = _app()
    name = f"many/cancel/{app}"
    rng = random.Random(2424)
    state = {"readers": 0, "writers": 0, "bad": 0, "done": 0}
    tokens: list[int] = []

    async def body(b: aiolocks.Backend, write: bool) -> None:
        rw = b.read_write_lock(name)
        half = rw.write if write else rw.read
        async with half:
            assert half.fencing_token is not None
            tokens.append(half.fencing_token)
            state["writers" if write else "readers"] += 1
            if state["writers"] > 1 or (state["writers"] and state["readers"]):
                state["bad"] += 1
            try:
                await asyncio.sleep(rng.uniform(0, 0.01))
            finally:
                state["writers" if write else "readers"] -= 1
        state["done"] += 1

    url = f"{postgres_server.url}?heartbeat=1&sslmode=disable&application_name={app}"
    async with (
        PostgresBackend(url, max_sessions=2) as one,
        PostgresBackend(url, max_sessions=2) as two,
    ):
        async with asyncio.timeout(120):
            for _round in range(12):
                tasks = [
                    asyncio.create_task(body(one if i % 2 else two, rng.random() < 0.2))
                    for i in range(16)
                ]
                await asyncio.sleep(rng.uniform(0, 0.03))
                for task in rng.sample(tasks, 6):
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            while len(one._tasks) or len(two._tasks):
                await asyncio.sleep(0.01)
        assert state["bad"] == 0
        assert state["done"] > 0
        assert len(set(tokens)) == len(tokens)
        pids = set(await asyncio.to_thread(postgres_server.backend_pids, application_name=app))
        locks = await asyncio.to_thread(postgres_server.advisory_locks)
        assert [row for row in locks if row[0] in pids] == []
        for b in (one, two):
            assert b._driver._shared == {}
        rw = one.read_write_lock(name)
        assert await rw.write.acquire(timeout=10)
        await rw.write.release()


def test_an_answer_is_split_into_notifications_below_the_payload_limit() -> None:
    entries: list[Any] = [
        (f"host-{i}/Task-{i}-{'x' * (i % 50)}", 10**15 + i, "read", True) for i in range(400)
    ]
    entries.append(("waiter", None, "write", False))
    payloads = _answer_payloads(4242, "rwlock/some/name", entries)
    assert len(payloads) > 1
    assert all(len(p.encode()) < 8000 for p in payloads)
    parts = [json.loads(p.removeprefix("!!")) for p in payloads]
    assert {(part["p"], part["f"], part["n"]) for part in parts} == {
        (4242, "rwlock/some/name", len(payloads))
    }
    joined = [tuple(e) for part in sorted(parts, key=lambda p: p["i"]) for e in part["e"]]
    assert joined == entries
