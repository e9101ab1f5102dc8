"""Loss is never silent, on every backend (made with ``aiolocks.testing.lose``).

``async with`` turns a loss into ``LockLostError`` at the block's end; the
explicit pattern (``acquire`` / ``try`` / ``finally: release``) gets it from
``release()``, after the cleanup. ``is_lost`` stays true after a lost hold
ended, until the next successful acquire of that lock object. ``lose()``
gives the hold back on the server first, so another process may take it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import aiolocks
from aiolocks.testing import lose

from ..polling import eventually, settle

pytestmark = pytest.mark.asyncio

#: every kind of exclusive hold; the read/write halves only where the backend has them
LOCK_KINDS = [
    "mutex",
    "semaphore_mutex",
    pytest.param("write", marks=pytest.mark.primitives("read_write_lock")),
    pytest.param("read", marks=pytest.mark.primitives("read_write_lock")),
]


def _lock(backend: aiolocks.Backend, kind: str, name: str) -> aiolocks.Lock:
    if kind in ("read", "write"):
        lock: aiolocks.Lock = getattr(backend.read_write_lock(name), kind)
        return lock
    made: aiolocks.Lock = getattr(backend, kind)(name)
    return made


def _lost(lock: aiolocks.Lock) -> bool:
    """``lock.is_lost``, read anew (mypy would narrow the property between asserts)."""
    return lock.is_lost


@pytest.mark.parametrize("kind", LOCK_KINDS)
async def test_explicit_release_of_a_lost_hold_raises_after_cleanup(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    names: Callable[[], str],
    kind: str,
) -> None:
    name = names()
    lock = _lock(backend, kind, name)
    # a rival that excludes ``lock``: the same kind, or a writer against a reader
    rival = _lock(other_backend, "write" if kind == "read" else kind, name)
    steps: list[str] = []
    with pytest.raises(aiolocks.LockLostError, match="was lost while it was held") as info:
        if await lock.acquire(timeout=10):
            try:
                token = lock.fencing_token
                await lose(lock)
                steps.append("body went on")  # outside async with nothing cancels the body
                assert lock.is_lost
                # the hold is gone on the server: another process takes the lock now
                assert await rival.acquire(timeout=10)
                assert rival.fencing_token is not None and token is not None
                assert rival.fencing_token > token
                await rival.release()
            finally:
                await lock.release()
    assert steps == ["body went on"]
    assert "lose()" in str(info.value)
    assert lock.is_lost, "is_lost must stay true after the lost hold ended"
    assert not lock.is_owned_by_current_task()
    assert lock.fencing_token is None
    with pytest.raises(aiolocks.LockNotOwnedError):
        await lock.release()  # the hold is gone: a second release is a plain misuse
    assert lock.is_lost
    # the next successful acquire of this object clears it
    assert await lock.acquire(timeout=10)
    assert not _lost(lock)
    await lock.release()
    assert not _lost(lock)  # a clean release leaves it false


async def test_a_failed_acquire_does_not_clear_is_lost(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    lock = backend.semaphore_mutex(name)
    assert await lock.acquire(timeout=10)
    await lose(lock)
    with pytest.raises(aiolocks.LockLostError):
        await lock.release()
    rival = other_backend.semaphore_mutex(name)
    assert await rival.acquire(timeout=10)
    try:
        assert not await lock.acquire(timeout=0)
        assert lock.is_lost
    finally:
        await rival.release()


async def test_async_with_body_is_cancelled_and_is_lost_stays_true(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.mutex(names())
    reached_after_sleep = False
    with pytest.raises(aiolocks.LockLostError, match="was lost while the block ran"):
        async with lock.hold(timeout=10):
            await lose(lock)
            await asyncio.sleep(3600)
            reached_after_sleep = True
    assert not reached_after_sleep
    assert lock.is_lost
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    async with lock.hold(timeout=10):
        assert not lock.is_lost


async def test_lose_from_another_task_cancels_the_holder(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    lock = backend.mutex(name)
    entered = asyncio.Event()
    outcome: list[str] = []

    async def job() -> None:
        try:
            async with lock.hold(timeout=10):
                entered.set()
                await asyncio.sleep(3600)
                outcome.append("finished")
        except aiolocks.LockLostError:
            outcome.append("lost")
            outcome.append("sticky" if lock.is_lost else "not sticky")

    worker = asyncio.create_task(job())
    await entered.wait()
    await lose(lock)  # this task does not hold it: every hold of the name in this process
    await worker
    assert outcome == ["lost", "sticky"]
    assert lock.is_lost  # sticky per lock object, whichever task held it
    async with other_backend.mutex(name).hold(timeout=10):
        pass


@pytest.mark.parametrize("cancel_after", [1, 2, 3])
async def test_cancelled_release_of_a_lost_hold_still_cleans_up(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    names: Callable[[], str],
    cancel_after: int,
) -> None:
    """Cancel release() at its first await points: nothing leaks, is_lost stays true."""
    name = names()
    lock = backend.semaphore_mutex(name)  # any task may release it
    assert await lock.acquire(timeout=10)
    await lose(lock)
    releasing = asyncio.create_task(lock.release())
    for _ in range(cancel_after):
        await asyncio.sleep(0)
    releasing.cancel()
    outcome = await asyncio.gather(releasing, return_exceptions=True)
    assert isinstance(outcome[0], (asyncio.CancelledError, aiolocks.LockLostError)), outcome
    assert lock.is_lost
    assert not lock.is_owned_by_current_task()
    await settle(backend)
    assert not backend._holds
    rival = other_backend.semaphore_mutex(name)
    assert await rival.acquire(timeout=10)
    await rival.release()


@pytest.mark.primitives("semaphore")
async def test_lease_explicit_release_raises_once(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    sem = backend.semaphore(name, max_leases=1)
    lease = await sem.acquire(timeout=10)
    assert lease is not None
    await lose(lease)
    assert lease.is_lost
    rival = await other_backend.semaphore(name, max_leases=1).acquire(timeout=10)
    assert rival is not None
    await rival.release()
    with pytest.raises(aiolocks.LockLostError, match="semaphore lease"):
        await lease.release()
    assert lease.is_released and lease.is_lost
    await lease.release()  # idempotent: the loss was reported once


@pytest.mark.primitives("semaphore")
async def test_lease_async_with_raises_lock_lost(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    sem = backend.semaphore(names(), max_leases=2)
    with pytest.raises(aiolocks.LockLostError, match="was lost while the block ran"):
        async with sem.lease(timeout=10) as lease:
            await lose(lease)
            await asyncio.sleep(3600)
    assert lease.is_lost and lease.is_released


async def test_multilock_explicit_release_releases_all_then_raises(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    a, b = backend.mutex(names()), backend.mutex(names())
    multi = aiolocks.MultiLock([a, b])
    assert await multi.acquire(timeout=10)
    await lose(b)
    assert multi.is_lost
    with pytest.raises(aiolocks.LockLostError):
        await multi.release()
    assert not a.is_owned_by_current_task() and not b.is_owned_by_current_task()
    assert b.is_lost and not a.is_lost
    await settle(backend)
    # both are free again
    assert await asyncio.create_task(multi.acquire(timeout=10))


async def test_multilock_async_with_reports_the_loss_once(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    a, b = backend.mutex(names()), backend.mutex(names())
    with pytest.raises(aiolocks.LockLostError, match="MultiLock lost"):
        async with aiolocks.MultiLock([a, b]).hold(timeout=10) as multi:
            await lose(multi)
            await asyncio.sleep(3600)
    assert a.is_lost and b.is_lost
    await eventually(lambda: not backend._holds, what="holds released")


async def test_lose_refuses_what_is_not_held(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    lock = backend.mutex(names())
    with pytest.raises(aiolocks.LockNotOwnedError, match="not held in this process"):
        await lose(lock)
    with pytest.raises(TypeError, match="got str"):
        await lose("locks/x")  # type: ignore[arg-type]
