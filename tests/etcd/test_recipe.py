"""The etcd recipe against a real server, driven the way the engine drives it
(begin / try_once / wait_for_change / abandon / finish / release)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
import pytest_asyncio

from aiolocks._core.driver import Family, Grant, Mode, Request
from aiolocks.etcd._client import EtcdClient, RangeOp, Watch
from aiolocks.etcd._driver import EtcdAttempt, EtcdDriver
from aiolocks.etcd._url import parse_etcd_url
from aiolocks.testing import EtcdServer

from ..polling import eventually
from ._alone import close_alone, open_alone

pytestmark = pytest.mark.etcd

PATIENCE = 30.0


@pytest_asyncio.fixture
async def driver(url: str) -> AsyncIterator[EtcdDriver]:
    d = EtcdDriver(parse_etcd_url(url))
    await open_alone(d)
    try:
        yield d
    finally:
        await close_alone(d)


async def _acquire(driver: EtcdDriver, request: Request, timeout: float) -> Grant | None:
    """The engine's loop, reduced to what the driver contract says."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    attempt = driver.begin(request)
    try:
        while True:
            grants = await driver.try_once(attempt)
            if grants is not None:
                return grants[0]
            left = deadline - loop.time()
            if left <= 0:
                await driver.abandon(attempt)
                return None
            await driver.wait_for_change(attempt, left)
    except BaseException:
        await asyncio.shield(driver.abandon(attempt))
        raise
    finally:
        driver.finish(attempt)


def _request(name: str, mode: Mode = Mode.EXCLUSIVE, *, who: str = "p", n: int = 1) -> Request:
    family = {
        Mode.EXCLUSIVE: Family.MUTEX,
        Mode.LEASE: Family.SEMAPHORE,
        Mode.READ: Family.READ_WRITE,
        Mode.WRITE: Family.READ_WRITE,
    }[mode]
    return Request(name=name, family=family, mode=mode, participant=who, max_leases=n)


async def _keys(url: str) -> list[bytes]:
    options = parse_etcd_url(url)
    async with EtcdClient(list(options.endpoints)) as client:
        result = await client.range(RangeOp.of(options.prefix + "/", prefix=True, keys_only=True))
    return [kv.key for kv in result.kvs]


@pytest.mark.asyncio
async def test_mutex_excludes_and_tokens_increase_and_nothing_leaks(
    driver: EtcdDriver, url: str
) -> None:
    inside = 0
    most = 0
    tokens: list[int] = []

    async def worker(index: int) -> None:
        nonlocal inside, most
        for _ in range(4):
            grant = await _acquire(driver, _request("a/b", who=f"w{index}"), PATIENCE)
            assert grant is not None
            inside += 1
            most = max(most, inside)
            tokens.append(grant.token)
            await asyncio.sleep(0.005)
            inside -= 1
            assert await driver.release(grant)

    await asyncio.gather(*(worker(i) for i in range(6)))
    assert most == 1
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens) == 24
    assert await _keys(url) == []
    # Every hold's loss watch and every waiter's watch is closed again.
    await eventually(
        lambda: not any(isinstance(s, Watch) for s in driver._client._streams),
        PATIENCE,
        what="every watch closed",
    )


@pytest.mark.asyncio
async def test_key_names_are_used_again_once_gone_never_shared_while_live(
    driver: EtcdDriver, url: str
) -> None:
    """etcd indexes every key name ever written until compaction: a busy lock reuses its names."""

    def key_of(grant: Grant) -> bytes:
        hold = grant.handle
        assert hold is not None
        return hold.key  # type: ignore[attr-defined, no-any-return]

    keys = set()
    for _ in range(4):
        grant = await _acquire(driver, _request("reuse"), PATIENCE)
        assert grant is not None
        keys.add(key_of(grant))
        assert await driver.release(grant)
    assert len(keys) == 1  # one name, written again and again
    # A released hold released once more gives its name back only once: two
    # live attempts after that still have keys of their own.
    first = await _acquire(driver, _request("reuse"), PATIENCE)
    assert first is not None
    assert await driver.release(first)
    assert not await driver.release(first)
    holder = await _acquire(driver, _request("reuse"), PATIENCE)
    assert holder is not None
    waiter = driver.begin(_request("reuse"))
    assert await driver.try_once(waiter) is None
    assert waiter.keys and waiter.keys[0] != key_of(holder)
    waiting_key = waiter.keys[0]
    await driver.abandon(waiter)  # answered: its name may be used again...
    driver.finish(waiter)
    again = driver.begin(_request("reuse"))
    assert await driver.try_once(again) is None
    assert again.keys == [waiting_key]  # ...by the next attempt, while the holder keeps its own
    await driver.abandon(again)
    driver.finish(again)
    assert await driver.release(holder)
    assert await _keys(url) == []


async def _participants_at_least(
    driver: EtcdDriver, name: str, family: Family, count: int
) -> bool:
    return len(await driver.participants(name, family)) >= count


async def _waiting_for(driver: EtcdDriver, waiter: EtcdAttempt) -> None:
    """Until ``waiter`` waits on its watch (listed since its try, to be handed the lock)."""
    assert driver._queued.get(waiter.keys[0]) is waiter
    await eventually(lambda: waiter.woken is not None, PATIENCE, what="the wait", interval=0.005)


@pytest.mark.asyncio
async def test_release_hands_the_lock_to_the_next_waiter_of_the_same_driver(
    driver: EtcdDriver, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = await _acquire(driver, _request("hand"), PATIENCE)
    assert holder is not None
    waiter = driver.begin(_request("hand", who="next"))
    assert await driver.try_once(waiter) is None
    wait = asyncio.create_task(driver.wait_for_change(waiter, PATIENCE))
    await _waiting_for(driver, waiter)
    sent: list[object] = []
    txn = driver.client.txn

    async def counting_txn(*args: object, **kwargs: object) -> object:
        sent.append(args)
        return await txn(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(driver.client, "txn", counting_txn)
    assert await driver.release(holder)
    async with asyncio.timeout(PATIENCE):
        await wait
    assert len(sent) == 1  # the release only
    grants = await driver.try_once(waiter)
    assert grants is not None and len(sent) == 1  # taken without a transaction of its own
    assert grants[0].token > holder.token
    driver.finish(waiter)
    assert await _keys(url) == [grants[0].handle.key]  # type: ignore[attr-defined]
    assert await driver.release(grants[0])
    assert await _keys(url) == []


@pytest.mark.asyncio
async def test_no_handoff_to_a_waiter_whose_key_went_behind_our_back(
    driver: EtcdDriver, url: str
) -> None:
    holder = await _acquire(driver, _request("gone"), PATIENCE)
    assert holder is not None
    waiter = driver.begin(_request("gone", who="next"))
    assert await driver.try_once(waiter) is None
    gone_key, gone_revision = waiter.keys[0], waiter.revision
    assert gone_revision > holder.token
    wait = asyncio.create_task(driver.wait_for_change(waiter, PATIENCE))
    await _waiting_for(driver, waiter)
    await driver.client.delete(gone_key)  # as a lease expiry or `etcdctl del` would
    assert await driver.release(holder)
    async with asyncio.timeout(PATIENCE):
        await wait
    assert waiter.handoff == 0
    # Its next try finds its key gone and writes it again, at the back of the
    # queue: never a grant on the key that went.
    async with asyncio.timeout(PATIENCE):
        while (grants := await driver.try_once(waiter)) is None:
            await driver.wait_for_change(waiter, 1.0)
    driver.finish(waiter)
    assert grants[0].token > gone_revision
    assert await driver.release(grants[0])
    assert await _keys(url) == []


@pytest.mark.asyncio
async def test_names_that_are_prefixes_of_each_other_do_not_contend(driver: EtcdDriver) -> None:
    first = await _acquire(driver, _request("a/b"), PATIENCE)
    second = await _acquire(driver, _request("a/b/c"), PATIENCE)
    third = await _acquire(driver, _request("a/b", Mode.LEASE, n=1), PATIENCE)
    assert first is not None and second is not None and third is not None
    for grant in (first, second, third):
        assert await driver.release(grant)


@pytest.mark.asyncio
async def test_semaphore_admits_max_leases(driver: EtcdDriver, url: str) -> None:
    inside = 0
    most = 0

    async def worker() -> None:
        nonlocal inside, most
        grant = await _acquire(driver, _request("sem", Mode.LEASE, n=2), PATIENCE)
        assert grant is not None
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.05)
        inside -= 1
        assert await driver.release(grant)

    await asyncio.gather(*(worker() for _ in range(6)))
    assert most == 2
    assert await _keys(url) == []


@pytest.mark.asyncio
async def test_readers_share_and_a_queued_writer_blocks_later_readers(driver: EtcdDriver) -> None:
    r1 = await _acquire(driver, _request("rw", Mode.READ, who="r1"), PATIENCE)
    r2 = await _acquire(driver, _request("rw", Mode.READ, who="r2"), PATIENCE)
    assert r1 is not None and r2 is not None
    writer = asyncio.create_task(_acquire(driver, _request("rw", Mode.WRITE, who="w"), PATIENCE))
    # The writer is queued once it shows up as a waiter.
    await eventually(
        partial(_participants_at_least, driver, "rw", Family.READ_WRITE, 3),
        PATIENCE,
        what="the queued writer",
    )
    late_reader = await _acquire(driver, _request("rw", Mode.READ, who="r3"), 0.3)
    assert late_reader is None  # fair: it does not overtake the queued writer
    assert not writer.done()
    assert await driver.release(r1)
    assert await driver.release(r2)
    async with asyncio.timeout(PATIENCE):
        w = await writer
    assert w is not None and w.token > r2.token
    people = await driver.participants("rw", Family.READ_WRITE)
    assert [(p.id, p.is_holder, p.mode) for p in people] == [("w", True, "write")]
    assert await driver.release(w)


@pytest.mark.asyncio
async def test_key_deleted_behind_our_back_is_a_prompt_loss(
    driver: EtcdDriver, etcd: EtcdServer, url: str
) -> None:
    grant = await _acquire(driver, _request("gone"), PATIENCE)
    assert grant is not None
    lost = asyncio.Event()
    grant.add_loss_listener(lambda _: lost.set())
    prefix = parse_etcd_url(url).prefix
    await asyncio.to_thread(etcd.etcdctl, "del", "--prefix", prefix + "/")
    async with asyncio.timeout(PATIENCE):
        await lost.wait()
    assert grant.lost and "deleted behind our back" in (grant.lost_reason or "")
    assert not await driver.release(grant)
    # Someone else can take it now.
    again = await _acquire(driver, _request("gone"), PATIENCE)
    assert again is not None and again.token > grant.token
    assert await driver.release(again)


@pytest.mark.asyncio
async def test_lease_revoked_holds_are_lost_and_waiters_go_on_in_a_new_session(
    driver: EtcdDriver, etcd: EtcdServer
) -> None:
    holder = await _acquire(driver, _request("s", who="holder"), PATIENCE)
    assert holder is not None
    waiter = asyncio.create_task(_acquire(driver, _request("s", who="waiter"), PATIENCE))
    await eventually(
        partial(_participants_at_least, driver, "s", Family.MUTEX, 2), PATIENCE, what="the waiter"
    )
    lost = asyncio.Event()
    holder.add_loss_listener(lambda _: lost.set())
    session = driver._session
    assert session is not None
    await asyncio.to_thread(etcd.etcdctl, "lease", "revoke", f"{session.lease_id:x}")
    async with asyncio.timeout(PATIENCE):
        await lost.wait()
        granted = await waiter
    assert granted is not None and granted.token > holder.token
    new_session = driver._session
    assert new_session is not None and new_session.lease_id != session.lease_id
    assert await driver.release(granted)
    assert not await driver.release(holder)


@pytest.mark.asyncio
async def test_timeout_and_cancellation_leave_no_key(url: str) -> None:
    # request_timeout=1: the tombstones' leases (twice that) run out sooner.
    url = url.replace("request_timeout=2", "request_timeout=1")
    driver = EtcdDriver(parse_etcd_url(url))
    await open_alone(driver)
    try:
        await _cancellations_leave_no_key(driver, url)
    finally:
        await close_alone(driver)


async def _cancellations_leave_no_key(driver: EtcdDriver, url: str) -> None:
    holder = await _acquire(driver, _request("t"), PATIENCE)
    assert holder is not None
    assert await _acquire(driver, _request("t"), 0.2) is None
    for delay in (0, 0.001, 0.01, 0.05):
        task = asyncio.create_task(_acquire(driver, _request("t"), PATIENCE))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    keys = await _keys(url)
    queued = [key for key in keys if b"\x00abandoned\x00" not in key]
    assert len(queued) == 1, keys  # the holder's key only; tombstones may wait out their grace
    assert await driver.release(holder)
    async def no_keys() -> bool:
        return not await _keys(url)

    # tombstones go after their grace period
    await eventually(no_keys, PATIENCE, what="no key left", interval=0.2)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("holder_mode", "waiter_mode"),
    [
        (Mode.EXCLUSIVE, Mode.EXCLUSIVE),
        (Mode.WRITE, Mode.WRITE),
        (Mode.WRITE, Mode.READ),
        (Mode.LEASE, Mode.LEASE),
    ],
    ids=["mutex", "writer", "reader", "semaphore"],
)
async def test_a_change_between_the_read_and_the_watch_is_not_missed(
    driver: EtcdDriver, client: EtcdClient, holder_mode: Mode, waiter_mode: Mode, url: str
) -> None:
    """A waiter's watch starts from *now* (etcd serves a watch from a past revision
    only every 100 ms); the key it waits for going before the watch exists is
    still noticed (the read after the watch), so the wait ends instead of hanging."""
    holder = await _acquire(driver, _request("gap", holder_mode, who="holder"), PATIENCE)
    assert holder is not None
    waiter = driver.begin(_request("gap", waiter_mode, who="waiter"))
    assert await driver.try_once(waiter) is None
    starts: list[object] = []
    watch = driver.client.watch
    waiting = asyncio.current_task()

    async def late_watch(*args: Any, **kwargs: Any) -> Watch:
        # Only the waiter's watch is under test. The holder's loss watch (its
        # own task, started 50 ms after the grant, from the revision after its
        # key's creation) goes through the same client method; under load it
        # starts during this wait, and must pass through untouched.
        if asyncio.current_task() is not waiting:
            return await watch(*args, **kwargs)
        starts.append(kwargs.get("start_revision", 0))
        # The holder's key goes between the waiter's read and its watch.
        await client.delete(holder.handle.key)  # type: ignore[attr-defined]
        return await watch(*args, **kwargs)

    driver.client.watch = late_watch  # type: ignore[method-assign]
    try:
        async with asyncio.timeout(PATIENCE):
            await driver.wait_for_change(waiter, None)  # returns: it never waits forever
    finally:
        del driver.client.watch
    assert starts == [0]  # from now
    grants = await driver.try_once(waiter)
    assert grants is not None and grants[0].token > holder.token
    driver.finish(waiter)
    assert await driver.release(grants[0])
    assert not await driver.release(holder)  # its key was deleted behind its back
    assert await _keys(url) == []
