"""The contract under anyio: task groups, level-triggered cancel scopes, double cancels.

anyio re-delivers a scope's cancellation at every await until the scope
exits, which pierces naive cleanup (an ``await`` in an ``except`` block is
cancelled again at once). These tests run every backend under the anyio
runner (asyncio backend; aiozk and redis.asyncio are asyncio-only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import aiolocks

from ..polling import settle

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _background(backend: aiolocks.Backend) -> int:
    """Background work still running: the backend owns every task (one task set)."""
    return len(backend._tasks)


async def _is_free(backend: aiolocks.Backend, name: str) -> bool:
    async def probe() -> bool:
        lock = backend.mutex(name)
        got = await lock.acquire(timeout=0)
        if got:
            await lock.release()
        return got

    return await asyncio.create_task(probe())


async def test_task_group_exact_counter(backend_url: str, names: Callable[[], str]) -> None:
    name = names()
    state = {"n": 0, "inside": 0, "max": 0}
    async with aiolocks.connect(backend_url) as backend:

        async def worker() -> None:
            lock = backend.mutex(name)
            for _ in range(5):
                async with lock:
                    state["inside"] += 1
                    state["max"] = max(state["max"], state["inside"])
                    n = state["n"]
                    await anyio.sleep(0.001)
                    state["n"] = n + 1
                    state["inside"] -= 1

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(worker)
        assert state == {"n": 50, "inside": 0, "max": 1}
        await settle(backend)
        assert not backend._holds


async def test_fail_after_around_contended_acquire(
    backend_url: str, names: Callable[[], str]
) -> None:
    name = names()
    async with aiolocks.connect(backend_url) as backend:
        holder = backend.mutex(name)
        await holder.acquire()

        async def waiter() -> None:
            with anyio.fail_after(0.2):
                await backend.mutex(name).acquire()

        with pytest.raises(TimeoutError):
            await asyncio.create_task(waiter())
        await settle(backend)
        if backend.capabilities.queue_visible:
            assert [p.is_holder for p in await holder.participants()] == [True]
        await holder.release()
        assert await _is_free(backend, name)
        await settle(backend)


async def test_move_on_after_around_acquire_and_body(
    backend_url: str, names: Callable[[], str]
) -> None:
    name = names()
    async with aiolocks.connect(backend_url) as backend:
        lock = backend.mutex(name)
        body_done = False

        async def scoped() -> None:
            nonlocal body_done
            with anyio.move_on_after(0.2) as scope:
                async with lock:
                    await anyio.sleep(3600)
                    body_done = True
            assert scope.cancelled_caught

        await asyncio.create_task(scoped())
        assert not body_done
        await settle(backend)
        assert await _is_free(backend, name), "the body's scope exit must release"

        holder = backend.mutex(name)
        await holder.acquire()

        async def give_up() -> bool:
            with anyio.move_on_after(0.1):
                return await backend.mutex(name).acquire()
            return False

        assert await asyncio.create_task(give_up()) is False
        await holder.release()
        await settle(backend)
        assert await _is_free(backend, name)


async def test_cancel_scope_many_points_leaves_nothing(
    backend_url: str, names: Callable[[], str]
) -> None:
    name = names()
    async with aiolocks.connect(backend_url) as backend:
        blocker = backend.mutex(name)
        for i in range(12):
            contended = i % 2 == 0
            if contended:
                await blocker.acquire()

            async def attempt(delay: float) -> None:
                with anyio.move_on_after(delay):
                    async with backend.mutex(name):
                        await anyio.sleep(0.002)

            await asyncio.create_task(attempt(0.001 * i))
            if contended:
                await blocker.release()
            await settle(backend)
            assert await _is_free(backend, name)
        await settle(backend)


async def test_second_native_cancel_during_release(
    backend_url: str, names: Callable[[], str]
) -> None:
    name = names()
    async with aiolocks.connect(backend_url) as backend:
        lock = backend.mutex(name)
        inside = anyio.Event()
        releasing = anyio.Event()
        # Hold the driver's release() (a method of the driver contract) open
        # until the second cancel has landed: the engine must finish the
        # release although the caller is cancelled again while it runs.
        target: Any = backend._driver
        real_release = target.release
        proceed = asyncio.Event()

        async def held_release(*args: Any) -> Any:
            releasing.set()
            await proceed.wait()
            return await real_release(*args)

        target.release = held_release
        try:

            async def body() -> None:
                with anyio.CancelScope():
                    async with lock:
                        inside.set()
                        await anyio.sleep(3600)

            task = asyncio.create_task(body())
            await inside.wait()
            task.cancel()  # first native cancel: the body ends, release starts
            await releasing.wait()
            task.cancel()  # second native cancel lands during the release
            proceed.set()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            proceed.set()
            target.release = real_release
        await settle(backend)
        assert await _is_free(backend, name), "release must complete despite two cancels"


@pytest.mark.primitives("semaphore")
async def test_semaphore_in_task_group_with_fail_after(
    backend_url: str, names: Callable[[], str]
) -> None:
    name = names()
    state = {"inside": 0, "max": 0, "timeouts": 0, "done": 0}
    async with aiolocks.connect(backend_url) as backend:
        sem = backend.semaphore(name, max_leases=2)

        async def worker() -> None:
            try:
                with anyio.fail_after(0.05):
                    lease = await sem.acquire()
            except TimeoutError:
                state["timeouts"] += 1
                return
            assert lease is not None
            async with lease:
                state["inside"] += 1
                state["max"] = max(state["max"], state["inside"])
                await anyio.sleep(0.02)
                state["inside"] -= 1
                state["done"] += 1

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(worker)
        assert state["max"] <= 2
        assert state["done"] + state["timeouts"] == 12
        assert state["timeouts"] > 0
        await settle(backend)
        leases = await sem.acquire_many(2, timeout=5)
        assert leases is not None
        for lease in leases:
            await lease.release()
