"""Expirable permits: ``lease_time``, ``lease.id`` and ``release_by_id`` on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import aiolocks
from aiolocks._core.records import SupportsRecords

from ..polling import eventually

pytestmark = [pytest.mark.asyncio, pytest.mark.primitives("semaphore")]


def _needs_records(backend: aiolocks.Backend) -> None:
    if not isinstance(backend._driver, SupportsRecords):
        pytest.skip("backend has no record store (release_by_id needs one)")


async def test_lease_ids_are_distinct_strings(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    sem = backend.semaphore(names(), max_leases=3)
    leases = await sem.acquire_many(3, timeout=10)
    assert leases is not None
    ids = [lease.id for lease in leases]
    assert all(isinstance(i, str) and i for i in ids)
    assert len(set(ids)) == 3
    assert ids == [str(lease.fencing_token) for lease in leases]
    for lease in leases:
        await lease.release()


async def test_an_expired_permit_frees_itself_and_its_holder_is_told(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    names: Callable[[], str],
) -> None:
    name = names()
    sem = backend.semaphore(name, max_leases=1)
    lease = await sem.acquire(timeout=10, lease_time=0.5)
    assert lease is not None
    rival = other_backend.semaphore(name, max_leases=1)
    assert await rival.acquire(timeout=0) is None, "the permit must be held at first"
    taken = await rival.acquire(timeout=15)
    assert taken is not None, "the expired permit was not freed"
    assert taken.fencing_token > lease.fencing_token
    assert lease.is_lost
    with pytest.raises(aiolocks.LockLostError, match=r"lease_time of 0\.5 s ran out"):
        await lease.release()
    await taken.release()


async def test_an_expiring_permit_cancels_its_body(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    sem = backend.semaphore(names(), max_leases=2)
    steps: list[str] = []
    with pytest.raises(aiolocks.LockLostError):
        async with sem.lease(timeout=10, lease_time=0.3) as lease:
            steps.append("in")
            await asyncio.sleep(30)
            steps.append("body went on")
    assert steps == ["in"]
    assert lease.is_lost
    again = await sem.acquire_many(2, timeout=10)
    assert again is not None, "the expired lease still counts"
    for held in again:
        await held.release()


async def test_a_released_permit_does_not_expire_later(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    sem = backend.semaphore(names(), max_leases=1)
    first = await sem.acquire(timeout=10, lease_time=0.3)
    assert first is not None
    await first.release()
    second = await sem.acquire(timeout=10)
    assert second is not None
    await asyncio.sleep(0.6)  # past the first lease's lease_time: its timer must be gone
    assert not second.is_lost
    assert not first.is_lost
    await second.release()


async def test_release_by_id_from_another_process(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    names: Callable[[], str],
) -> None:
    _needs_records(backend)
    name = names()
    sem = backend.semaphore(name, max_leases=1)
    entered = asyncio.Event()
    outcome: list[str] = []

    async def holder() -> None:
        try:
            async with sem as lease:
                outcome.append(lease.id)
                entered.set()
                await asyncio.sleep(60)
        except aiolocks.LockLostError as exc:
            outcome.append(str(exc))

    task = asyncio.ensure_future(holder())
    await asyncio.wait_for(entered.wait(), 15)
    lease_id = outcome[0]
    other = other_backend.semaphore(name, max_leases=1)
    assert await other.release_by_id(lease_id, timeout=15) is True
    await asyncio.wait_for(task, 15)
    assert "release_by_id" in outcome[1], outcome
    taken = await other.acquire(timeout=10)
    assert taken is not None, "the permit released by id is not free"
    assert await other.release_by_id(lease_id, timeout=5) is False, "a freed id is not held"
    await taken.release()


async def test_release_by_id_in_the_holding_process(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    sem = backend.semaphore(names(), max_leases=2)
    lease = await sem.acquire(timeout=10)
    assert lease is not None
    assert await sem.release_by_id(lease.id) is True
    assert lease.is_lost
    with pytest.raises(aiolocks.LockLostError, match="release_by_id"):
        await lease.release()
    both = await sem.acquire_many(2, timeout=10)
    assert both is not None
    for held in both:
        await held.release()


async def test_release_by_id_of_an_unknown_id_is_false_at_once(
    backend: aiolocks.Backend, names: Callable[[], str]
) -> None:
    _needs_records(backend)
    sem = backend.semaphore(names(), max_leases=1)
    assert await asyncio.wait_for(sem.release_by_id("123456789", timeout=30), 10) is False


@pytest.mark.parametrize("bad", ["", "abc", "-1", "1.5", "١٢", 7])
async def test_release_by_id_refuses_what_is_not_an_id(
    backend: aiolocks.Backend, names: Callable[[], str], bad: object
) -> None:
    sem = backend.semaphore(names(), max_leases=1)
    with pytest.raises(ValueError, match="not a lease id"):
        await sem.release_by_id(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "1", 10**9])
async def test_a_bad_lease_time_is_refused_before_any_io(
    backend: aiolocks.Backend, names: Callable[[], str], bad: object
) -> None:
    sem = backend.semaphore(names(), max_leases=1)
    with pytest.raises(ValueError, match="lease_time"):
        await sem.acquire(timeout=0, lease_time=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease_time"):
        sem.lease(lease_time=bad)  # type: ignore[arg-type]
    assert await sem.participants() == []


async def test_a_cancelled_release_by_id_leaves_no_request(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    names: Callable[[], str],
) -> None:
    _needs_records(backend)
    name = names()
    lease = await backend.semaphore(name, max_leases=1).acquire(timeout=10)
    assert lease is not None
    # the holder's backend stops answering: its desk is gone with its records' snapshot
    from aiolocks._core import permits

    permits.forget(lease._hold)
    other = other_backend.semaphore(name, max_leases=1)
    call = asyncio.ensure_future(other.release_by_id(lease.id, timeout=3600))
    records = other_backend._driver.records()

    async def requested() -> bool:
        snap = await records.snapshot(f"permit-release/{lease._hold.name}")
        with snap:
            return lease.id in snap.records

    await eventually(requested, 15, what="the release request to be written")
    call.cancel()
    # (a cancellation the client library swallowed must not wait out the hour)
    done, _ = await asyncio.wait([call], timeout=60)
    assert done, "the cancelled release_by_id went on waiting for an answer"
    with pytest.raises(asyncio.CancelledError):
        await call
    await eventually(lambda: _not(requested), 15, what="the request to be withdrawn")
    assert not lease.is_lost
    await lease.release()


async def _not(predicate: Callable[[], object]) -> bool:
    result = predicate()
    assert asyncio.iscoroutine(result)
    return not await result
