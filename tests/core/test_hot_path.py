"""What the engine's fast path cuts must not change behaviour.

The uncontended acquire/release path skips lookups and allocations (see
"The hot path" in docs/architecture.md); these tests pin the behaviour those
shortcuts must keep: the task lookup, close() waiting for releases in flight,
the shared empty dict of holds, ledgers left empty, the memory store's
grant-at-once path keeping FIFO order and fencing.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import aiolocks
from aiolocks._core import hold as hold_module
from aiolocks._core import tasks as tasks_module
from aiolocks._core.driver import Grant
from aiolocks._core.tasks import running_task, task_of_loop
from aiolocks.testing import lose


def _url() -> str:
    return f"memory://hot-path-{uuid.uuid4().hex[:8]}"


@pytest.mark.asyncio
async def test_running_task_is_asyncio_current_task() -> None:
    seen: list[tuple[object, object, object]] = []

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        seen.append((running_task(), task_of_loop(loop), asyncio.current_task()))

    await asyncio.gather(*(asyncio.create_task(probe()) for _ in range(3)))
    assert len(seen) == 3
    for fast, by_loop, reference in seen:
        assert fast is reference and by_loop is reference and reference is not None
    assert len({id(reference) for _, _, reference in seen}) == 3
    # A callback runs in the loop but outside any task: None, as asyncio says.
    loop = asyncio.get_running_loop()
    outside: asyncio.Future[object] = loop.create_future()
    loop.call_soon(lambda: outside.set_result(running_task()))
    assert await outside is None


@pytest.mark.parametrize("version", [(3, 10, 9), (3, 14, 0), (4, 0, 0)])
def test_untested_python_reads_no_asyncio_internals(version: tuple[int, ...]) -> None:
    """Outside the tested Python range the private dict of tasks is never used."""
    assert tasks_module._private_current_tasks(version) is None


def test_private_dict_only_where_current_task_is_python() -> None:
    found = tasks_module._private_current_tasks()
    if asyncio.current_task.__module__ == "asyncio.tasks":  # Python 3.11
        assert found is getattr(asyncio.tasks, "_current_tasks")  # noqa: B009
    else:  # written in C (3.12+): nothing to gain, the public function is used
        assert found is None
        assert running_task is asyncio.current_task


@pytest.mark.asyncio
async def test_public_api_fallback_finds_the_running_task() -> None:
    """The fallback readers (no private dict) answer exactly like the fast ones."""
    fallback_running = tasks_module._running_task_reader(None)
    fallback_of_loop = tasks_module._task_of_loop_reader(None)
    assert fallback_running is asyncio.current_task
    seen: list[tuple[object, object, object]] = []

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        seen.append((fallback_running(), fallback_of_loop(loop), running_task()))

    await asyncio.gather(*(asyncio.create_task(probe()) for _ in range(3)))
    assert len({id(fast) for _, _, fast in seen}) == 3
    for public, by_loop, fast in seen:
        assert public is fast and by_loop is fast and fast is not None
    loop = asyncio.get_running_loop()
    outside: asyncio.Future[object] = loop.create_future()
    loop.call_soon(lambda: outside.set_result(fallback_of_loop(loop)))
    assert await outside is None


def test_running_task_without_a_loop_is_a_runtime_error() -> None:
    with pytest.raises(RuntimeError):
        running_task()


@pytest.mark.asyncio
async def test_lock_methods_outside_a_task_name_the_method() -> None:
    async with aiolocks.connect(_url()) as backend:
        lock = backend.mutex("outside")
        loop = asyncio.get_running_loop()
        errors: asyncio.Future[BaseException] = loop.create_future()

        def step() -> None:
            coro = lock.acquire()
            try:
                coro.send(None)
            except BaseException as exc:  # the RuntimeError under test
                errors.set_result(exc)

        loop.call_soon(step)
        error = await errors
        assert isinstance(error, RuntimeError)
        assert "Mutex.acquire() must be called from inside an asyncio task" in str(error)


@pytest.mark.asyncio
async def test_close_waits_for_a_release_in_flight() -> None:
    backend = await aiolocks.connect(_url())
    driver: Any = backend._engine.driver
    real_release = driver.release
    sending, finish = asyncio.Event(), asyncio.Event()
    order: list[str] = []

    async def slow_release(grant: Grant) -> bool:
        sending.set()
        await finish.wait()
        order.append("released")
        return bool(await real_release(grant))

    real_close = driver.close

    async def close() -> None:
        order.append("driver closed")
        await real_close()

    driver.release, driver.close = slow_release, close
    lock = backend.mutex("in-flight")

    async def take_and_release() -> None:
        assert await lock.acquire()
        await lock.release()

    releasing = asyncio.create_task(take_and_release())
    await asyncio.wait_for(sending.wait(), 10)
    closing = asyncio.create_task(backend.close())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not closing.done(), "close() must wait for the release being sent"
    assert order == []
    finish.set()
    await asyncio.gather(releasing, closing)
    assert order == ["released", "driver closed"]
    assert backend._engine._releasing == 0 and backend._engine._releases_idle is None


@pytest.mark.asyncio
async def test_the_empty_dict_holds_share_is_never_written() -> None:
    async with aiolocks.connect(_url()) as backend:
        lock = backend.mutex("shared-empty")
        assert await lock.acquire()
        await lock.release()
        async with lock, lock:  # reentrant bodies
            pass
        with pytest.raises(aiolocks.LockLostError):
            async with lock:
                await lose(lock)
                await asyncio.sleep(3600)
        assert await lock.acquire()
        await lose(lock)  # lost with no body running
        with pytest.raises(aiolocks.LockLostError):
            await lock.release()
        assert hold_module._NOTHING == {}
        assert not backend._holds and not backend._ledgers


@pytest.mark.asyncio
async def test_read_write_checks_leave_no_empty_ledger() -> None:
    async with aiolocks.connect(_url()) as backend:
        rw = backend.read_write_lock("ledgers")
        async with rw.read:
            with pytest.raises(aiolocks.DeadlockError):
                await rw.write.acquire(timeout=0)
        async with rw.write, rw.read:  # downgrade
            pass
        assert not backend._ledgers
        assert not backend._holds


@pytest.mark.asyncio
async def test_grant_at_once_keeps_fifo_and_fencing() -> None:
    async with aiolocks.connect(_url()) as backend:
        name = "fifo"
        first = backend.mutex(name)
        assert await first.acquire()
        tokens = [first.fencing_token]
        order: list[int] = []

        async def waiter(number: int) -> None:
            lock = backend.mutex(name)
            async with lock:
                order.append(number)
                tokens.append(lock.fencing_token)

        waiters = []
        for number in range(4):
            waiters.append(asyncio.create_task(waiter(number)))
            for _ in range(3):
                await asyncio.sleep(0)  # queued in this order
        await first.release()
        # A newcomer after the release queues behind the waiters, not ahead.
        late = asyncio.create_task(waiter(99))
        await asyncio.gather(*waiters, late)
        assert order == [0, 1, 2, 3, 99]
        seen = [t for t in tokens if t is not None]
        assert len(seen) == len(tokens) == 6
        assert seen == sorted(seen) and len(set(seen)) == len(seen)
        # Uncontended again: granted at once, token still increasing.
        assert await first.acquire(timeout=0)
        token = first.fencing_token
        assert token is not None and token > seen[-1]
        await first.release()
        assert not backend._ledgers and not backend._holds
