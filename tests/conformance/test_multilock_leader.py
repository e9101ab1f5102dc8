"""MultiLock and LeaderLatch contracts, for every backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import aiolocks

from ..polling import eventually, settle

pytestmark = pytest.mark.asyncio


async def test_multilock_all_or_nothing(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    a, b, c = names(), names(), names()
    blocker = backend.mutex(b)

    async def block() -> None:
        await blocker.acquire()

    # another task holds b (a SemaphoreMutex-like hold by a live task)
    holder_ready = asyncio.Event()
    release_now = asyncio.Event()

    async def holder() -> None:
        await block()
        holder_ready.set()
        await release_now.wait()
        await blocker.release()

    holding = asyncio.create_task(holder())
    await holder_ready.wait()
    multi = aiolocks.MultiLock([backend.mutex(c), backend.mutex(a), backend.mutex(b)])
    assert [lock.name for lock in multi.locks] == sorted([a, b, c])
    assert await multi.acquire(timeout=0.1) is False
    # nothing taken stayed held
    for name in (a, c):
        assert await asyncio.create_task(_free(backend, name))
    with pytest.raises(aiolocks.LockTimeoutError, match="MultiLock"):
        async with multi.hold(timeout=0.05):
            pytest.fail("must not enter")
    release_now.set()
    await holding
    async with multi.hold(timeout=5):
        assert multi.is_owned_by_current_task()
        for name in (a, b, c):
            assert not await asyncio.create_task(_free(backend, name))
    for name in (a, b, c):
        assert await asyncio.create_task(_free(backend, name))


async def _free(backend: aiolocks.Backend, name: str) -> bool:
    lock = backend.mutex(name)
    got = await lock.acquire(timeout=0)
    if got:
        await lock.release()
    return got


async def test_multilock_opposite_orders_do_not_deadlock(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    a, b = names(), names()
    done = 0

    async def worker(first: str, second: str, bk: aiolocks.Backend) -> None:
        nonlocal done
        multi = aiolocks.MultiLock([bk.mutex(first), bk.mutex(second)])
        for _ in range(5):
            async with multi.hold(timeout=20):
                await asyncio.sleep(0.001)
                done += 1

    await asyncio.wait_for(
        asyncio.gather(worker(a, b, backend), worker(b, a, backend), worker(b, a, other_backend)),
        60,
    )
    assert done == 15


async def test_multilock_cancel_rolls_back(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    a, b = names(), names()
    blocker = backend.mutex(b)
    taken, release_now = asyncio.Event(), asyncio.Event()

    async def hold_b() -> None:
        async with blocker:
            taken.set()
            await release_now.wait()

    holding = asyncio.create_task(hold_b())
    await taken.wait()
    multi = aiolocks.MultiLock([backend.mutex(a), backend.mutex(b)])
    task = asyncio.create_task(multi.acquire())
    await eventually(lambda: backend.mutex(a).is_acquired_in_this_process(), what="a taken")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle(backend)
    assert await asyncio.create_task(_free(backend, a)), "a must be released on cancel"
    release_now.set()
    await holding


async def test_multilock_release_releases_all_then_raises_first(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    locks = [backend.mutex(names()) for _ in range(3)]
    multi = aiolocks.MultiLock(locks)
    assert await multi.acquire()
    await locks[1].release()  # misuse: one component released behind its back
    with pytest.raises(aiolocks.LockNotOwnedError):
        await multi.release()
    assert not any(lock.is_owned_by_current_task() for lock in locks)


async def test_multilock_rejects_bad_input(backend: aiolocks.Backend) -> None:
    with pytest.raises(ValueError, match="at least one"):
        aiolocks.MultiLock([])
    lock = backend.mutex("x/y")
    with pytest.raises(ValueError, match="twice"):
        aiolocks.MultiLock([lock, lock])
    with pytest.raises(TypeError):
        aiolocks.MultiLock(["x/y"])  # type: ignore[list-item]


async def test_leader_latch_one_leader_and_handover(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    first = backend.leader_latch(name, participant_id="host-a")
    assert await first.leader() is None
    second = other_backend.leader_latch(name, participant_id="host-b")
    async with first:
        assert await first.wait_for_leadership(timeout=10)
        assert first.has_leadership
        assert isinstance(first.fencing_token, int)
        await second.start()
        assert await second.wait_for_leadership(timeout=0.2) is False
        assert not second.has_leadership, "a newcomer must not pre-empt a live leader"
        leader = await second.leader()
        assert leader is not None and leader.id == "host-a" and leader.is_holder
    # first closed: second takes over
    assert await second.wait_for_leadership(timeout=10)
    leader = await second.leader()
    assert leader is not None and leader.id == "host-b"
    await second.close()
    await second.close()  # idempotent
    assert not second.has_leadership


async def test_leader_latch_exactly_one_among_many(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    name = names()
    latches = [
        (backend if i % 2 else other_backend).leader_latch(name, participant_id=f"p{i}")
        for i in range(5)
    ]
    for latch in latches:
        await latch.start()
    seen: list[str] = []
    for _ in range(5):
        await eventually(lambda: sum(latch.has_leadership for latch in latches) == 1, what="leader")
        leaders = [latch for latch in latches if latch.has_leadership]
        assert len(leaders) == 1
        seen.append(leaders[0].participant_id)
        await leaders[0].close()
        latches.remove(leaders[0])
        if not latches:
            break
    assert len(set(seen)) == 5


async def test_leader_latch_defaults_and_errors(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    a, b = backend.leader_latch(names()), backend.leader_latch(names())
    assert a.participant_id != b.participant_id and len(a.participant_id) >= 32
    with pytest.raises(RuntimeError, match="not started"):
        await a.wait_for_leadership(0)
    with pytest.raises(ValueError, match="participant_id"):
        backend.leader_latch(names(), participant_id="")
    await a.start()
    with pytest.raises(RuntimeError, match="already"):
        await a.start()
    await a.close()
