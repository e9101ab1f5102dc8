"""Many holders at once: every reader of a read/write lock, every lease of a semaphore.

Sizes are larger than any per-backend connection budget (the PostgreSQL
backend opens at most ``1 + max_sessions`` connections, 9 by default): a
hold must not need a connection of its own. "All inside at once" is
checked with an event that the last one in sets, so no test depends on
timing; the generous ``asyncio.timeout`` only turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

import aiolocks

from ..polling import eventually

pytestmark = [pytest.mark.asyncio]


class _Gauge:
    """Counts holders inside; ``full`` is set once ``target`` are inside together."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.inside = 0
        self.peak = 0
        self.entered = 0
        self.full = asyncio.Event()

    def enter(self) -> None:
        self.inside += 1
        self.entered += 1
        self.peak = max(self.peak, self.inside)
        if self.inside >= self.target:
            self.full.set()

    def leave(self) -> None:
        self.inside -= 1


@contextlib.asynccontextmanager
async def _cancelled_at_exit(tasks: list[asyncio.Task[None]]) -> AsyncIterator[None]:
    """On a failure (a hang turned into a timeout), end the workers before the backends close."""
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.primitives("read_write_lock")
@pytest.mark.parametrize("readers", [20, 50])
async def test_every_reader_is_inside_at_once(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    names: Callable[[], str],
    readers: int,
) -> None:
    """N readers over two backends all hold together; each lists all N as holders."""
    name = names()
    gauge = _Gauge(readers)
    listed: list[int] = []
    release = asyncio.Event()

    async def reader(b: aiolocks.Backend) -> None:
        rw = b.read_write_lock(name)
        async with rw.read:
            gauge.enter()
            await release.wait()
            gauge.leave()

    tasks = [
        asyncio.create_task(reader(backend if i % 2 else other_backend)) for i in range(readers)
    ]
    async with _cancelled_at_exit(tasks), asyncio.timeout(60):
        await gauge.full.wait()
        for b in (backend, other_backend):
            seen = await b.read_write_lock(name).read.participants()
            listed.append(sum(1 for p in seen if p.is_holder))
        release.set()
        await asyncio.gather(*tasks)
    assert gauge.peak == readers
    assert listed == [readers, readers]
    rw = backend.read_write_lock(name)
    assert await rw.write.acquire(timeout=10)  # every reader let go
    await rw.write.release()


@pytest.mark.primitives("read_write_lock")
async def test_waiting_writers_and_readers_are_listed(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    """20 readers inside, 8 writers waiting (two backends): both views list 20 + 8."""
    if not backend.capabilities.queue_visible:
        pytest.skip("the backend does not show waiters")
    readers, writers = 20, 8
    name = names()
    gauge = _Gauge(readers)
    release = asyncio.Event()
    written = 0

    async def reader(b: aiolocks.Backend) -> None:
        async with b.read_write_lock(name).read:
            gauge.enter()
            await release.wait()

    async def writer(b: aiolocks.Backend) -> None:
        nonlocal written
        async with b.read_write_lock(name).write:
            written += 1

    async def counts(b: aiolocks.Backend) -> tuple[int, int]:
        seen = await b.read_write_lock(name).write.participants()
        holders = sum(1 for p in seen if p.is_holder)
        return holders, sum(1 for p in seen if not p.is_holder)

    tasks = [
        asyncio.create_task(reader(backend if i % 2 else other_backend)) for i in range(readers)
    ]
    async with _cancelled_at_exit(tasks), asyncio.timeout(60):
        await gauge.full.wait()
        tasks += [
            asyncio.create_task(writer(other_backend if i % 2 else backend)) for i in range(writers)
        ]

        async def writers_queued() -> bool:
            return (await counts(backend))[1] >= writers

        await eventually(writers_queued, 60, what=f"{writers} writers in the queue")
        assert await counts(backend) == (readers, writers)
        assert await counts(other_backend) == (readers, writers)
        release.set()
        await asyncio.gather(*tasks)
    assert written == writers


@pytest.mark.primitives("semaphore")
@pytest.mark.parametrize(("leases", "clients"), [(5, 10), (12, 30)])
async def test_every_lease_is_used_at_once(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    names: Callable[[], str],
    leases: int,
    clients: int,
) -> None:
    """More clients than leases over two backends: all leases are held together, never more.

    The first ``leases`` clients in wait until all of them are in (every lease
    is usable while others wait); then each holds a moment (workload, not
    synchronisation) and the rest take their turns.
    """
    name = names()
    gauge = _Gauge(leases)

    async def client(b: aiolocks.Backend) -> None:
        sem = b.semaphore(name, max_leases=leases)
        async with sem.lease() as lease:
            assert lease.fencing_token is not None
            gauge.enter()
            try:
                if gauge.entered <= leases:
                    await gauge.full.wait()
                await asyncio.sleep(0.05)
            finally:
                gauge.leave()

    tasks = [
        asyncio.create_task(client(backend if i % 2 else other_backend)) for i in range(clients)
    ]
    async with _cancelled_at_exit(tasks), asyncio.timeout(60):
        await asyncio.gather(*tasks)
    assert gauge.entered == clients
    assert gauge.peak == leases
