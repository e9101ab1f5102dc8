"""``backend.count_down_latch()`` (Redisson's RCountDownLatch) on every backend with a store."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import aiolocks

from ..polling import settle
from .cancelling import store_of, sweep

pytestmark = pytest.mark.asyncio


@pytest.fixture
def name() -> str:
    return f"conformance/count-down-{uuid.uuid4().hex[:10]}"


async def test_counts_down_and_wakes_every_waiter(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, name: str
) -> None:
    store_of(backend)
    latch = backend.count_down_latch(name)
    other = other_backend.count_down_latch(name)
    assert await latch.get_count() == 0
    assert await latch.wait(timeout=0), "a latch never set is open"
    assert await latch.try_set_count(3)
    assert not await other.try_set_count(5), "a set latch was set again"
    assert await other.get_count() == 3
    assert not await other.wait(timeout=0)
    assert not await other.wait(timeout=0.1)
    waiters = [asyncio.ensure_future(b.wait()) for b in (latch, other) * 3]
    await other.count_down()
    await latch.count_down()
    assert await latch.get_count() == 1
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters), "a waiter woke before the count reached zero"
    await other.count_down()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 30) == [True] * 6
    assert await latch.get_count() == 0
    await latch.count_down()  # at zero: nothing
    assert await latch.get_count() == 0
    with await store_of(backend).snapshot(f"countdown/{name}") as snap:
        assert snap.records == {}, "an open latch left its record"
    assert await other.try_set_count(1), "an open latch can be set again"
    await latch.count_down()


async def test_concurrent_count_downs_each_count_once(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, name: str
) -> None:
    store_of(backend)
    assert await backend.count_down_latch(name).try_set_count(20)
    latches = [b.count_down_latch(name) for b in (backend, other_backend)]
    await asyncio.gather(*(latches[i % 2].count_down() for i in range(15)))
    assert await latches[0].get_count() == 5
    await asyncio.gather(*(latches[i % 2].count_down() for i in range(5)))
    assert await latches[1].wait(timeout=0)


async def test_a_cancelled_count_down_counts_once_or_not_at_all(
    backend: aiolocks.Backend, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_of(backend)
    expected: dict[int, int] = {}

    async def scenario(run: int) -> None:
        latch = backend.count_down_latch(f"{name}/{run}")
        assert await latch.try_set_count(2)
        expected[run] = 2
        await latch.count_down()
        expected[run] = 1

    async def check(run: int) -> None:
        await settle(backend)
        latch = backend.count_down_latch(f"{name}/{run}")
        count = await latch.get_count()
        # a set sent is a set made (its caller waits for the reply even when cancelled),
        # and a count-down, once begun, counts exactly once
        assert count == (1 if run in expected else 2), (run, count, expected)
        while await latch.get_count():
            await latch.count_down()

    await sweep(backend, monkeypatch, scenario, check)


async def test_bad_arguments(backend: aiolocks.Backend, name: str) -> None:
    store_of(backend)
    latch = backend.count_down_latch(name)
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="count must be an int"):
            await latch.try_set_count(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        await latch.wait(timeout=-1)
    with pytest.raises(aiolocks.InvalidLockNameError):
        backend.count_down_latch("a//b")
