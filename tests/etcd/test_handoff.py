"""Direct hand-off between the etcd backends of one process, against a real server.

A release whose transaction finds, at the head of the queue, the key of a
waiting exclusive attempt of any live etcd backend of this process (same
cluster, same prefix) hands that attempt the lock: no watch event, no
transaction of its own. These tests break it on purpose: waiters cancelled
at every step around the hand-off, the successor's lease revoked just before
and just after the release, a backend dropped while registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

import aiolocks
from aiolocks._core.driver import Family, Grant, Mode, Request
from aiolocks.etcd._client import DeleteOp, EtcdClient, RangeOp
from aiolocks.etcd._driver import _PEERS, EtcdDriver
from aiolocks.etcd._url import parse_etcd_url

from ..polling import eventually
from ._alone import close_alone, open_alone

pytestmark = pytest.mark.etcd

PATIENCE = 30.0


@pytest_asyncio.fixture
async def backends(url: str) -> AsyncIterator[tuple[aiolocks.Backend, aiolocks.Backend]]:
    async with aiolocks.connect(url) as a, aiolocks.connect(url) as b:
        yield a, b


def _driver(backend: aiolocks.Backend) -> EtcdDriver:
    driver = backend._driver
    assert isinstance(driver, EtcdDriver)
    return driver


def _request(who: str) -> Request:
    return Request(name="h", family=Family.MUTEX, mode=Mode.EXCLUSIVE, participant=who)


async def _keys(url: str) -> list[bytes]:
    options = parse_etcd_url(url)
    async with EtcdClient(list(options.endpoints)) as client:
        result = await client.range(RangeOp.of(options.prefix + "/", prefix=True, keys_only=True))
    return [kv.key for kv in result.kvs]


async def _queued(lock: Any, count: int) -> None:
    """Until ``count`` keys stand in the lock's queue (holder included)."""

    async def queued() -> bool:
        return len(await lock.participants()) >= count

    await eventually(queued, PATIENCE, what=f"{count} keys in the queue", interval=0.005)


def _on_release_txn(
    driver: EtcdDriver, before: Callable[[], Awaitable[None]], after: Callable[[], Awaitable[None]]
) -> None:
    """Run ``before``/``after`` around the next release transaction of ``driver``."""
    client = driver.client
    txn = client.txn

    async def hooked(*args: Any, **kwargs: Any) -> Any:
        success = args[1] if len(args) > 1 else kwargs.get("success", ())
        if not success or not isinstance(success[0], DeleteOp):
            return await txn(*args, **kwargs)
        del client.txn  # once
        await before()
        result = await txn(*args, **kwargs)
        await after()
        return result

    client.txn = hooked  # type: ignore[method-assign]


def _clean(*drivers: EtcdDriver) -> None:
    for driver in drivers:
        assert driver._queued == {}
        assert driver._peers.waiting == {}
        assert driver._peers.behind == {}


async def _nothing() -> None:
    return None


@pytest.mark.asyncio
@pytest.mark.parametrize("waiting", [True, False], ids=["watching", "tried-only"])
async def test_release_hands_the_lock_to_a_waiter_of_another_backend(
    url: str, waiting: bool
) -> None:
    """Watching, the waiter is known to stand right behind the released key:
    the release reads its key alone. Having only tried (not waiting yet), it
    is found by the release's read of the head of the queue."""
    options = parse_etcd_url(url)
    first, second = EtcdDriver(options), EtcdDriver(options)
    await open_alone(first)
    await open_alone(second)
    try:
        assert first._peers is second._peers  # same cluster, same prefix
        holder = await first.try_once(first.begin(_request("holder")))
        assert holder is not None
        waiter = second.begin(_request("waiter"))
        assert await second.try_once(waiter) is None
        wait: asyncio.Task[None] | None = None
        if waiting:
            wait = asyncio.create_task(second.wait_for_change(waiter, PATIENCE))
            await eventually(
                lambda: waiter.woken is not None, PATIENCE, what="the wait", interval=0.005
            )
        released: list[object] = []
        first_txn = first.client.txn

        async def seen_txn(*args: Any, **kwargs: Any) -> Any:
            released.append(args[1][1])  # the read after the delete
            return await first_txn(*args, **kwargs)

        first.client.txn = seen_txn  # type: ignore[method-assign]
        sent: list[object] = []
        txn = second.client.txn

        async def counting_txn(*args: Any, **kwargs: Any) -> Any:
            sent.append(args)
            return await txn(*args, **kwargs)

        second.client.txn = counting_txn  # type: ignore[method-assign]
        assert await first.release(holder[0])
        del first.client.txn
        (read,) = released
        assert isinstance(read, RangeOp)
        if wait is not None:
            assert read.key == waiter.keys[0] and not read.range_end  # that key alone
            async with asyncio.timeout(PATIENCE):
                await wait
        else:
            assert read.range_end  # the head of the queue
        assert waiter.handoff == waiter.revision
        grants = await second.try_once(waiter)
        second.finish(waiter)
        assert grants is not None and grants[0].token > holder[0].token
        assert sent == []  # taken with no transaction of the waiter's backend
        assert await second.release(grants[0])
        _clean(first, second)
        assert await _keys(url) == []
    finally:
        await close_alone(first)
        await close_alone(second)


@pytest.mark.asyncio
async def test_the_registry_keeps_no_backend_alive(url: str) -> None:
    options = parse_etcd_url(url)
    kept = EtcdDriver(options)
    await open_alone(kept)
    try:
        dropped = EtcdDriver(options)
        await open_alone(dropped)
        peers = dropped._peers
        assert peers is kept._peers
        session = dropped._session
        assert session is not None and peers.by_lease[session.lease_id] is dropped
        gone = weakref.ref(dropped)
        await close_alone(dropped)
        assert session.lease_id not in peers.by_lease  # closed: no hand-off to it
        del dropped, session
        gc.collect()
        assert gone() is None
        group = (asyncio.get_running_loop(), kept.client.cluster_id, kept.root)
        assert _PEERS[group] is peers
    finally:
        await close_alone(kept)
    del kept, peers
    gc.collect()
    assert group not in _PEERS  # the last backend gone: nothing left


CANCEL_POINTS = ["before-send", "in-flight", "after-answer", "after-release", "1-turn", "3-turns"]


@pytest.mark.asyncio
@pytest.mark.parametrize("point", CANCEL_POINTS)
async def test_waiter_cancelled_around_the_hand_off(
    backends: tuple[aiolocks.Backend, aiolocks.Backend], url: str, point: str
) -> None:
    """B (other backend) is next in line and is cancelled at a step of A's
    release; C waits behind B. Never two holders, tokens in grant order,
    the lock reaches C, nothing is left anywhere."""
    a, b = backends
    holder, lock_b, lock_c = a.mutex("h"), b.mutex("h"), a.mutex("h")
    inside = 0
    tokens: list[int] = []

    async def take(lock: Any) -> None:
        nonlocal inside
        async with lock:
            inside += 1
            try:
                assert inside == 1
                tokens.append(lock.fencing_token or 0)
                await asyncio.sleep(0.001)
            finally:
                inside -= 1

    await holder.acquire()
    tokens.append(holder.fencing_token or 0)
    task_b = asyncio.create_task(take(lock_b))
    await _queued(holder, 2)
    task_c = asyncio.create_task(take(lock_c))
    await _queued(holder, 3)

    async def cancel_b() -> None:
        task_b.cancel()

    async def in_flight() -> None:
        asyncio.get_running_loop().call_soon(task_b.cancel)

    if point == "before-send":
        _on_release_txn(_driver(a), cancel_b, _nothing)
    elif point == "in-flight":
        _on_release_txn(_driver(a), in_flight, _nothing)
    elif point == "after-answer":
        _on_release_txn(_driver(a), _nothing, cancel_b)
    await holder.release()
    if point == "after-release":
        task_b.cancel()
    elif point.endswith("turn") or point.endswith("turns"):
        for _ in range(int(point.split("-")[0])):
            await asyncio.sleep(0)
        task_b.cancel()
    async with asyncio.timeout(PATIENCE):
        with contextlib.suppress(asyncio.CancelledError):
            await task_b
        await task_c
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens) >= 2
    _clean(_driver(a), _driver(b))
    assert await _keys(url) == []


@pytest.mark.asyncio
@pytest.mark.parametrize("when", ["before", "after"])
async def test_successor_lease_revoked_around_the_release(
    backends: tuple[aiolocks.Backend, aiolocks.Backend], url: str, when: str
) -> None:
    """B's session lease is revoked just before A's release transaction (B's
    key is gone: the lock goes to C, and B gets it after C in a new session)
    or just after it (B may have been handed the lock as the owner at that
    revision: then it holds the lower token and its body ends in
    LockLostError; or it finds its key gone and queues again behind C)."""
    a, b = backends
    holder, lock_b, lock_c = a.mutex("h"), b.mutex("h"), a.mutex("h")
    tokens: dict[str, int] = {}
    b_lost = False
    c_done = asyncio.Event()

    async def take_b() -> None:
        nonlocal b_lost
        try:
            async with lock_b:
                tokens["b"] = lock_b.fencing_token or 0
                await c_done.wait()
        except aiolocks.LockLostError:
            b_lost = True

    async def take_c() -> None:
        async with lock_c:
            tokens["c"] = lock_c.fencing_token or 0
        c_done.set()

    await holder.acquire()
    first = holder.fencing_token or 0
    task_b = asyncio.create_task(take_b())
    await _queued(holder, 2)
    task_c = asyncio.create_task(take_c())
    await _queued(holder, 3)
    session = _driver(b)._session
    assert session is not None
    old_lease = session.lease_id

    async def revoke() -> None:
        await _driver(a).client.lease_revoke(old_lease)

    if when == "before":
        _on_release_txn(_driver(a), revoke, _nothing)
    else:
        _on_release_txn(_driver(a), _nothing, revoke)
    await holder.release()
    async with asyncio.timeout(PATIENCE):
        await asyncio.gather(task_b, task_c)
    assert first < min(tokens.values()) and tokens["b"] != tokens["c"]
    if when == "before":
        assert tokens["c"] < tokens["b"] and not b_lost
    else:
        # The lower token of two holds that may have overlapped was lost.
        assert b_lost == (tokens["b"] < tokens["c"])
    if not b_lost:
        # It queued again, in a new session (a lost hold's backend learns
        # that its lease is gone at its next keep-alive).
        new_session = _driver(b)._session
        assert new_session is not None and new_session.lease_id != old_lease
    _clean(_driver(a), _driver(b))
    assert await _keys(url) == []


@pytest.mark.asyncio
async def test_no_hand_off_to_a_waiter_whose_session_its_backend_considers_lost(url: str) -> None:
    options = parse_etcd_url(url)
    first, second = EtcdDriver(options), EtcdDriver(options)
    await open_alone(first)
    await open_alone(second)
    try:
        holder = await first.try_once(first.begin(_request("holder")))
        assert holder is not None
        waiter = second.begin(_request("waiter"))
        assert await second.try_once(waiter) is None
        session = second._session
        assert session is not None
        # The backend has given the session up (its deadline passed), while
        # etcd still has the lease and the key.
        await session.keeper.aclose()
        second._session_lost(session, "test: deadline passed")
        assert await first.release(holder[0])  # its read finds the waiter's key at the head
        assert waiter.handoff == 0
        await first.client.lease_revoke(session.lease_id)  # as etcd would, a little later
        # The next try starts over in a new session: never a grant on the old key.
        async with asyncio.timeout(PATIENCE):
            while (grants := await second.try_once(waiter)) is None:
                await second.wait_for_change(waiter, 1.0)
        second.finish(waiter)
        assert grants[0].request.participant == "waiter"
        assert second._session is not None and second._session is not session
        hold: Grant = grants[0]
        assert hold.token > holder[0].token
        assert await second.release(hold)
        _clean(first, second)
        assert await _keys(url) == []
    finally:
        await close_alone(first)
        await close_alone(second)


def test_backends_on_other_event_loops_are_not_peers(url: str) -> None:
    """A hand-off sets the waiter's future: only drivers of one event loop hand each other locks."""
    options = parse_etcd_url(url)
    found: list[object] = []

    async def open_one() -> None:
        driver = EtcdDriver(options)
        await open_alone(driver)
        try:
            found.append(driver._peers)
            assert driver._session is not None
            assert driver._peers.by_lease[driver._session.lease_id] is driver
        finally:
            await close_alone(driver)

    async def both() -> None:
        first = EtcdDriver(options)
        await open_alone(first)
        try:
            await asyncio.to_thread(asyncio.run, open_one())  # another loop, same cluster
            found.append(first._peers)
        finally:
            await close_alone(first)

    asyncio.run(both())
    assert len(found) == 2 and found[0] is not found[1]
