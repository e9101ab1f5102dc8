"""Chaos: cancellation everywhere, lost replies, nodes deleted behind our back,
herds, and many processes."""

from __future__ import annotations

import asyncio
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import aiozk
import pytest

import aiolocks
from aiolocks._core.driver import Family
from aiolocks.testing.proxy import TcpProxy
from aiolocks.testing.servers import ZooKeeperServer
from aiolocks.zookeeper import ZooKeeperBackend, lock_path

from .conftest import SESSION_TIMEOUT, Held, count_requests, lock_nodes, until

pytestmark = pytest.mark.zookeeper

WORKER = str(Path(__file__).with_name("worker.py"))


async def _connect(url: str) -> ZooKeeperBackend:
    backend = await aiolocks.connect(url)
    assert isinstance(backend, ZooKeeperBackend)
    return backend


async def _no_nodes_but(observer: Any, keep: int) -> bool:
    return len(await lock_nodes(observer)) == keep


@pytest.mark.asyncio
@pytest.mark.parametrize("contended", [False, True])
async def test_cancel_at_every_point_leaves_nothing(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_url: str, observer: Any, contended: bool
) -> None:
    name = f"cancel/{uuid.uuid4().hex}"
    direct = await _connect(zk_url)
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        slow = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10")
        holder = Held(direct.semaphore_mutex(name)) if contended else None
        try:
            if holder is not None:
                assert await holder.wait()
            keep = 1 if contended else 0
            # warm up (parents exist), then add latency so that the cancel
            # lands before, during and after each request of the acquire
            async with slow.semaphore_mutex(f"{name}-warm"):
                pass
            proxy.delay(0.01)
            for step in range(16):
                lock = slow.semaphore_mutex(name)
                task = asyncio.create_task(lock.acquire())
                await asyncio.sleep(step * 0.006)
                task.cancel()
                try:
                    got = await task
                except asyncio.CancelledError:
                    got = False
                if got:  # acquired before the cancel landed: fine, give it back
                    assert not contended
                    await lock.release()
                await until(lambda: _no_nodes_but(observer, keep), what=f"clean after step {step}")
            proxy.heal()
            if holder is not None:
                await holder.release()
            # and the lock still works for everyone
            async with slow.semaphore_mutex(name), direct.mutex(f"{name}-other"):
                pass
            assert await lock_nodes(observer) == []
        finally:
            proxy.heal()
            await slow.close()
            await direct.close()


@pytest.mark.asyncio
async def test_cancel_between_create_and_its_reply(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    name = f"inflight/{uuid.uuid4().hex}"
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        slow = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10")
        try:
            async with slow.mutex(f"{name}-warm"):
                pass
            proxy.delay(0.3)  # the reply arrives 0.3 s after the server created the node
            lock = slow.mutex(name)
            task = asyncio.create_task(lock.acquire())
            await until(lambda: _no_nodes_but(observer, 1), what="node created on the server")
            task.cancel()  # the create's reply is still on its way
            with pytest.raises(asyncio.CancelledError):
                await task
            proxy.heal()
            await until(lambda: _no_nodes_but(observer, 0), what="orphan swept")
        finally:
            proxy.heal()
            await slow.close()


@pytest.mark.asyncio
async def test_cancelled_release_still_deletes(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    name = f"relcancel/{uuid.uuid4().hex}"
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        slow = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10")
        try:
            lock = slow.semaphore_mutex(name)
            await lock.acquire()
            proxy.delay(0.2)
            release = asyncio.create_task(lock.release())
            await asyncio.sleep(0.05)  # the delete is on the wire
            release.cancel()
            with pytest.raises(asyncio.CancelledError):
                await release
            # the release ran to completion before the cancellation surfaced
            assert await lock_nodes(observer) == []
        finally:
            proxy.heal()
            await slow.close()


@pytest.mark.asyncio
async def test_lost_create_reply_adopts_the_node(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    name = f"adopt/{uuid.uuid4().hex}"
    parent = lock_path(Family.MUTEX, name)
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        slow = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10")
        try:
            internals = slow._zk.internals
            await internals.ensure_parents(parent, None)
            proxy.delay(0.3)
            create = asyncio.create_task(internals.create(parent, "lock", b"me", None))
            await until(lambda: _no_nodes_but(observer, 1), what="node created on the server")
            proxy.cut()  # the reply is lost with the connection
            proxy.heal()
            node = await create
            children = await observer.get_children(parent)
            assert children == [node.name]  # adopted, not duplicated
            data, stat = await observer.get(f"{parent}/{node.name}")
            assert data == b"me"
            assert node.czxid == stat.created_zxid
            assert node.session_id == stat.ephemeral_owner == slow.session_id
            await internals.delete(node)
            assert await lock_nodes(observer) == []
        finally:
            proxy.heal()
            await slow.close()


@pytest.mark.asyncio
async def test_waiter_node_deleted_behind_our_back(
    backend: ZooKeeperBackend, zk_url: str, observer: Any
) -> None:
    name = f"behind/{uuid.uuid4().hex}"
    other = await _connect(zk_url)
    try:
        holder = Held(other.mutex(name))
        assert await holder.wait()
        waiting = Held(backend.mutex(name))
        await until(lambda: _no_nodes_but(observer, 2), what="waiter queued")
        parts = await backend.mutex(name).participants()
        assert parts[1].node is not None
        await observer.delete(parts[1].node, force=True)
        # only a hint for the successor (none here); the waiter notices at its
        # next wake-up (the hand-off reads its own node first), queues again,
        # and still gets the lock, on a node that exists
        await holder.release()
        assert await waiting.wait()
        assert len(await lock_nodes(observer)) == 1
        await waiting.release()
        assert waiting.was_lost is False
        assert await lock_nodes(observer) == []
    finally:
        await other.close()


def _total_watches(server: ZooKeeperServer) -> int:
    match = re.search(r"Total watches:(\d+)", server.four_letter("wchs"))
    assert match is not None
    return int(match.group(1))


@pytest.mark.asyncio
async def test_no_herd_one_watch_per_waiter_one_wake_per_release(
    zookeeper_restartable: ZooKeeperServer,
) -> None:
    url = f"{zookeeper_restartable.url}?session_timeout={SESSION_TIMEOUT}"
    name = f"herd/{uuid.uuid4().hex}"
    a = await _connect(url)
    b = await _connect(url)
    try:
        holder = Held(b.mutex(name))
        assert await holder.wait()
        baseline = await asyncio.to_thread(_total_watches, zookeeper_restartable)
        waiters = [Held(a.mutex(name)) for _ in range(50)]
        await until(lambda: _queue_len(b, name, 51), what="50 waiters queued")
        watches = await asyncio.to_thread(_total_watches, zookeeper_restartable)
        # one predecessor watch per waiter, plus the holder's watch on its own
        # node: the waiters changed the children under it, so it read its own
        # node with a watch, once, to learn of a deletion behind its back
        # ("wchs" counts data watches; the child watches are not in it)
        assert watches - baseline == 51
        sent = count_requests(a)
        await holder.release()
        first = waiters[0]
        assert await first.wait()
        # flush: events for the delete reach us before this reply does
        await a.mutex(f"{name}-flush").participants()
        await asyncio.sleep(0)
        listings = [r for r in sent() if r == "GetChildrenRequest"]
        # only the flush's listing: the woken waiter watched the sole node
        # ahead of it, so its deletion is the handoff (no re-list), and no
        # other waiter was woken
        assert len(listings) == 1
        assert sum(w.acquired.is_set() for w in waiters) == 1
        for w in waiters:
            await w.release()
    finally:
        await a.close()
        await b.close()


async def _queue_len(backend: aiolocks.Backend, name: str, n: int) -> bool:
    return len(await backend.mutex(name).participants()) >= n


async def _run_workers(args: list[list[str]]) -> None:
    procs = [await asyncio.create_subprocess_exec(sys.executable, WORKER, *a) for a in args]
    codes = await asyncio.gather(*(p.wait() for p in procs))
    assert codes == [0] * len(procs)


@pytest.mark.asyncio
async def test_200_waiters_in_4_processes_drain_fifo(
    backend: ZooKeeperBackend, zk_url: str, observer: Any, tmp_path: Path
) -> None:
    name = f"fifo-mp/{uuid.uuid4().hex}"
    log = tmp_path / "order.log"
    gate = backend.mutex(name)
    closed = asyncio.Event()

    async def gatekeeper() -> None:
        async with gate:  # everyone queues behind us first
            closed.set()
            await until(lambda: _queue_len(backend, name, 201), timeout=60, what="200 queued")

    async def workers() -> None:
        await closed.wait()
        await _run_workers([["fifo", zk_url, name, "50", str(log)] for _ in range(4)])

    await asyncio.gather(gatekeeper(), workers())
    tokens = [int(line) for line in log.read_text().split()]
    assert len(tokens) == 200
    # tokens are the czxids of the queue nodes, i.e. arrival order: FIFO means sorted
    assert tokens == sorted(tokens) and len(set(tokens)) == 200
    assert await lock_nodes(observer) == []


@pytest.mark.asyncio
async def test_counter_in_zookeeper_is_exact_across_processes(
    backend: ZooKeeperBackend, zk_url: str, observer: Any, chroot: str
) -> None:
    name = f"counter/{uuid.uuid4().hex}"
    await observer.create("/counter", b"0")
    await _run_workers([["counter", zk_url, name, "5", "8", "/counter"] for _ in range(3)])
    assert int(await observer.get_data("/counter")) == 3 * 5 * 8
    assert await lock_nodes(observer) == []


@pytest.mark.asyncio
async def test_semaphore_cancel_at_every_point_leaks_no_lease(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    """Including a cancel while the turnstile is released after the leases were taken."""
    name = f"semcancel/{uuid.uuid4().hex}"
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        slow = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10")
        try:
            sem = slow.semaphore(name, 2)
            warm = await sem.acquire()
            assert warm is not None
            await warm.release()
            proxy.delay(0.005)
            for step in range(30):
                task = asyncio.create_task(sem.acquire_many(2))
                await asyncio.sleep(step * 0.003)
                task.cancel()
                try:
                    leases = await task
                except asyncio.CancelledError:
                    leases = None
                for lease in leases or ():
                    await lease.release()
                await until(lambda: _no_nodes_but(observer, 0), what=f"clean after step {step}")
            proxy.heal()
            leases = await sem.acquire_many(2, timeout=5)
            assert leases is not None
            for lease in leases:
                await lease.release()
        finally:
            proxy.heal()
            await slow.close()


@pytest.mark.asyncio
async def test_protected_node_of_another_session_is_not_adopted(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    """A node with our uuid but another session's ``ephemeralOwner`` is deleted, not used."""
    name = f"foreign/{uuid.uuid4().hex}"
    parent = lock_path(Family.MUTEX, name)
    internals = backend._zk.internals
    await internals.ensure_parents(parent, None)
    uid = str(uuid.uuid4())
    # the observer's session creates a node that looks like one of our attempts
    foreign = await observer.create(
        f"{parent}/_c_{uid}-lock-", b"x", ephemeral=True, sequential=True
    )
    assert await internals._find_protected(parent, uid, None) is None
    await until(lambda: _gone(observer, foreign), what="foreign node deleted")


async def _gone(client: Any, path: str) -> bool:
    return not await client.exists(path)


@pytest.mark.asyncio
async def test_outage_raises_backend_unavailable(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        slow = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10&connect_timeout=1")
        try:
            proxy.refuse()
            proxy.cut()
            with pytest.raises(aiolocks.BackendUnavailableError):
                await slow.mutex(f"outage/{uuid.uuid4().hex}").acquire()
        finally:
            proxy.heal()
            await slow.close()


@pytest.mark.asyncio
async def test_lock_tree_deleted_behind_our_back(
    backend: ZooKeeperBackend, zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    """Even the chroot vanishing between two holds is repaired on the next acquire."""
    name = f"tree/{uuid.uuid4().hex}"
    async with backend.mutex(name):
        pass
    root = aiozk.ZKClient(zookeeper_server.hosts, session_timeout=10)
    await root.start()
    try:
        await root.deleteall(chroot)
        async with backend.mutex(name) as lock:
            assert lock.fencing_token is not None
            assert len(await lock.participants()) == 1
        assert await root.exists(f"{chroot}{lock_path(Family.MUTEX, name)}")
    finally:
        await root.close()
