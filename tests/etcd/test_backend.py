"""``EtcdBackend``: URL and wrapped-client forms, bad input, and waiters that do not herd."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest

import aiolocks
from aiolocks.etcd import EtcdBackend, EtcdClient
from aiolocks.testing import EtcdServer

from ..polling import eventually


async def _participants_at_least(lock: Any, count: int) -> bool:
    return len(await lock.participants()) >= count


pytestmark = pytest.mark.etcd


@pytest.mark.asyncio
async def test_wraps_a_client_and_leaves_it_open(etcd: EtcdServer, prefix: str) -> None:
    async with EtcdClient(list(etcd.endpoints)) as client:
        backend = EtcdBackend(client, prefix=prefix.rstrip("/"), lease_ttl=5)
        async with backend:
            lock = backend.mutex("wrapped/a")
            async with lock:
                holders = [p for p in await lock.participants() if p.is_holder]
                assert len(holders) == 1
            seen = await client.range(prefix.encode(), prefix=True)
            assert seen.kvs == ()  # released: nothing left under the prefix
        assert not client.closed
        assert (await client.status())["version"]


@pytest.mark.asyncio
async def test_connect_builds_an_etcd_backend(etcd: EtcdServer) -> None:
    async with aiolocks.connect(etcd.url + "/app?lease_ttl=3") as backend:
        assert isinstance(backend, EtcdBackend)
        assert backend.url == etcd.url + "/app"
        async with backend.semaphore("s", 2):
            pass


@pytest.mark.parametrize(
    ("url", "part"),
    [
        ("etcd://127.0.0.1:2379?lease_ttl=0", "lease_ttl"),
        ("etcd://127.0.0.1:2379?bogus=1", "bogus"),
        ("etcd://127.0.0.1:2379/a//b", "segment"),
    ],
)
def test_bad_urls_fail_before_io(url: str, part: str) -> None:
    with pytest.raises(ValueError, match=part):
        aiolocks.connect(url)


def test_bad_targets() -> None:
    with pytest.raises(TypeError, match="EtcdClient"):
        EtcdBackend(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="from the URL"):
        EtcdBackend("etcd://127.0.0.1", lease_ttl=3)
    client = EtcdClient(["127.0.0.1:2379"])
    with pytest.raises(ValueError, match="lease_ttl"):
        EtcdBackend(client, lease_ttl=0)
    with pytest.raises(ValueError, match="segment"):
        EtcdBackend(client, prefix="a//b")


def test_per_lock_options_are_refused() -> None:
    backend = aiolocks.connect("etcd://127.0.0.1:2379")._backend
    with pytest.raises(ValueError, match="lease_time"):
        backend.mutex("a", lease_time=3)


@pytest.mark.asyncio
async def test_semaphore_waiters_watch_one_key_each(etcd: EtcdServer, prefix: str) -> None:
    """Only the first waiter watches the queue; each later one watches the key ahead of it."""
    async with aiolocks.connect(etcd.url + "/" + prefix.rstrip("/")) as backend, aiolocks.connect(
        etcd.url + "/" + prefix.rstrip("/")
    ) as other:
        driver: Any = other._driver
        watched: list[tuple[bytes, bool, bool]] = []
        real_watch = driver.client.watch

        async def spy(key: bytes, **kwargs: Any) -> Any:
            watched.append((key, bool(kwargs.get("prefix")), not kwargs.get("no_put", False)))
            return await real_watch(key, **kwargs)

        driver.client.watch = spy
        sem = backend.semaphore("herd", 2)
        held = await sem.acquire_many(2)
        assert held is not None
        order: list[int] = []
        waiting = other.semaphore("herd", 2)

        async def waiter(i: int) -> None:
            async with waiting:
                order.append(i)
                await asyncio.sleep(0)

        tasks = []
        for i in range(4):
            tasks.append(asyncio.create_task(waiter(i)))
            await eventually(partial(_participants_at_least, sem, 3 + i), what="the waiter's key")
        # each waiter has had its first wait
        await eventually(lambda: len(watched) >= 4, what="every waiter's first wait")
        queue_watches = [w for w in watched if w[1]]
        key_watches = [w for w in watched if not w[1] and w[2]]
        assert len(queue_watches) == 1, watched
        assert len(key_watches) == 3, watched
        assert len({w[0] for w in key_watches}) == 3  # each waits on a different key
        for lease in held:
            await lease.release()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3]
        assert await sem.participants() == []


@pytest.mark.asyncio
async def test_acquire_many_interleaved_with_single_leases(etcd: EtcdServer, prefix: str) -> None:
    """acquire_many writes its keys one by one; singles racing in between never
    push the semaphore past max_leases, every lease has a token of its own, and
    nothing is left behind."""
    url = f"{etcd.url}/{prefix.rstrip('/')}?lease_ttl=5"
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
        inside = 0
        most = 0
        tokens: list[int] = []

        async def take(backend: aiolocks.Backend, n: int) -> None:
            nonlocal inside, most
            sem = backend.semaphore("mixed", max_leases=3)
            for _ in range(3):
                leases = await sem.acquire_many(n, timeout=30)
                assert leases is not None and len(leases) == n
                inside += n
                most = max(most, inside)
                tokens.extend(lease.fencing_token or 0 for lease in leases)
                await asyncio.sleep(0.002)
                inside -= n
                for lease in leases:
                    await lease.release()

        await asyncio.gather(
            take(one, 2), take(two, 2), take(one, 1), take(two, 1), take(two, 3)
        )
        assert most <= 3
        assert len(tokens) == 27 and len(set(tokens)) == 27
        assert await one.semaphore("mixed", max_leases=3).participants() == []


@pytest.mark.asyncio
async def test_200_waiters_drain_over_one_watch_stream(etcd: EtcdServer, prefix: str) -> None:
    """Every watch of a backend (holds' loss watches, waiters' watches) shares one gRPC stream."""
    url = f"{etcd.url}/{prefix.rstrip('/')}?lease_ttl=10"
    async with aiolocks.connect(url) as backend:
        assert isinstance(backend, EtcdBackend)
        client = backend.client
        lock = backend.mutex("drain")
        inside = 0
        most = 0
        tokens: list[int] = []

        async def waiter() -> None:
            nonlocal inside, most
            async with lock:
                inside += 1
                most = max(most, inside)
                tokens.append(lock.fencing_token or 0)
                await asyncio.sleep(0)
                inside -= 1

        first = await lock.acquire()
        assert first
        tasks = [asyncio.create_task(waiter()) for _ in range(200)]
        await eventually(
            partial(_participants_at_least, lock, 201), 60, what="200 queued waiters"
        )
        await lock.release()
        await asyncio.gather(*tasks)
        assert most == 1 and len(tokens) == 200 and tokens == sorted(tokens)
        assert client.watch_streams_opened == 1
        assert await lock.participants() == []


@pytest.mark.asyncio
async def test_hold_watch_from_a_compacted_revision_still_reports_a_delete(
    etcd: EtcdServer, prefix: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """History compacted before a hold's loss watch starts: the watch checks the key is still
    ours, watches on from now, and a later delete behind our back is still a prompt loss."""
    from aetcd.rpc import rpc_pb2

    from aiolocks.etcd._client import RangeOp

    # The loss watch starts a moment after the grant: make that moment long enough to
    # compact the history it will ask for.
    monkeypatch.setattr("aiolocks.etcd._driver._LOSS_WATCH_DELAY", 1.0)
    caplog.set_level("INFO", logger="aiolocks.etcd")
    url = f"{etcd.url}/{prefix.rstrip('/')}?lease_ttl=10"
    async with aiolocks.connect(url) as backend, EtcdClient(list(etcd.endpoints)) as admin:
        assert isinstance(backend, EtcdBackend)
        lock = backend.mutex("compacted")
        assert await lock.acquire(timeout=10)
        await admin.put(prefix + "other", "x")
        latest = (await admin.put(prefix + "other", "y")).revision
        request = rpc_pb2.CompactionRequest(revision=latest, physical=True)
        await admin._unary("kv", "Compact", request, timeout=None, retry=False)
        await eventually(
            lambda: "was compacted; the key is still ours" in caplog.text,
            what="the loss watch's compaction check",
        )
        assert not lock.is_lost, "a compaction alone loses nothing"
        found = await admin.range(RangeOp.of(prefix, prefix=True, keys_only=True))
        [key] = [kv.key for kv in found.kvs if b"compacted" in kv.key]
        await admin.delete(key)
        await eventually(lambda: _is_lost(lock), what="the hold reported lost")
        with pytest.raises(aiolocks.LockLostError):
            await lock.release()


def _is_lost(lock: aiolocks.Mutex) -> bool:
    return lock.is_lost
