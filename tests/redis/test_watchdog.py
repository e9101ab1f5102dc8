"""The batched watchdog: many holds renewed in few round trips, each judged on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio

import aiolocks
from aiolocks.redis import RedisBackend
from aiolocks.redis._watchdog import Renewal, RenewResult

from ..polling import eventually

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]

N = 40
LEASE = 0.6


def _record_batches(backend: aiolocks.Backend) -> list[int]:
    """Wrap the driver's renew function; the sizes of the batches it was given."""
    assert isinstance(backend, RedisBackend)
    watchdog = backend._driver.watchdog
    original = watchdog._renew_many
    sizes: list[int] = []

    async def renew_many(renewals: Sequence[Renewal]) -> Sequence[RenewResult]:
        sizes.append(len(renewals))
        return await original(renewals)  # type: ignore[no-any-return]

    watchdog._renew_many = renew_many
    return sizes


async def _hold_many(backend: aiolocks.Backend, tag: str) -> tuple[list[int], list[Any]]:
    """N semaphore mutexes held at once (renewals come due together), and the batch log."""
    sizes = _record_batches(backend)
    locks = [backend.semaphore_mutex(f"{tag}/{i}") for i in range(N)]
    # Taken concurrently, so that their renewals come due together even on a
    # loaded machine (one by one, the acquisitions spread over the lease).
    assert all(await asyncio.gather(*(lock.acquire(timeout=0) for lock in locks)))
    return sizes, locks


async def test_holds_due_together_are_renewed_in_one_round_trip(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    async with aiolocks.connect(url, lease_time=LEASE) as backend:
        sizes, locks = await _hold_many(backend, "wd-batch")
        # held through renewal rounds well past the first lease (about 5 per hold)
        await eventually(lambda: sum(sizes) >= N * 5, 30, what=f"{N * 5} renewals")
        assert not any(lock.is_lost for lock in locks)
        # every key still carries a live lease
        for i in range(N):
            ttl = await raw.pttl(f"{prefix}{{semaphore-mutex:wd-batch/{i}}}")
            assert 0 < ttl <= LEASE * 1000
        renewed = sum(sizes)
        assert renewed >= N * 5, sizes
        assert max(sizes) > 1, sizes  # batched, not one round trip per hold
        # on average at least two holds per round trip (about N per round on a
        # quiet machine; a loaded one spreads the due times)
        assert len(sizes) <= renewed / 2, sizes
        for lock in locks:
            await lock.release()


async def test_one_hold_deleted_behind_our_back_is_lost_alone(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    async with aiolocks.connect(url, lease_time=LEASE) as backend:
        sizes, locks = await _hold_many(backend, "wd-one")
        deleted_at = len(sizes)
        await raw.delete(f"{prefix}{{semaphore-mutex:wd-one/7}}")
        # the loss is seen, and every other hold was renewed since (a round or two)
        await eventually(
            lambda: locks[7].is_lost and sum(sizes[deleted_at:]) >= N - 1,
            30,
            what="the lost hold seen and a renewal round of the others",
        )
        assert locks[7].is_lost
        assert [i for i, lock in enumerate(locks) if lock.is_lost] == [7]
        assert max(sizes) > 1, sizes
        for index, lock in enumerate(locks):
            if index == 7:
                with pytest.raises(aiolocks.LockLostError, match="wd-one/7"):
                    await lock.release()
            else:
                await lock.release()


async def test_renewals_survive_a_script_flush(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    async with aiolocks.connect(url, lease_time=LEASE) as backend:
        sizes, locks = await _hold_many(backend, "wd-flush")
        flushed_at = len(sizes)
        await raw.script_flush()
        # two renewal rounds after the flush (the first one finds no script)
        await eventually(
            lambda: sum(sizes[flushed_at:]) >= 2 * N, 30, what="two renewal rounds after the flush"
        )
        assert not any(lock.is_lost for lock in locks)
        assert max(sizes) > 1, sizes
        for lock in locks:
            await lock.release()


async def test_released_holds_are_not_renewed(url: str) -> None:
    async with aiolocks.connect(url, lease_time=LEASE) as backend:
        sizes = _record_batches(backend)
        for i in range(N):
            async with backend.mutex(f"wd-short/{i}"):
                pass
        await asyncio.sleep(LEASE)
        assert sizes == []  # short holds cost a timer each, never a renewal


async def test_holds_of_an_ended_owner_stop_renewing(
    url: str, raw: redis.asyncio.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with aiolocks.connect(url, lease_time=LEASE) as backend:
        sizes = _record_batches(backend)

        async def leave_it_held() -> Any:
            await backend.mutex("wd-orphan").acquire()

        await asyncio.create_task(leave_it_held())
        await asyncio.sleep(LEASE * 1.5)
        # the core released the orphan at once; nothing was renewed after that
        assert await raw.exists(f"{prefix}{{mutex:wd-orphan}}") == 0
        assert sum(sizes) == 0, sizes
