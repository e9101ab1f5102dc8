"""A held node deleted behind our back, or an expired session, cancels the body at once.

No timed assertions: each test waits for the cancellation with a generous
bound (without prompt loss the body would sleep for an hour and the bound
would fail the test) and checks the order of events instead.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

import aiolocks
from aiolocks.testing.servers import ZooKeeperServer
from aiolocks.zookeeper import ZooKeeperBackend

from .conftest import Held, count_requests, expire_session, lock_nodes, own_session, until

pytestmark = [pytest.mark.asyncio, pytest.mark.zookeeper]

#: generous: the loss is reported within a round trip; this only ends a hung test
BOUND = 30.0


async def _delete_all(observer: Any) -> list[str]:
    """Delete every lock/lease node, as an operator would; the deleted paths."""
    nodes = await lock_nodes(observer)
    for node in nodes:
        await observer.delete(node)
    return nodes


async def _run_until_lost(
    body_cm: Callable[[], AbstractAsyncContextManager[Any]],
    event: Callable[[], Awaitable[object]],
) -> list[str]:
    """Run a body that sleeps for an hour under ``body_cm``; ``event`` happens meanwhile.

    Returns the order of what happened; the body must end in LockLostError.
    """
    order: list[str] = []
    inside = asyncio.Event()

    async def body() -> None:
        try:
            async with body_cm():
                order.append("holding")
                inside.set()
                await asyncio.sleep(3600)
                order.append("slept an hour")
        except aiolocks.LockLostError as exc:
            order.append(f"lost: {exc}")

    task = asyncio.create_task(body())
    await asyncio.wait_for(inside.wait(), BOUND)
    await event()
    order.append("event done")
    await asyncio.wait_for(task, BOUND)
    return order


def _lost_after_event(order: list[str], reason: str) -> None:
    """The body held, then the loss cut it short (before or after the deleter's reply)."""
    assert len(order) == 3, order
    assert order[0] == "holding", order
    rest = order[1:]
    assert "event done" in rest and sum(o.startswith("lost: ") for o in rest) == 1, order
    assert reason in next(o for o in order if o.startswith("lost: ")), order


DELETED = "deleted behind our back"


@pytest.mark.parametrize("kind", ["mutex", "semaphore_mutex", "read", "write"])
async def test_deleting_the_held_node_cancels_the_body(
    backend: ZooKeeperBackend, zk_url: str, observer: Any, kind: str
) -> None:
    name = f"prompt/{uuid.uuid4().hex}"
    if kind in ("read", "write"):
        lock: aiolocks.Lock = getattr(backend.read_write_lock(name), kind)
    else:
        lock = getattr(backend, kind)(name)
    deleted: list[str] = []

    async def delete() -> None:
        deleted.extend(await _delete_all(observer))

    order = await _run_until_lost(lambda: lock, delete)
    assert len(deleted) == 1
    _lost_after_event(order, DELETED)
    assert lock.is_lost
    # nothing leaks, and the lock is free for somebody else
    await until(lambda: _no_nodes(observer), what="no nodes left")
    other = await aiolocks.connect(zk_url)
    try:
        rival = (
            getattr(other.read_write_lock(name), kind)
            if kind in ("read", "write")
            else (getattr(other, kind)(name))
        )
        assert await rival.acquire(timeout=BOUND)
        await rival.release()
    finally:
        await other.close()


async def _no_nodes(observer: Any) -> bool:
    return await lock_nodes(observer) == []


async def test_deleting_a_node_while_waiters_queue_cancels_the_body(
    backend: ZooKeeperBackend, zk_url: str, observer: Any
) -> None:
    """The holder moved to its own-node watch (waiters changed the children): still prompt."""
    name = f"prompt/q-{uuid.uuid4().hex}"
    other = await aiolocks.connect(zk_url)
    lock = backend.mutex(name)
    waiters: list[asyncio.Task[bool]] = []
    try:
        held_nodes: list[str] = []

        async def queue_then_delete() -> None:
            held_nodes.extend(await lock_nodes(observer))
            assert len(held_nodes) == 1
            waiters.extend(
                asyncio.create_task(other.mutex(name).acquire(timeout=BOUND)) for _ in range(2)
            )
            await until(lambda: _count(observer, 3), what="two waiters queued")
            await observer.delete(held_nodes[0])

        order = await _run_until_lost(lambda: lock, queue_then_delete)
        _lost_after_event(order, DELETED)
        # exclusion holds: the first waiter got it, the second still waits
        first = await asyncio.wait_for(asyncio.shield(waiters[0]), BOUND)
        assert first
        assert not waiters[1].done()
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await other.close()
    await until(lambda: _no_nodes(observer), what="no nodes left")


async def _count(observer: Any, n: int) -> bool:
    return len(await lock_nodes(observer)) == n


async def test_deleting_a_lease_node_cancels_the_lease_body(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    sem = backend.semaphore(f"prompt/sem-{uuid.uuid4().hex}", max_leases=2)
    deleted: list[str] = []

    async def delete() -> None:
        # the background own-node read may still be on its way: the loss
        # is reported either by its NoNode or by the watch it set
        deleted.extend(await _delete_all(observer))

    order = await _run_until_lost(lambda: sem.lease(timeout=BOUND), delete)
    assert len(deleted) == 1 and "/leases/" in deleted[0]
    _lost_after_event(order, DELETED)
    await until(lambda: _no_nodes(observer), what="no nodes left")


async def test_deleting_the_leader_node_ends_the_term_without_a_release(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    latch = backend.leader_latch(f"prompt/leader-{uuid.uuid4().hex}", participant_id="a")
    lost: list[str] = []
    backend.add_event_hook(lambda e: lost.append(e.kind) if e.kind == "lost" else None)
    async with latch:
        assert await latch.wait_for_leadership(timeout=BOUND)
        first = latch.fencing_token
        assert len(await _delete_all(observer)) == 1
        # the term ends (a "lost" event) and the latch queues again and leads anew
        await until(lambda: bool(lost), timeout=BOUND, what="lost event")
        await until(
            lambda: latch.has_leadership and latch.fencing_token != first,
            timeout=BOUND,
            what="a new term",
        )
        assert first is not None and latch.fencing_token is not None
        assert latch.fencing_token > first


async def test_waiting_while_held_costs_no_extra_request_uncontended(
    backend: ZooKeeperBackend,
) -> None:
    """The prompt-loss watch rides on the acquire's listing: still three requests."""
    lock = backend.mutex(f"prompt/cost-{uuid.uuid4().hex}")
    async with lock:
        pass
    sent = count_requests(backend)
    async with lock:
        await asyncio.sleep(0)
    assert sent() == ["Create2Request", "GetChildrenRequest", "DeleteRequest"]


async def test_session_expiry_cancels_the_body(
    zookeeper_server: ZooKeeperServer, backend: ZooKeeperBackend
) -> None:
    lock = backend.mutex(f"prompt/expiry-{uuid.uuid4().hex}")

    async def expire() -> None:
        await expire_session(zookeeper_server.hosts, backend)

    order = await _run_until_lost(lambda: lock, expire)
    assert order[0] == "holding" and "slept an hour" not in order
    assert any(o.startswith("lost: ") for o in order)
    assert lock.is_lost


def _live_callbacks(backend: ZooKeeperBackend) -> list[tuple[int, str]]:
    callbacks = own_session(backend).watch_callbacks
    return [key for key, cbs in callbacks.items() if cbs]


async def test_no_watch_callback_is_left_behind(
    backend: ZooKeeperBackend, zk_url: str, observer: Any
) -> None:
    """Holds, hand-offs, leases, timeouts and a cancelled waiter leave no callback."""
    name = f"prompt/leak-{uuid.uuid4().hex}"
    other = await aiolocks.connect(zk_url)
    try:
        rival = other.mutex(name)
        assert await rival.acquire(timeout=BOUND)
        lock = backend.mutex(name)
        assert not await lock.acquire(timeout=0.05)  # timed out while queued
        waiter = Held(lock, timeout=BOUND)
        await until(lambda: _count(observer, 2), what="waiter queued")
        await rival.release()
        assert await waiter.wait()  # a hand-off
        await waiter.release()
        assert waiter.was_lost is False
        assert await rival.acquire(timeout=BOUND)
        cancelled = asyncio.create_task(backend.mutex(name).acquire(timeout=BOUND))
        await until(lambda: _count(observer, 2), what="second waiter queued")
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        await rival.release()
        sem = backend.semaphore(name, max_leases=2)
        leases = await sem.acquire_many(2, timeout=BOUND)
        assert leases is not None
        for lease in leases:
            await lease.release()
        rw = backend.read_write_lock(name)
        async with rw.write, rw.read:
            pass
    finally:
        await other.close()
    await until(lambda: _no_nodes(observer), what="no nodes left")
    assert _live_callbacks(backend) == []
