"""The lock contract (Mutex, SemaphoreMutex), for every backend."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

import aiolocks

from ..polling import settle
from .conftest import wait_queued

pytestmark = pytest.mark.asyncio


async def in_task(coro: object) -> object:
    """Run ``coro`` in another task (another owner) and return its result."""
    return await asyncio.create_task(coro)  # type: ignore[arg-type]


async def test_acquire_release_and_state(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.mutex(names())
    assert lock.fencing_token is None
    assert not lock.is_owned_by_current_task()
    assert await lock.acquire() is True
    assert lock.is_owned_by_current_task()
    assert lock.is_acquired_in_this_process()
    assert isinstance(_token(lock), int)
    assert not lock.is_lost
    holders = [p for p in await lock.participants() if p.is_holder]
    assert len(holders) == 1
    assert holders[0].fencing_token == lock.fencing_token
    await lock.release()
    assert not lock.is_owned_by_current_task()
    assert not lock.is_acquired_in_this_process()
    assert lock.fencing_token is None
    assert [p for p in await lock.participants() if p.is_holder] == []


def _token(lock: aiolocks.Lock) -> int | None:
    return lock.fencing_token


async def test_name_is_kept_and_leading_slash_is_same_lock(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    plain, slashed = backend.mutex(name), backend.mutex("/" + name)
    assert slashed.name == "/" + name
    async with plain:
        assert await in_task(slashed.acquire(timeout=0)) is False


async def test_reentrant_per_task(backend: aiolocks.Backend, names: Callable[[], str]) -> None:
    lock = backend.mutex(names())
    # Every acquire that reaches the engine (and so the server) ends in one
    # event: acquired, timeout or cancelled. Re-entry must produce none.
    events: list[aiolocks.LockEvent] = []
    backend.add_event_hook(events.append)
    try:
        assert await lock.acquire()
        token = lock.fencing_token
        assert await lock.acquire(timeout=0)
        async with lock:
            assert lock.fencing_token == token
        attempts = [e.kind for e in events if e.kind in ("acquired", "timeout", "cancelled")]
        assert attempts == ["acquired"], "re-entry must not reach the server"
        await lock.release()
        # still held once: another task cannot take it
        assert await in_task(backend.mutex(lock.name).acquire(timeout=0)) is False
        await lock.release()
        assert not lock.is_owned_by_current_task()
    finally:
        backend.remove_event_hook(events.append)


async def test_two_objects_same_name_share_task_ownership(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    first, second = backend.mutex(name), backend.mutex(name)
    async with first:
        # the same task re-enters through another object instead of deadlocking
        assert await second.acquire(timeout=0)
        assert second.is_owned_by_current_task()
        await second.release()


async def test_other_task_is_excluded(backend: aiolocks.Backend, names: Callable[[], str]) -> None:
    lock = backend.mutex(names())
    async with lock:
        assert await in_task(lock.acquire(timeout=0)) is False
        assert await in_task(lock.acquire(timeout=0.05)) is False
        assert not await in_task(_owned(lock))


async def _owned(lock: aiolocks.Lock) -> bool:
    return lock.is_owned_by_current_task()


async def test_release_by_non_owner_raises(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.mutex(names())
    with pytest.raises(aiolocks.LockNotOwnedError, match="not held by the current task"):
        await lock.release()
    async with lock:
        with pytest.raises(aiolocks.LockNotOwnedError):
            await in_task(lock.release())
        assert lock.is_owned_by_current_task()
    with pytest.raises(RuntimeError):  # LockNotOwnedError is also a RuntimeError
        await lock.release()


async def test_timeouts(backend: aiolocks.Backend, names: Callable[[], str]) -> None:
    lock = backend.mutex(names())
    async with lock:
        assert await in_task(lock.acquire(timeout=0)) is False
        assert await in_task(lock.acquire(timeout=0.1)) is False

        async def hold_briefly() -> None:
            async with lock.hold(timeout=0.1):
                pytest.fail("the body must not run")

        with pytest.raises(aiolocks.LockTimeoutError, match="not acquired within"):
            await in_task(hold_briefly())
        with pytest.raises(TimeoutError):
            await in_task(hold_briefly())
    # free again: timeout=0 succeeds
    assert await lock.acquire(timeout=0)
    await lock.release()


@pytest.mark.parametrize("bad", [-1, -0.001, float("nan")])
async def test_bad_timeout_is_value_error(
    backend: aiolocks.Backend, names: Callable[[], str], bad: float
) -> None:
    lock = backend.mutex(names())
    with pytest.raises(ValueError, match="timeout"):
        await lock.acquire(timeout=bad)
    with pytest.raises(ValueError, match="timeout"):
        lock.hold(timeout=bad)
    assert not lock.is_owned_by_current_task()


@pytest.mark.parametrize("bad", ["1", True, [1]])
async def test_timeout_of_wrong_type(
    backend: aiolocks.Backend, names: Callable[[], str], bad: object
) -> None:
    with pytest.raises(TypeError, match="timeout"):
        await backend.mutex(names()).acquire(timeout=bad)  # type: ignore[arg-type]


async def test_infinite_timeout_means_wait(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.mutex(names())
    assert await lock.acquire(timeout=float("inf"))
    await lock.release()


@pytest.mark.parametrize(
    "bad",
    [
        *("", "/", "a//b", "a/", "a/./b", "../a", "a/.."),
        *("a\x00b", "a\nb", "a\x7fb", "a\x85b", "é" * 600),
    ],
)
async def test_invalid_names(backend: aiolocks.Backend, bad: str) -> None:
    for factory in (
        backend.mutex,
        backend.semaphore_mutex,
        backend.read_write_lock,
        backend.leader_latch,
    ):
        with pytest.raises(aiolocks.InvalidLockNameError):
            factory(bad)
    with pytest.raises(ValueError, match="lock name"):
        backend.semaphore(bad, 2)


async def test_unicode_and_long_names_work(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    for name in (names() + "/zamówienie-ß-東京", names() + "/" + "x" * 900):
        lock = backend.mutex(name)
        async with lock:
            assert lock.is_owned_by_current_task()


async def test_fencing_tokens_strictly_increase(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    tokens: list[int] = []
    for i in range(6):
        lock = (backend if i % 2 else other_backend).mutex(name)

        async def take(lock: aiolocks.Mutex = lock) -> int:
            async with lock:
                assert lock.fencing_token is not None
                return lock.fencing_token

        tokens.append(await in_task(take()))  # type: ignore[arg-type]
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


async def test_fifo_order(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    if not backend.capabilities.fair:
        pytest.skip("backend is not fair")
    name = names()
    holder = backend.mutex(name)
    order: list[int] = []
    await holder.acquire()

    async def waiter(i: int) -> None:
        lock = (backend if i % 2 else other_backend).mutex(name)
        async with lock:
            order.append(i)

    tasks = []
    for i in range(8):
        tasks.append(asyncio.create_task(waiter(i)))
        await wait_queued(holder.participants, i + 2)
    await holder.release()
    await asyncio.gather(*tasks)
    assert order == list(range(8))


async def test_participants_show_holder_first_then_waiters(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    if not backend.capabilities.queue_visible:
        pytest.skip("backend does not show waiters")
    lock = backend.mutex(names())
    await lock.acquire()
    waiter = asyncio.create_task(lock.acquire())
    await wait_queued(lock.participants, 2)
    listed = await lock.participants()
    assert [p.is_holder for p in listed] == [True, False]
    assert listed[0].fencing_token == lock.fencing_token
    await lock.release()
    assert await waiter is True
    # the waiter task owns it now; it ended while holding, so it is released
    await settle(backend)
    assert await lock.acquire(timeout=5)
    await lock.release()


async def test_mutual_exclusion_exact_counter(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    state = {"counter": 0, "inside": 0, "max_inside": 0}
    tokens: list[int] = []

    async def worker(b: aiolocks.Backend) -> None:
        lock = b.mutex(name)
        for _ in range(5):
            async with lock:
                state["inside"] += 1
                state["max_inside"] = max(state["max_inside"], state["inside"])
                value = state["counter"]
                await asyncio.sleep(0)
                await asyncio.sleep(0.001)
                state["counter"] = value + 1
                assert lock.fencing_token is not None
                tokens.append(lock.fencing_token)
                state["inside"] -= 1

    await asyncio.gather(*(worker(backend if i % 2 else other_backend) for i in range(12)))
    assert state["counter"] == 60
    assert state["max_inside"] == 1
    assert tokens == sorted(tokens) and len(set(tokens)) == 60


async def test_async_with_binds_lock_and_releases_on_error(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.mutex(names())
    with pytest.raises(ZeroDivisionError):
        async with lock as bound:
            assert bound is lock
            1 / 0  # noqa: B018
    assert not lock.is_owned_by_current_task()
    async with lock.hold(timeout=1) as bound2:
        assert bound2 is lock
    assert await in_task(lock.acquire(timeout=0)) is True


async def test_task_ending_while_holding_releases_and_warns(
    backend: aiolocks.Backend, names: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    lock = backend.mutex(names())

    async def forgetful() -> None:
        await lock.acquire()

    with caplog.at_level(logging.WARNING, logger="aiolocks"):
        await in_task(forgetful())
        await settle(backend)
    assert any("ended while holding" in r.getMessage() for r in caplog.records)
    assert await lock.acquire(timeout=5)
    await lock.release()


async def test_release_completes_when_cancelled(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.mutex(names())
    entered = asyncio.Event()

    async def holder() -> None:
        async with lock:
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(holder())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle(backend)
    assert await lock.acquire(timeout=5), "a cancelled body must still release"
    await lock.release()


async def test_cancel_waiting_acquire_leaves_nothing(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.mutex(names())
    await lock.acquire()
    waiter = asyncio.create_task(in_task(lock.acquire()))
    if backend.capabilities.queue_visible:
        await wait_queued(lock.participants, 2)
    else:
        await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await settle(backend)
    listed = await lock.participants()
    assert [p.is_holder for p in listed] == [True]
    await lock.release()
    assert await in_task(lock.acquire(timeout=5)) is True
    await settle(backend)


@pytest.mark.parametrize("contended", [False, True])
async def test_cancel_at_every_step_of_acquire(
    backend: aiolocks.Backend, names: Callable[[], str], contended: bool
) -> None:
    """Cancel after k loop iterations for growing k: nothing may stay held."""
    name = names()
    blocker = backend.mutex(name)
    outcomes = {"cancelled": 0, "acquired": 0}
    for k in range(0, 40, 2 if contended else 1):
        if contended:
            await blocker.acquire()
        lock = backend.mutex(name)
        result: list[bool] = []

        async def attempt(lock: aiolocks.Mutex = lock, result: list[bool] = result) -> None:
            got = await lock.acquire()
            result.append(got)
            await lock.release()

        task = asyncio.create_task(attempt())
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            outcomes["cancelled"] += 1
        else:
            outcomes["acquired"] += 1
        if contended:
            await blocker.release()
        await settle(backend)
        # whatever happened, the lock is free again for anybody
        assert await in_task(backend.mutex(name).acquire(timeout=5)) is True
        await settle(backend)
        assert [p for p in await blocker.participants() if p.is_holder] == []
    assert outcomes["cancelled"] > 0


async def test_semaphore_mutex_is_not_reentrant(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.semaphore_mutex(names())
    assert await lock.acquire()
    with pytest.raises(aiolocks.DeadlockError):
        await lock.acquire()
    with pytest.raises(aiolocks.DeadlockError):
        await lock.acquire(timeout=0)
    with pytest.raises(aiolocks.DeadlockError):
        await backend.semaphore_mutex(lock.name).acquire(timeout=0)
    assert lock.is_owned_by_current_task()
    await lock.release()
    with pytest.raises(aiolocks.LockNotOwnedError):
        await lock.release()


async def test_semaphore_mutex_released_by_another_task_and_outlives_its_task(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.semaphore_mutex(names())

    async def take() -> None:
        assert await lock.acquire()

    await in_task(take())
    await settle(backend)
    # the acquiring task ended: the hold stays (lease semantics)
    assert await in_task(backend.semaphore_mutex(lock.name).acquire(timeout=0)) is False
    assert lock.is_acquired_in_this_process()
    await lock.release()  # by another task
    other = backend.semaphore_mutex(lock.name)
    assert await other.acquire(timeout=5)
    await other.release()


async def test_semaphore_mutex_excludes(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.semaphore_mutex(names())
    state = {"inside": 0, "max": 0, "n": 0}

    async def worker() -> None:
        for _ in range(4):
            async with lock:
                state["inside"] += 1
                state["max"] = max(state["max"], state["inside"])
                n = state["n"]
                await asyncio.sleep(0.001)
                state["n"] = n + 1
                state["inside"] -= 1

    await asyncio.gather(*(worker() for _ in range(6)))
    assert state == {"inside": 0, "max": 1, "n": 24}


async def test_closing_backend_loses_running_holds(
    backend_url: str, names: Callable[[], str]
) -> None:
    backend = await aiolocks.connect(backend_url)
    lock = backend.mutex(names())
    entered = asyncio.Event()
    reached_end = False

    async def body() -> None:
        nonlocal reached_end
        async with lock:
            entered.set()
            await asyncio.sleep(3600)
            reached_end = True

    task = asyncio.create_task(body())
    await entered.wait()
    await backend.close()
    with pytest.raises(aiolocks.LockLostError):
        await task
    assert not reached_end
    with pytest.raises(aiolocks.BackendUnavailableError, match="closed"):
        await backend.mutex(names()).acquire()
    await backend.close()  # idempotent
