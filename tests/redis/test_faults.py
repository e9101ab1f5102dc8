"""Servers restarted, connections stalled or delayed: clear errors or loss, never a hang."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest
import redis.asyncio

import aiolocks
from aiolocks.testing.proxy import TcpProxy
from aiolocks.testing.servers import RedisServer

from ..polling import eventually

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


async def test_restart_mid_hold_loses_the_hold(redis_restartable: RedisServer) -> None:
    url = redis_restartable.url
    async with aiolocks.connect(url, lease_time=1, connect_timeout=2) as backend:
        lock = backend.mutex("restart/hold")
        async with asyncio.timeout(20):
            with pytest.raises(aiolocks.LockLostError):
                async with lock:
                    await asyncio.to_thread(redis_restartable.kill)
                    await asyncio.to_thread(redis_restartable.start)  # empty: no persistence
                    await asyncio.sleep(30)
        # the backend keeps working on the new server
        async with lock:
            assert lock.fencing_token is not None


async def test_server_down_during_hold_is_a_loss_within_the_lease(
    redis_restartable: RedisServer,
) -> None:
    url = redis_restartable.url
    async with aiolocks.connect(url, lease_time=1, connect_timeout=1) as backend:
        lock = backend.mutex("down/hold")
        async with asyncio.timeout(20):
            with pytest.raises(aiolocks.LockLostError):
                async with lock:
                    await asyncio.to_thread(redis_restartable.kill)
                    await asyncio.sleep(30)
        with pytest.raises(aiolocks.BackendUnavailableError):
            await lock.acquire(timeout=1)
        await asyncio.to_thread(redis_restartable.start)


async def test_restart_mid_wait_gives_a_clear_outcome(redis_restartable: RedisServer) -> None:
    url = redis_restartable.url
    async with (
        aiolocks.connect(url, lease_time=1, connect_timeout=5) as one,
        aiolocks.connect(url, lease_time=1, connect_timeout=5) as two,
    ):
        holder = one.mutex("restart/wait")
        await holder.acquire()
        waiter = two.mutex("restart/wait")

        async def wait_then_release() -> bool:
            if not await waiter.acquire(timeout=15):
                return False
            await waiter.release()
            return True

        waiting = asyncio.create_task(wait_then_release())

        async def queued() -> bool:
            raw = redis.asyncio.Redis.from_url(url)
            try:
                # a queued mutex waiter listens on its process's hand-off channel
                return bool(await raw.pubsub_channels("aiolocks:grant:*"))
            finally:
                await raw.aclose()

        await eventually(queued, what="the waiter to subscribe")
        await asyncio.to_thread(redis_restartable.kill)
        await asyncio.to_thread(redis_restartable.start)
        async with asyncio.timeout(20):
            try:
                outcome: object = await waiting
            except aiolocks.BackendUnavailableError as exc:
                outcome = exc
        # The waiter rides out a restart shorter than connect_timeout; the
        # restart emptied the server, so it gets the lock. Never a hang.
        assert outcome is True

        async def holder_lost() -> bool:
            return holder.is_lost

        # the holder's field vanished with the restart: lost at its next renewal
        await eventually(holder_lost, timeout=2, what="the holder to notice the loss")
        with pytest.raises(aiolocks.LockLostError, match="was lost while it was held"):
            await holder.release()  # lost: the release cleans up, then reports the loss


async def test_stalled_connection_loses_the_hold_within_the_lease(
    redis_server: RedisServer, prefix: str
) -> None:
    async with TcpProxy(redis_server.host, redis_server.port) as proxy:
        url = f"redis://{proxy.netloc}?lease_time=1&connect_timeout=1&key_prefix={prefix}"
        async with aiolocks.connect(url) as backend:
            lock = backend.mutex("stall/hold")
            async with asyncio.timeout(10):
                with pytest.raises(aiolocks.LockLostError):
                    async with lock:
                        proxy.stall()
                        await asyncio.sleep(30)
            proxy.heal()
    raw = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        await eventually(lambda: _no_keys(raw, prefix), what="the lease to lapse")
    finally:
        await raw.aclose()


async def _no_keys(raw: redis.asyncio.Redis, prefix: str) -> bool:
    return not await raw.keys(f"{prefix}*")


async def test_connect_to_a_stalled_server_fails_within_connect_timeout(
    redis_server: RedisServer,
) -> None:
    async with TcpProxy(redis_server.host, redis_server.port) as proxy:
        proxy.stall()
        async with asyncio.timeout(10):
            with pytest.raises(aiolocks.BackendUnavailableError, match="connect_timeout"):
                await aiolocks.connect(f"redis://{proxy.netloc}?connect_timeout=0.5")


async def test_cancellation_during_slow_round_trips_leaves_nothing(
    redis_server: RedisServer, prefix: str
) -> None:
    """Cancel at random moments while every packet takes 3 ms each way."""
    raw = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    rng = random.Random(7)
    try:
        async with TcpProxy(redis_server.host, redis_server.port) as proxy:
            url = f"redis://{proxy.netloc}?key_prefix={prefix}"
            async with aiolocks.connect(url) as backend, aiolocks.connect(url) as other:
                proxy.delay(0.003)
                holder = other.mutex("slow/x")
                for round_ in range(40):
                    contended = round_ % 2 == 1
                    if contended:
                        await holder.acquire()
                    lock = backend.mutex("slow/x", fair=round_ % 4 == 3)

                    async def attempt(lock: aiolocks.Mutex = lock) -> None:
                        if await lock.acquire():
                            await lock.release()

                    task = asyncio.create_task(attempt())
                    await asyncio.sleep(rng.uniform(0, 0.03))
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    fields = [
                        f
                        for f in await raw.hkeys(f"{prefix}{{mutex:slow/x}}")
                        if f not in ("#", b"#") and f[:1] not in ("!", b"!")  # fence, tombstones
                    ]
                    assert len(fields) == (1 if contended else 0), (round_, fields)
                    assert await raw.llen(f"{prefix}{{mutex:slow/x}}:queue") == 0
                    if contended:
                        await holder.release()
                proxy.heal()
        # A cancelled attempt whose script was on the wire leaves a tombstone
        # (a field of the lock's hash) that lapses within 2 s; nothing else.
        await eventually(lambda: _no_keys(raw, prefix), what="tombstones to lapse")
    finally:
        await raw.aclose()


async def test_killed_pubsub_connection_resubscribes_and_wakes_waiters(
    redis_server: RedisServer, prefix: str
) -> None:
    url = f"{redis_server.url}?key_prefix={prefix}"
    channel = f"{prefix}grant:*"  # where a release hands the lock to a queued waiter
    raw = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
            holder = one.mutex("kill/pubsub")
            await holder.acquire()
            waiter = asyncio.create_task(_take_and_release(two.mutex("kill/pubsub")))

            async def subscribed() -> bool:
                return bool(await raw.pubsub_channels(channel))

            await eventually(subscribed, what="the waiter to subscribe")
            killed = await raw.client_kill_filter(_type="pubsub")
            assert killed >= 1
            await eventually(subscribed, what="the hub to subscribe again")
            await holder.release()
            # woken by the message on the new connection, long before the 30 s lease
            async with asyncio.timeout(5):
                assert await waiter
    finally:
        await raw.aclose()


async def _take_and_release(lock: aiolocks.Mutex) -> bool:
    async with lock:
        return True


async def test_killed_connections_during_hold_are_retried_not_a_loss(
    redis_server: RedisServer, prefix: str
) -> None:
    url = f"{redis_server.url}?key_prefix={prefix}&lease_time=1"
    raw = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        async with aiolocks.connect(url) as backend, aiolocks.connect(url) as other:
            lock = backend.mutex("kill/normal")
            async with lock:
                for _ in range(8):
                    await raw.client_kill_filter(_type="normal", skipme=True)
                    await asyncio.sleep(0.25)
                assert not lock.is_lost
                assert await other.mutex("kill/normal").acquire(timeout=0) is False
    finally:
        await raw.aclose()
