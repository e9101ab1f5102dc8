"""``on_unavailable="local"`` against a real ZooKeeper server stopped mid-run."""

from __future__ import annotations

import asyncio

import pytest

import aiolocks
from aiolocks.testing.servers import ZooKeeperServer

pytestmark = [pytest.mark.zookeeper, pytest.mark.asyncio]


def _url(server: ZooKeeperServer, **extra: str) -> str:
    options = ["session_timeout=4", "connect_timeout=2", *(f"{k}={v}" for k, v in extra.items())]
    query = "&".join(options)
    return f"{server.url}?{query}"


async def test_default_raise_when_the_server_is_stopped(
    zookeeper_restartable: ZooKeeperServer,
) -> None:
    async with aiolocks.connect(_url(zookeeper_restartable)) as backend:
        await asyncio.to_thread(zookeeper_restartable.stop)
        lock = backend.mutex("dg/raise")
        with pytest.raises(aiolocks.BackendUnavailableError):
            await lock.acquire(timeout=30)
        assert not lock.is_owned_by_current_task() and not lock.is_degraded
        assert not backend._holds


async def test_local_fallback_while_stopped_then_server_again(
    zookeeper_restartable: ZooKeeperServer,
) -> None:
    events: list[aiolocks.LockEvent] = []
    url = _url(zookeeper_restartable, on_unavailable="local")
    async with aiolocks.connect(url) as backend:
        backend.add_event_hook(events.append)
        rw = backend.read_write_lock("dg/rw")
        async with rw.write:
            assert not rw.write.is_degraded
        await asyncio.to_thread(zookeeper_restartable.stop)

        # two readers share the degraded read half; the writer waits for both
        order: list[str] = []
        readers_in = asyncio.Event()

        async def reader(tag: str) -> None:
            mine = backend.read_write_lock("dg/rw")
            async with mine.read:
                assert mine.read.is_degraded
                order.append(f"{tag} in")
                if len(order) == 2:
                    readers_in.set()
                await readers_in.wait()
                await asyncio.sleep(0.05)
                order.append(f"{tag} out")

        async def writer() -> None:
            await readers_in.wait()
            mine = backend.read_write_lock("dg/rw")
            async with mine.write:
                assert mine.write.is_degraded
                order.append("w in")

        async with asyncio.timeout(60):
            await asyncio.gather(reader("a"), reader("b"), writer())
        assert order[:2] == ["a in", "b in"] or order[:2] == ["b in", "a in"]
        assert order[-1] == "w in"
        assert sorted(order[2:4]) == ["a out", "b out"]
        assert [e.kind for e in events].count("degraded") == 3

        # a semaphore degrades to a local semaphore of the same size
        sem = backend.semaphore("dg/sem", 2)
        async with asyncio.timeout(60):
            leases = await sem.acquire_many(2, timeout=30)
        assert leases is not None and all(lease.is_degraded for lease in leases)
        assert await sem.acquire(timeout=0) is None  # the local semaphore is full
        for lease in leases:
            await lease.release()

        # the server answers again: new acquires use it
        await asyncio.to_thread(zookeeper_restartable.start)
        async with asyncio.timeout(60):
            while True:
                async with rw.write:
                    degraded: bool = rw.write.is_degraded
                    holders = len(await rw.write.participants()) if not degraded else 0
                if not degraded:
                    break
                await asyncio.sleep(0.2)
        assert holders == 1
        assert not backend._holds


async def test_degraded_acquire_waits_for_this_backends_server_hold_to_end(
    zookeeper_restartable: ZooKeeperServer,
) -> None:
    url = _url(zookeeper_restartable, on_unavailable="local")
    async with aiolocks.connect(url) as backend:
        order: list[str] = []
        holding = asyncio.Event()

        async def server_holder() -> None:
            lock = backend.mutex("dg/guard")
            try:
                async with lock:
                    assert not lock.is_degraded
                    holding.set()
                    await asyncio.sleep(120)
            except aiolocks.LockLostError:
                order.append("server hold lost")

        async def degraded_taker() -> None:
            lock = backend.mutex("dg/guard")
            async with lock:
                order.append(f"taken degraded={lock.is_degraded}")

        async with asyncio.timeout(90):
            first = asyncio.create_task(server_holder())
            await holding.wait()
            await asyncio.to_thread(zookeeper_restartable.stop)
            await asyncio.gather(first, degraded_taker())
        # the session ran out, the hold was lost, and only then the local lock was taken
        assert order == ["server hold lost", "taken degraded=True"]
        assert not backend._holds
