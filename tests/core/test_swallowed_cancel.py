"""A cancellation that a client library swallows inside a try still cancels the acquire."""

from __future__ import annotations

import asyncio

import pytest

import aiolocks
from aiolocks._core.driver import Attempt, Grant

pytestmark = pytest.mark.asyncio


async def test_a_cancellation_swallowed_during_a_try_still_cancels_the_acquire() -> None:
    backend = await aiolocks.connect("memory://core-swallowed-cancel")
    driver = backend._engine.driver
    real = driver.try_once
    inside = asyncio.Event()
    swallowed: list[int] = []

    async def try_once(attempt: Attempt) -> list[Grant] | None:
        if not swallowed:
            inside.set()
            try:
                await asyncio.sleep(5)  # where the cancel lands
            except asyncio.CancelledError:
                # what a misbehaving client library does (redis-py's cluster
                # client was seen to): the error is gone, the task still cancelling
                swallowed.append(1)
        return await real(attempt)

    holder = backend.mutex("swallow")
    assert await holder.acquire()
    driver.try_once = try_once  # type: ignore[method-assign]
    waiter = asyncio.create_task(backend.mutex("swallow").acquire())
    await inside.wait()
    waiter.cancel()
    # not `asyncio.timeout` around `await waiter`: its own cancel would pass for the result
    await asyncio.wait({waiter}, timeout=10)
    try:
        assert swallowed == [1]
        assert waiter.done(), "the acquire went on waiting after it was cancelled"
        assert waiter.cancelled()
        participants = await holder.participants()
        assert [p.is_holder for p in participants] == [True]
        await holder.release()
        assert await backend.mutex("swallow").acquire(timeout=0)
    finally:
        waiter.cancel()
        await backend.close()
