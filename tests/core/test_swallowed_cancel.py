"""A cancellation that a client library swallows inside a try still cancels the acquire."""

from __future__ import annotations

import asyncio

import anyio
import pytest

import aiolocks
from aiolocks._core.driver import Attempt, Grant

pytestmark = pytest.mark.asyncio


async def _swallow_once(swallowed: list[int], inside: asyncio.Event) -> None:
    """Where the cancel lands; swallowed as a misbehaving client library does.

    (redis-py's cluster client was seen to: the error is gone, the task is
    still cancelling.)
    """
    if not swallowed:
        inside.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            swallowed.append(1)


def _swallow_in(
    backend: aiolocks.Backend, step: str, swallowed: list[int], inside: asyncio.Event
) -> None:
    """Make the driver's ``step`` swallow the first cancellation that lands in it."""
    driver = backend._engine.driver
    real_try, real_wait = driver.try_once, driver.wait_for_change

    async def try_once(attempt: Attempt) -> list[Grant] | None:
        await _swallow_once(swallowed, inside)
        return await real_try(attempt)

    async def wait_for_change(attempt: Attempt, bound: float | None) -> None:
        if not swallowed:
            await _swallow_once(swallowed, inside)
            return  # returning early is allowed; the engine tries again
        await real_wait(attempt, bound)

    if step == "try_once":
        driver.try_once = try_once  # type: ignore[method-assign]
    else:
        driver.wait_for_change = wait_for_change  # type: ignore[method-assign]


@pytest.mark.parametrize("step", ["try_once", "wait_for_change"])
async def test_a_cancellation_swallowed_by_a_driver_step_still_cancels_the_acquire(
    step: str,
) -> None:
    backend = await aiolocks.connect(f"memory://core-swallowed-cancel-{step}")
    inside = asyncio.Event()
    swallowed: list[int] = []
    holder = backend.mutex("swallow")
    assert await holder.acquire()
    _swallow_in(backend, step, swallowed, inside)
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


@pytest.mark.parametrize("step", ["try_once", "wait_for_change"])
async def test_a_swallowed_cancellation_of_an_anyio_scope_ends_the_scope_only(step: str) -> None:
    """``anyio.move_on_after`` around the acquire: the scope catches the cancellation.

    anyio's scopes catch only a cancellation that carries their message; the
    one a client library swallowed is raised again through them, not as a
    message-less error that would escape the scope and cancel the whole task.
    """
    backend = await aiolocks.connect(f"memory://core-swallowed-anyio-{step}")
    inside = asyncio.Event()
    swallowed: list[int] = []
    release = asyncio.Event()
    holding = asyncio.Event()

    async def hold() -> None:
        async with backend.mutex("swallow"):
            holding.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    await holding.wait()
    _swallow_in(backend, step, swallowed, inside)
    acquired = False
    try:
        with anyio.move_on_after(0.05) as scope:
            acquired = await backend.mutex("swallow").acquire()
        assert swallowed == [1]
        assert scope.cancelled_caught
        assert not acquired
        participants = await backend.mutex("swallow").participants()
        assert [p.is_holder for p in participants] == [True]
    finally:
        release.set()
        await holder
        await backend.close()
