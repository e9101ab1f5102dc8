"""The semaphore contract, for every backend."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

import aiolocks

from ..polling import settle
from .conftest import wait_queued

pytestmark = [pytest.mark.asyncio, pytest.mark.primitives("semaphore")]


async def test_leases_have_distinct_increasing_tokens(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    sem = backend.semaphore(names(), max_leases=3)
    assert sem.max_leases == 3
    leases = [await sem.acquire(timeout=1) for _ in range(3)]
    assert all(lease is not None for lease in leases)
    tokens = [lease.fencing_token for lease in leases if lease is not None]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert await sem.acquire(timeout=0) is None
    holders = [p for p in await sem.participants() if p.is_holder]
    assert sorted(p.fencing_token or 0 for p in holders) == tokens
    for lease in leases:
        assert lease is not None
        await lease.release()
        await lease.release()  # idempotent
        assert lease.is_released
    assert [p for p in await sem.participants() if p.is_holder] == []


async def test_never_more_than_max_leases(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    state = {"inside": 0, "max": 0, "done": 0, "waited": 0}
    shared = asyncio.Event()

    async def worker(b: aiolocks.Backend) -> None:
        sem = b.semaphore(name, max_leases=3)
        for _ in range(4):
            async with sem as lease:
                assert isinstance(lease, aiolocks.Lease)
                state["inside"] += 1
                state["max"] = max(state["max"], state["inside"])
                if state["inside"] >= 2:
                    shared.set()
                elif not state["waited"]:
                    # Liveness without timing: the first lone holder stays until a
                    # second one joins (on a loaded machine 2 ms holds may never
                    # overlap); the bound only ends a run where nobody can join.
                    state["waited"] = 1
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(shared.wait(), 60)
                await asyncio.sleep(0.002)
                state["inside"] -= 1
                state["done"] += 1

    await asyncio.gather(*(worker(backend if i % 2 else other_backend) for i in range(10)))
    assert state["max"] <= 3
    assert state["max"] >= 2, "leases should actually be shared"
    assert state["done"] == 40


async def test_acquire_many_all_or_nothing(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    sem = backend.semaphore(names(), max_leases=4)
    first = await sem.acquire_many(3, timeout=1)
    assert first is not None and len(first) == 3
    # every lease of one acquire_many has a fencing token of its own
    tokens = [lease.fencing_token for lease in first]
    assert None not in tokens and len(set(tokens)) == 3
    holders = [p for p in await sem.participants() if p.is_holder]
    assert sorted(p.fencing_token or 0 for p in holders) == sorted(t or 0 for t in tokens)
    assert await sem.acquire_many(2, timeout=0.05) is None
    # nothing partial stayed behind: one lease is still free
    one = await sem.acquire(timeout=0)
    assert one is not None
    await one.release()
    for lease in first:
        await lease.release()
    both = await sem.acquire_many(4, timeout=1)
    assert both is not None and len(both) == 4
    later = [lease.fencing_token or 0 for lease in both]
    assert len(set(later)) == 4 and min(later) > max(t or 0 for t in tokens)
    for lease in both:
        await lease.release()


@pytest.mark.parametrize("n", [0, -1, 5])
async def test_acquire_many_out_of_range(
    backend: aiolocks.Backend, names: Callable[[], str], n: int
) -> None:
    sem = backend.semaphore(names(), max_leases=4)
    with pytest.raises(ValueError, match="max_leases=4"):
        await sem.acquire_many(n)


@pytest.mark.parametrize("bad", [0, -3])
async def test_bad_max_leases(
    backend: aiolocks.Backend, names: Callable[[], str], bad: int
) -> None:
    with pytest.raises(ValueError, match="max_leases"):
        backend.semaphore(names(), max_leases=bad)


async def test_lease_context_timeout(backend: aiolocks.Backend, names: Callable[[], str]) -> None:
    sem = backend.semaphore(names(), max_leases=1)
    async with sem.lease(timeout=1) as lease:
        assert not lease.is_lost

        async def second() -> None:
            async with sem.lease(timeout=0.05):
                pytest.fail("must not get a second lease")

        with pytest.raises(aiolocks.LockTimeoutError):
            await asyncio.create_task(second())
    assert lease.is_released


async def test_leases_are_not_tied_to_tasks(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    sem = backend.semaphore(names(), max_leases=1)
    lease = await asyncio.create_task(sem.acquire())
    assert lease is not None
    await settle(backend)
    assert await sem.acquire(timeout=0) is None, "the lease outlives the task that took it"
    await lease.release()
    again = await sem.acquire(timeout=1)
    assert again is not None
    await again.release()


async def test_fifo_leases(backend: aiolocks.Backend, names: Callable[[], str]) -> None:
    if not backend.capabilities.fair:
        pytest.skip("backend is not fair")
    sem = backend.semaphore(names(), max_leases=2)
    held = await sem.acquire_many(2)
    assert held is not None
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with sem:
            order.append(i)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(waiter(i)))
        if backend.capabilities.queue_visible:
            await wait_queued(sem.participants, 3 + i)
        else:
            await asyncio.sleep(0.05)
    for lease in held:
        await lease.release()
    await asyncio.gather(*tasks)
    assert sorted(order) == list(range(5))
    assert order[:1] == [0]


async def test_cancelled_lease_wait_leaves_nothing(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    sem = backend.semaphore(names(), max_leases=2)
    held = await sem.acquire_many(2)
    assert held is not None
    waiter = asyncio.create_task(sem.acquire_many(2))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    for lease in held:
        await lease.release()
    await settle(backend)
    assert [p for p in await sem.participants() if p.is_holder] == []
    again = await sem.acquire_many(2, timeout=5)
    assert again is not None
    for lease in again:
        await lease.release()
