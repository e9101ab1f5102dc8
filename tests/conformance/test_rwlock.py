"""The read/write lock contract, for every backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import aiolocks

from ..polling import settle
from .conftest import wait_queued

pytestmark = [pytest.mark.asyncio, pytest.mark.primitives("read_write_lock")]


async def test_readers_share_writer_excludes(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    rw = backend.read_write_lock(names())
    assert rw.read.name == rw.write.name == rw.name
    async with rw.read:
        assert await asyncio.create_task(_try(rw.read)) is True
        assert await asyncio.create_task(_try(rw.write)) is False
    async with rw.write:
        assert await asyncio.create_task(_try(rw.read)) is False
        assert await asyncio.create_task(_try(rw.write)) is False


async def _try(lock: aiolocks.Lock) -> bool:
    got = await lock.acquire(timeout=0)
    if got:
        await lock.release()
    return got


async def test_read_to_write_upgrade_is_deadlock(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    rw = backend.read_write_lock(names())
    async with rw.read:
        with pytest.raises(aiolocks.DeadlockError, match="upgrade"):
            await rw.write.acquire()
        with pytest.raises(aiolocks.DeadlockError):
            await rw.write.acquire(timeout=0)
        assert rw.read.is_owned_by_current_task()


async def test_write_to_read_downgrade(backend: aiolocks.Backend, names: Callable[[], str]) -> None:
    rw = backend.read_write_lock(names())
    await rw.write.acquire()
    assert await rw.read.acquire(timeout=1)
    await rw.write.release()
    # now only reading: other readers get in, writers do not
    assert await asyncio.create_task(_try(rw.read)) is True
    assert await asyncio.create_task(_try(rw.write)) is False
    await rw.read.release()
    assert await asyncio.create_task(_try(rw.write)) is True


async def test_downgrade_does_not_let_a_queued_writer_in(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    rw = backend.read_write_lock(name)
    await rw.write.acquire()
    other = other_backend.read_write_lock(name)
    writer_in = asyncio.Event()

    async def queued_writer() -> None:
        async with other.write:
            writer_in.set()

    task = asyncio.create_task(queued_writer())
    if backend.capabilities.queue_visible:
        await wait_queued(rw.write.participants, 2)
    else:
        await asyncio.sleep(0.1)
    assert await rw.read.acquire(timeout=2)
    await rw.write.release()
    await asyncio.sleep(0.1)
    assert not writer_in.is_set(), "a queued writer got in while we still read"
    await rw.read.release()
    await asyncio.wait_for(task, 10)
    assert writer_in.is_set()


async def test_reentrant_halves(backend: aiolocks.Backend, names: Callable[[], str]) -> None:
    rw = backend.read_write_lock(names())
    async with rw.write, rw.write:
        token = rw.write.fencing_token
        async with rw.read, rw.read:
            assert rw.read.fencing_token is not None
            assert rw.read.fencing_token != token
    assert not rw.write.is_owned_by_current_task()
    assert not rw.read.is_owned_by_current_task()


async def test_shared_fencing_sequence(backend: aiolocks.Backend, names: Callable[[], str]) -> None:
    rw = backend.read_write_lock(names())
    tokens = []
    for half in (rw.read, rw.write, rw.read, rw.write):
        async with half:
            assert half.fencing_token is not None
            tokens.append(half.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


async def test_writer_waits_for_readers_then_readers_wait_behind_writer(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    if not backend.capabilities.fair:
        pytest.skip("readers may overtake a waiting writer on an unfair backend")
    rw = backend.read_write_lock(names())
    events: list[str] = []
    await rw.read.acquire()

    async def writer() -> None:
        async with rw.write:
            events.append("write")

    async def late_reader() -> None:
        async with rw.read:
            events.append("late-read")

    w = asyncio.create_task(writer())
    await wait_queued(rw.write.participants, 2)
    r = asyncio.create_task(late_reader())
    await wait_queued(rw.write.participants, 3)
    assert events == []
    await rw.read.release()
    await asyncio.gather(w, r)
    assert events == ["write", "late-read"]


async def test_exclusion_under_load(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    state = {"readers": 0, "writers": 0, "max_readers": 0, "bad": 0, "writes": 0}

    async def reader(b: aiolocks.Backend) -> None:
        rw = b.read_write_lock(name)
        for _ in range(4):
            async with rw.read:
                state["readers"] += 1
                state["max_readers"] = max(state["max_readers"], state["readers"])
                if state["writers"]:
                    state["bad"] += 1
                await asyncio.sleep(0.002)
                state["readers"] -= 1

    async def writer(b: aiolocks.Backend) -> None:
        rw = b.read_write_lock(name)
        for _ in range(3):
            async with rw.write:
                state["writers"] += 1
                if state["writers"] > 1 or state["readers"]:
                    state["bad"] += 1
                await asyncio.sleep(0.002)
                state["writes"] += 1
                state["writers"] -= 1

    await asyncio.gather(
        *(reader(backend if i % 2 else other_backend) for i in range(6)),
        *(writer(other_backend if i % 2 else backend) for i in range(3)),
    )
    assert state["bad"] == 0
    assert state["writes"] == 9
    await settle(backend)
