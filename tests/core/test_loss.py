"""Loss handling in the core: cancel the body, raise LockLostError, like asyncio.timeout().

The memory backend cannot lose a hold by itself, so these tests report a
loss the way a driver does (``Grant.mark_lost``). The server backends test
real losses (session expiry, lease lapse) in their own suites.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import pytest_asyncio

import aiolocks
from aiolocks._core.hold import Hold

pytestmark = pytest.mark.asyncio


def grant_of(lock: aiolocks.Lock) -> Hold:
    hold = lock._current_hold()
    assert hold is not None
    return hold


@pytest_asyncio.fixture
async def backend() -> aiolocks.Backend:
    return await aiolocks.connect("memory://core-loss")


async def test_loss_cancels_body_and_raises(
    backend: aiolocks.Backend, caplog: pytest.LogCaptureFixture
) -> None:
    lock = backend.mutex("loss/basic")
    reached = False
    with (
        caplog.at_level(logging.WARNING, logger="aiolocks"),
        pytest.raises(aiolocks.LockLostError, match="was lost while the block ran") as info,
    ):
        async with lock:
            grant_of(lock).grant.mark_lost("test: session expired")
            assert lock.is_lost
            await asyncio.sleep(3600)
            reached = True
    assert not reached
    assert isinstance(info.value.__cause__, asyncio.CancelledError)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert any("lost its hold" in r.getMessage() for r in caplog.records)
    # the lock is free again and the task keeps working (no stray cancellation)
    await asyncio.sleep(0.01)
    assert await asyncio.create_task(lock.acquire(timeout=0))
    await backend.close()


async def test_loss_after_last_await_raises_without_stray_cancel(
    backend: aiolocks.Backend,
) -> None:
    lock = backend.mutex("loss/no-await")
    with pytest.raises(aiolocks.LockLostError):
        async with lock:
            grant_of(lock).grant.mark_lost("test")
            # no await: the cancellation is still pending when the block ends
    # a pending cancellation would explode here
    await asyncio.sleep(0)
    await asyncio.sleep(0.001)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await backend.close()


async def test_external_cancel_wins_over_loss(backend: aiolocks.Backend) -> None:
    lock = backend.mutex("loss/external")

    async def body() -> None:
        async with lock:
            grant_of(lock).grant.mark_lost("test")
            asyncio.current_task().cancel()  # type: ignore[union-attr]  # somebody else, too
            await asyncio.sleep(3600)

    task = asyncio.create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    await backend.close()


async def test_asyncio_timeout_around_lost_body(backend: aiolocks.Backend) -> None:
    lock = backend.mutex("loss/timeout")
    with pytest.raises(aiolocks.LockLostError):
        async with asyncio.timeout(10), lock:
            grant_of(lock).grant.mark_lost("test")
            await asyncio.sleep(3600)
    # and a timeout that fires stays a TimeoutError
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01), lock:
            await asyncio.sleep(3600)
    assert await asyncio.create_task(lock.acquire(timeout=0))
    await backend.close()


async def test_nested_reentrant_bodies(backend: aiolocks.Backend) -> None:
    lock = backend.mutex("loss/nested")
    outer_error: BaseException | None = None
    try:
        async with lock:
            try:
                async with lock:
                    grant_of(lock).grant.mark_lost("test")
                    await asyncio.sleep(3600)
            except aiolocks.LockLostError:
                pass
            # re-entry into a lost hold is refused
            with pytest.raises(aiolocks.LockLostError, match="release it"):
                await lock.acquire()
    except aiolocks.LockLostError as exc:
        outer_error = exc
    assert outer_error is not None
    assert not lock.is_owned_by_current_task()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0.001)
    await backend.close()


async def test_manual_release_after_loss_cleans_up_then_raises(
    backend: aiolocks.Backend,
) -> None:
    lock = backend.mutex("loss/manual")
    await lock.acquire()
    grant_of(lock).grant.mark_lost("test")
    assert lock.is_lost
    await asyncio.sleep(0.001)  # not inside async with: nothing is cancelled
    with pytest.raises(aiolocks.LockLostError, match=r"lost while it was held \(test;"):
        await lock.release()
    assert not lock.is_owned_by_current_task()
    assert not backend._holds
    assert lock.is_lost
    await backend.close()


async def test_reentrant_release_of_a_lost_hold_raises_once(
    backend: aiolocks.Backend,
) -> None:
    lock = backend.mutex("loss/manual-reentrant")
    await lock.acquire()
    await lock.acquire()
    grant_of(lock).grant.mark_lost("test")
    with pytest.raises(aiolocks.LockLostError):
        await lock.release()  # inner level: still owned afterwards
    assert lock.is_owned_by_current_task() and lock.is_lost
    await lock.release()  # the loss of this hold was reported already
    assert not lock.is_owned_by_current_task() and lock.is_lost
    assert not backend._holds
    # a later hold that is lost is reported again
    await lock.acquire()
    grant_of(lock).grant.mark_lost("test again")
    with pytest.raises(aiolocks.LockLostError, match="test again"):
        await lock.release()
    await backend.close()


async def test_loss_raised_by_a_reentrant_block_is_not_raised_again_at_release(
    backend: aiolocks.Backend,
) -> None:
    """acquire / async with lock.hold() / release (``aiolocks run`` does this): one error."""
    lock = backend.mutex("loss/reentrant-block")
    assert await lock.acquire(timeout=0)
    try:
        with pytest.raises(aiolocks.LockLostError, match="while the block ran"):
            async with lock.hold():
                grant_of(lock).grant.mark_lost("test")
                await asyncio.sleep(3600)
    finally:
        await lock.release()
    assert lock.is_lost and not backend._holds
    await backend.close()


async def test_multilock_components_lost_together_raise_lock_lost(
    backend: aiolocks.Backend,
) -> None:
    """One session expiry marks every component lost: one LockLostError, no stray cancel."""
    a, b = backend.mutex("loss/together-a"), backend.mutex("loss/together-b")
    with pytest.raises(aiolocks.LockLostError, match="MultiLock lost"):
        async with aiolocks.MultiLock([a, b]):
            for lock in (a, b):
                grant_of(lock).grant.mark_lost("test: session expired")
            await asyncio.sleep(3600)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    # a real cancellation still wins over the loss
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(asyncio.CancelledError):
        async with aiolocks.MultiLock([a, b]):
            for lock in (a, b):
                grant_of(lock).grant.mark_lost("test: session expired")
            task.cancel()
            await asyncio.sleep(3600)
    assert task.uncancel() == 0
    await backend.close()


async def test_lease_and_multilock_loss(backend: aiolocks.Backend) -> None:
    sem = backend.semaphore("loss/sem", max_leases=2)
    with pytest.raises(aiolocks.LockLostError):
        async with sem as lease:
            lease._hold.grant.mark_lost("test")
            await asyncio.sleep(3600)
    assert lease.is_lost and lease.is_released
    a, b = backend.mutex("loss/a"), backend.mutex("loss/b")
    with pytest.raises(aiolocks.LockLostError, match="MultiLock lost"):
        async with aiolocks.MultiLock([a, b]):
            grant_of(b).grant.mark_lost("test")
            await asyncio.sleep(3600)
    assert not a.is_owned_by_current_task() and not b.is_owned_by_current_task()
    assert await asyncio.create_task(a.acquire(timeout=0))
    await backend.close()


async def test_leader_loses_and_requeues(backend: aiolocks.Backend) -> None:
    first = backend.leader_latch("loss/leader", participant_id="a")
    second = backend.leader_latch("loss/leader", participant_id="b")
    await first.start()
    assert await first.wait_for_leadership(5)
    await second.start()
    hold = first._hold
    assert hold is not None
    hold.grant.mark_lost("test: lease lapsed")
    assert not first.has_leadership
    assert await second.wait_for_leadership(5)
    leader = await first.leader()
    assert leader is not None and leader.id == "b"
    await second.close()
    assert await first.wait_for_leadership(5), "the latch queued again after its loss"
    await first.close()
    await backend.close()


async def test_grant_expired_before_the_block_starts(backend: aiolocks.Backend) -> None:
    """A grant whose lease ran out before the body began (loop blocked) is refused."""
    import time

    real = backend._driver.try_once

    async def stale(*args: object, **kwargs: object) -> object:
        grants = await real(*args, **kwargs)
        for grant in grants or []:
            grant.valid_until = time.monotonic() - 1  # as if the loop had stalled
        return grants

    backend._driver.try_once = stale
    lock = backend.mutex("loss/stale")
    entered = False
    with pytest.raises(aiolocks.LockLostError, match="before the block could start"):
        async with lock:
            entered = True
    assert not entered
    assert not lock.is_owned_by_current_task()
    with pytest.raises(aiolocks.LockLostError, match="before the block could start"):
        async with backend.semaphore("loss/stale-sem", 1):
            entered = True
    assert not entered
    backend._driver.try_once = real
    assert await asyncio.create_task(lock.acquire(timeout=0))
    await backend.close()


async def test_blocked_loop_during_body_is_reported_at_exit(backend: aiolocks.Backend) -> None:
    import time

    lock = backend.mutex("loss/blocked")
    with pytest.raises(aiolocks.LockLostError, match="event loop blocked"):
        async with lock:
            hold = lock._current_hold()
            assert hold is not None
            hold.grant.valid_until = time.monotonic() + 0.05
            time.sleep(0.1)
    assert await asyncio.create_task(lock.acquire(timeout=0))
    await backend.close()
