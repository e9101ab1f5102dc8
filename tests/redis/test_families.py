"""Semaphore leases, read/write lock, leader latch, per-lock leases, participants."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

import aiolocks
from aiolocks.testing.servers import RedisSentinelSet, RedisServer

from ..polling import eventually
from .conftest import command_calls, renewed_past_expiry

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


async def test_semaphore_leases_have_ids_expiries_and_distinct_tokens(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    async with aiolocks.connect(url, lease_time=1) as backend, aiolocks.connect(url) as other:
        sem = backend.semaphore("sem/x", 3)
        leases = await sem.acquire_many(3, timeout=1)
        assert leases is not None
        tokens = [lease.fencing_token for lease in leases]
        assert len(set(tokens)) == 3
        parts = await sem.participants()
        assert len(parts) == 3 and all(p.is_holder and p.ttl for p in parts)
        assert await other.semaphore("sem/x", 3).acquire(timeout=0) is None
        # the watchdog renews each lease past its 1 s
        await renewed_past_expiry(raw, f"{prefix}{{semaphore:sem/x}}", 3)
        assert not any(lease.is_lost for lease in leases)
        # three holds and the fence counter
        assert len(await raw.hkeys(f"{prefix}{{semaphore:sem/x}}")) == 4
        await leases[0].release()
        got = await other.semaphore("sem/x", 3).acquire(timeout=1)
        assert got is not None
        await got.release()
        for lease in leases[1:]:
            await lease.release()


async def test_acquire_many_is_all_or_nothing(url: str, raw: redis.asyncio.Redis) -> None:
    async with aiolocks.connect(url) as backend:
        sem = backend.semaphore("sem/many", 3)
        one = await sem.acquire()
        assert one is not None
        assert await sem.acquire_many(3, timeout=0.2) is None  # never partial
        assert len(await sem.participants()) == 1
        await one.release()
        three = await sem.acquire_many(3, timeout=1)
        assert three is not None and len(three) == 3
        for lease in three:
            await lease.release()


async def test_semaphore_waiter_is_woken_by_a_release(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as other:
        sem = backend.semaphore("sem/wake", 1)
        lease = await sem.acquire()
        assert lease is not None
        channel = f"{prefix}{{semaphore:sem/wake}}"  # a release publishes there
        assert await raw.pubsub_numsub(channel) == [(channel, 0)]
        waiter = asyncio.create_task(other.semaphore("sem/wake", 1).acquire(timeout=20))

        async def listening() -> bool:
            return bool(await raw.pubsub_numsub(channel) == [(channel, 1)])

        await eventually(listening, what="the waiter to listen for releases")
        assert not waiter.done()
        await lease.release()
        async with asyncio.timeout(5):  # well within the 30 s lease: woken, not timed out
            got = await waiter
        assert got is not None
        await got.release()


async def test_rwlock_readers_share_writers_exclude_and_downgrade(url: str) -> None:
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as other:
        rw, rw2 = backend.read_write_lock("rw/x"), other.read_write_lock("rw/x")
        async with rw.read:
            assert await rw2.read.acquire(timeout=0)
            await rw2.read.release()
            assert not await rw2.write.acquire(timeout=0)
        async with rw.write:
            assert not await rw2.read.acquire(timeout=0)
            async with rw.read:  # downgrade: the writer may read
                parts = await rw.read.participants()
                assert sorted(p.mode for p in parts) == ["read", "write"]
            assert not await rw2.write.acquire(timeout=0)
        with pytest.raises(aiolocks.DeadlockError):
            async with rw.read:
                await rw.write.acquire()


async def test_leader_latch_hands_over_when_the_leader_closes(
    url: str, redis_server: RedisServer, prefix: str
) -> None:
    # not the ``raw`` fixture: the latch's records outlive it (their own TTL)
    raw = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        async with aiolocks.connect(url, lease_time=1) as one, aiolocks.connect(url) as two:
            a = one.leader_latch("lead/x", participant_id="a")
            b = two.leader_latch("lead/x", participant_id="b")
            await a.start()
            assert await a.wait_for_leadership(timeout=5)
            await b.start()
            key = f"{prefix}{{leader:lead/x}}"

            async def b_queued() -> bool:
                return bool(await raw.llen(f"{key}:queue") == 1)

            await eventually(b_queued, what="b to wait in the latch's queue")
            # a's lease is renewed past its 1 s; b, waiting all along, never pre-empts
            await renewed_past_expiry(raw, key, 1)
            assert await b_queued()
            assert a.has_leadership and not b.has_leadership
            leader = await b.leader()
            assert leader is not None and leader.id == "a"
            await a.close()
            assert await b.wait_for_leadership(timeout=5)
            await b.close()
    finally:
        await raw.aclose()


async def test_per_lock_lease_time_is_used(url: str, raw: redis.asyncio.Redis, prefix: str) -> None:
    async with aiolocks.connect(url) as backend:
        async with backend.mutex("lease/per-lock", lease_time=2.5):
            ttl = await raw.pttl(f"{prefix}{{mutex:lease/per-lock}}")
            assert 1500 < ttl <= 2500
        async with backend.mutex("lease/default"):
            ttl = await raw.pttl(f"{prefix}{{mutex:lease/default}}")
            assert 25_000 < ttl <= 30_000


async def test_min_replicas_waits_for_replicas_and_fails_clearly(
    redis_sentinel: RedisSentinelSet,
) -> None:
    url = redis_sentinel.master.url
    async with (
        aiolocks.connect(url, min_replicas=1) as backend,
        backend.mutex("wait/one") as lock,
    ):
        assert lock.fencing_token is not None
    async with aiolocks.connect(url, min_replicas=5) as backend:
        with pytest.raises(aiolocks.BackendUnavailableError, match="replicas"):
            await backend.mutex("wait/five").acquire(timeout=0)
    raw = redis.asyncio.Redis.from_url(url)
    try:
        assert await raw.keys("aiolocks:{mutex:wait/*") == []  # the failed write was undone
    finally:
        await raw.aclose()


async def test_freed_leases_wake_only_as_many_local_waiters(
    redis_restartable: RedisServer,
) -> None:
    """Ten one-lease waiters in one backend behind three held leases: each
    release rings only as many waiters as it freed leases (``released <n>``),
    never the whole herd, and at most three are ever inside."""
    url = redis_restartable.url
    raw = redis.asyncio.Redis.from_url(url)
    try:
        async with aiolocks.connect(url) as one, aiolocks.connect(url) as many:
            held = await one.semaphore("herd/sem", 3).acquire_many(3)
            assert held is not None
            inside = most = 0

            async def waiter() -> None:
                nonlocal inside, most
                async with many.semaphore("herd/sem", 3).lease():
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0.005)
                    inside -= 1

            tasks = [asyncio.create_task(waiter()) for _ in range(10)]

            async def all_waiting() -> bool:
                # the holder's acquire, two tries per waiter (before and after subscribing)
                return int((await command_calls(raw)).get("evalsha", 0)) >= 1 + 2 * 10

            # each has subscribed (confirmed) before its second try: every
            # release from now on reaches every waiter
            await eventually(all_waiting, what="every waiter to wait")
            await raw.config_resetstat()
            for lease in held:
                await lease.release()
            await asyncio.gather(*tasks)
            calls = await command_calls(raw)
        assert most == 3
        # 3 releases, then per waiter one winning try and one release; ringing
        # every waiter on every release would cost dozens of tries more
        assert calls["evalsha"] <= 3 + 2 * 10 + 6, calls
    finally:
        await raw.aclose()


async def test_rwlock_release_wakes_the_readers_and_one_writer_not_the_herd(
    redis_restartable: RedisServer,
) -> None:
    """Eight writers and four readers of one backend wait behind a held
    write lock: each release rings every reader (they can all proceed) but
    one writer (at most one can), so the drain costs about one winning try
    and one release per waiter, not a try by every writer at every release;
    exclusion holds throughout."""
    url = redis_restartable.url
    raw = redis.asyncio.Redis.from_url(url)
    try:
        async with aiolocks.connect(url) as one, aiolocks.connect(url) as many:
            holder = one.read_write_lock("herd/rw")
            await holder.write.acquire()
            writers = readers = 0
            violations = 0

            async def writer() -> None:
                nonlocal writers, violations
                async with many.read_write_lock("herd/rw").write:
                    writers += 1
                    violations += writers > 1 or readers > 0
                    await asyncio.sleep(0.002)
                    writers -= 1

            async def reader() -> None:
                nonlocal readers, violations
                async with many.read_write_lock("herd/rw").read:
                    readers += 1
                    violations += writers > 0
                    await asyncio.sleep(0.002)
                    readers -= 1

            tasks = [asyncio.create_task(writer()) for _ in range(8)]
            tasks += [asyncio.create_task(reader()) for _ in range(4)]

            async def all_waiting() -> bool:
                # the holder's acquire, two tries per waiter (before and after subscribing)
                return int((await command_calls(raw)).get("evalsha", 0)) >= 1 + 2 * 12

            # each has subscribed (confirmed) before its second try: every
            # release from now on reaches every waiter
            await eventually(all_waiting, what="every waiter to wait")
            await raw.config_resetstat()
            await holder.write.release()
            await asyncio.gather(*tasks)
            calls = await command_calls(raw)
        assert violations == 0
        # 1 release, then per waiter one winning try and one release, plus a
        # few failed tries (a writer rung while readers hold); ringing every
        # writer at every release costs about 8 x 8 / 2 tries more
        assert calls["evalsha"] <= 1 + 2 * 12 + 12, calls
    finally:
        await raw.aclose()
