"""The Redis record store against real servers: losses, cancellation, key layout.

The contract itself is checked for every backend in
``tests/conformance/test_records.py``; these tests attack what is Redis's
own: keys deleted or re-created behind an ephemeral record's back, a server
that stops answering, cancellation at every await point of every method,
a create that reaches Redis after its caller gave it up, and where the keys
and channels live (under the key prefix, one Cluster slot per prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import pytest_asyncio
import redis.asyncio

import aiolocks
from aiolocks._core.records import Entry
from aiolocks.redis._driver import RedisDriver
from aiolocks.redis._records import RedisRecords, record_keys
from aiolocks.redis._watchdog import Renewal
from aiolocks.testing.proxy import TcpProxy
from aiolocks.testing.servers import RedisCluster, RedisServer

from ..polling import eventually, settle

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]

#: how long an emptied prefix's index lingers (``LINGER`` in ``records.lua``), ms
LINGER_MS = 60_000


def _store(backend: aiolocks.Backend) -> RedisRecords:
    driver = backend._driver
    assert isinstance(driver, RedisDriver)
    return driver.records()


@pytest.fixture
def name() -> str:
    """A record prefix of this test only."""
    return f"records/{uuid.uuid4().hex[:10]}"


@pytest_asyncio.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """A plain client on the shared server (decoded replies)."""
    raw = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        yield raw
    finally:
        await raw.aclose()


async def assert_nothing_lasting(
    raw: redis.asyncio.Redis, prefix: str, within: int = LINGER_MS + 5_000
) -> None:
    """Only what expires by itself, within ``within`` ms, is left under
    ``prefix``: emptied indexes (their last version), outcome keys, expiring
    records. (An index may still list a child that lapsed or was deleted
    behind our back: the next snapshot drops it, and the index goes anyway.)"""
    for key in await raw.keys(f"{prefix}*"):
        left = await raw.pttl(key)  # -2: it went meanwhile
        assert left == -2 or 0 <= left <= within, f"{key!r} stays ({left} ms)"


@pytest.mark.parametrize("overwrite", [False, True])
async def test_an_ephemeral_record_deleted_behind_its_back_is_lost(
    redis_server: RedisServer, client: redis.asyncio.Redis, prefix: str, name: str, overwrite: bool
) -> None:
    """Found by the renewal (keyspace events off), gone or overwritten with another type."""
    url = f"{redis_server.url}?key_prefix={prefix}&lease_time=1&keyspace_events=off"
    async with aiolocks.connect(url) as backend:
        await backend.open()
        entry = await _store(backend).join(f"{name}/me", b"x")
        assert entry is not None
        keys = record_keys(prefix, name, "me")
        if overwrite:
            await client.set(keys.record, "not a hash")
        else:
            assert await client.delete(keys.record) == 1
        await eventually(lambda: entry.lost, 10, what="the renewal to find the key gone")
        assert entry.lost_reason is not None
        assert ("WRONGTYPE" if overwrite else "gone") in entry.lost_reason
        await client.delete(keys.record)
    await assert_nothing_lasting(client, prefix)


async def test_a_record_taken_over_by_another_session_is_lost_and_left_to_it(
    redis_server: RedisServer, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    url = f"{redis_server.url}?key_prefix={prefix}&lease_time=1"
    keys = record_keys(prefix, name, "seat")
    async with aiolocks.connect(url) as first, aiolocks.connect(url) as second:
        await first.open()
        await second.open()
        mine = await _store(first).join(f"{name}/seat", b"first")
        assert mine is not None
        await client.delete(keys.record)
        theirs = await _store(second).join(f"{name}/seat", b"second")
        assert theirs is not None
        await eventually(lambda: mine.lost, 10, what="the first member to notice")
        await first.close()  # an orderly close deletes only its own records
        record = await _store(second).read(f"{name}/seat")
        assert record is not None and record.value == b"second" and record.ephemeral
        assert not theirs.lost
    await assert_nothing_lasting(client, prefix)


@pytest.mark.parametrize("behind_its_back", ["delete", "take over"])
async def test_keyspace_events_make_the_loss_prompt(
    redis_server: RedisServer,
    client: redis.asyncio.Redis,
    prefix: str,
    name: str,
    behind_its_back: str,
) -> None:
    """With a 60 s lease the first renewal is 20 s away: only the record
    key's keyspace event can tell the entry within the test. (An overwrite
    with another type publishes no event of the classes listened to; the
    renewal finds it.)"""
    url = f"{redis_server.url}?key_prefix={prefix}&lease_time=60"
    keys = record_keys(prefix, name, "me")
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as rival:
        await backend.open()
        await rival.open()
        entry = await _store(backend).join(f"{name}/me", b"x")
        assert entry is not None
        hub = backend._driver.node.hub
        channel = f"__keyspace@0__:{keys.record}"
        await eventually(lambda: hub.is_confirmed(channel), 10, what="the keyspace watch")
        assert await client.delete(keys.record) == 1
        if behind_its_back == "take over":
            assert await _store(rival).join(f"{name}/me", b"rival") is not None
        await eventually(lambda: entry.lost, 10, what="the event to tell the entry")
    await assert_nothing_lasting(client, prefix, within=LINGER_MS + 65_000)


async def test_an_unreachable_server_loses_the_entry_within_its_lease(
    redis_server: RedisServer, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    async with TcpProxy(redis_server.host, redis_server.port) as proxy:
        url = f"redis://{proxy.netloc}?lease_time=1&connect_timeout=1&key_prefix={prefix}"
        async with aiolocks.connect(url) as backend:
            await backend.open()
            entry = await _store(backend).join(f"{name}/me", b"x")
            assert entry is not None
            proxy.stall()
            await eventually(lambda: entry.lost, 10, what="the entry to be lost")
            assert entry.lost_reason is not None and "lease" in entry.lost_reason
            proxy.heal()
    # nobody renews it any more: the server lets it go by itself
    record = record_keys(prefix, name, "me").record
    await eventually(lambda: _absent(client, record), 10, what="the record to lapse")
    await assert_nothing_lasting(client, prefix)


async def test_a_snapshot_sees_a_dead_members_record_lapse_without_a_bound(
    redis_server: RedisServer, url: str, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    """A member whose process stops answering publishes nothing when its
    record lapses: ``changed(None)`` still returns, by the lease it read."""
    async with (
        TcpProxy(redis_server.host, redis_server.port) as proxy,
        aiolocks.connect(url) as observer,
    ):
        member_url = f"redis://{proxy.netloc}?lease_time=1&connect_timeout=1&key_prefix={prefix}"
        async with aiolocks.connect(member_url) as member:
            await member.open()
            await observer.open()
            entry = await _store(member).join(f"{name}/m", b"x")
            assert entry is not None
            store = _store(observer)
            snap = await store.snapshot(name)
            assert "m" in snap.records
            proxy.stall()  # the member's renewals stop reaching Redis
            try:
                async with asyncio.timeout(15):
                    while "m" in snap.records:
                        await snap.changed(None)
                        snap.close()
                        snap = await store.snapshot(name)
            finally:
                snap.close()
            proxy.heal()
    await assert_nothing_lasting(client, prefix)


async def test_a_pubsub_reconnect_wakes_a_snapshot(
    redis_server: RedisServer, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    """Messages may be lost while pub/sub reconnects: waiting snapshots return (and read again)."""
    async with TcpProxy(redis_server.host, redis_server.port) as proxy:
        url = f"redis://{proxy.netloc}?key_prefix={prefix}"
        async with aiolocks.connect(url) as backend:
            await backend.open()
            with await _store(backend).snapshot(name) as snap:
                waiter = asyncio.ensure_future(snap.changed(None))
                await asyncio.sleep(0)
                assert not waiter.done()
                assert proxy.cut() > 0
                await asyncio.wait_for(waiter, 10)
    await assert_nothing_lasting(client, prefix)


async def test_every_wait_on_a_snapshot_returns_on_a_write(
    url: str, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    async with aiolocks.connect(url) as backend:
        await backend.open()
        store = _store(backend)
        with await store.snapshot(name) as snap:
            waiters = [asyncio.ensure_future(snap.changed(None)) for _ in range(3)]
            await asyncio.sleep(0)
            assert not any(w.done() for w in waiters)
            assert await store.create(f"{name}/new", b"1") is not None
            await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert await store.delete(f"{name}/new")
    await assert_nothing_lasting(client, prefix)


async def test_racing_writers_one_wins(
    url: str, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    """Creates of one key from many backends: one version; updates at one
    version: one winner; deletes: one True."""
    async with contextlib.AsyncExitStack() as stack:
        stores = []
        for _ in range(6):
            backend = await stack.enter_async_context(aiolocks.connect(url))
            await backend.open()
            stores.append(_store(backend))
        key = f"{name}/race"
        created = await asyncio.gather(*(s.create(key, b"%d" % i) for i, s in enumerate(stores)))
        winners = [v for v in created if v is not None]
        assert len(winners) == 1
        updated = await asyncio.gather(
            *(s.update(key, b"u%d" % i, version=winners[0]) for i, s in enumerate(stores))
        )
        assert len([v for v in updated if v is not None]) == 1
        deleted = await asyncio.gather(*(s.delete(key) for s in stores))
        assert deleted.count(True) == 1
        joined = await asyncio.gather(*(s.join(key, b"j") for s in stores))
        assert len([e for e in joined if e is not None]) == 1
    # (the index covers the joined record's lease, 30 s, past its delete)
    await assert_nothing_lasting(client, prefix, within=LINGER_MS + 35_000)


async def _absent(raw: redis.asyncio.Redis, key: str) -> bool:
    return not await raw.exists(key)


async def test_deleting_an_ephemeral_record_stops_its_renewal(
    redis_server: RedisServer, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    url = f"{redis_server.url}?key_prefix={prefix}&lease_time=1"
    async with aiolocks.connect(url) as backend:
        await backend.open()
        store = _store(backend)
        entry = await store.join(f"{name}/me", b"x")
        assert entry is not None
        assert not _renewal(entry).stopped
        assert await store.delete(f"{name}/me")
        assert _renewal(entry).stopped and not entry.lost
        # a failed delete (wrong version) of a live one keeps it renewed
        again = await store.join(f"{name}/me", b"y")
        assert again is not None
        assert not await store.delete(f"{name}/me", version=again.version + 1)
        assert not _renewal(again).stopped and not again.lost
    assert not again.lost, "an orderly close is no loss"
    await assert_nothing_lasting(client, prefix)


def _renewal(entry: Entry) -> Renewal:
    renewal = getattr(entry.handle, "renewal", None)
    assert isinstance(renewal, Renewal)
    return renewal


async def _cancelled_at_every_step(
    call: Callable[[int], Awaitable[object]],
    check: Callable[[int, bool], Awaitable[None]],
    prepare: Callable[[int], Awaitable[None]] | None = None,
) -> int:
    """Run ``call(i)`` cancelled after i = 0, 1, 2... event-loop steps until it
    finishes first; ``check(i, finished)`` after each (``prepare(i)`` before).
    Returns how many steps the call took (every await point was hit)."""
    for steps in range(200):
        if prepare is not None:
            await prepare(steps)
        task = asyncio.ensure_future(call(steps))
        for _ in range(steps):
            await asyncio.sleep(0)
        finished = task.done()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            assert not finished
        await check(steps, finished)
        if finished:
            return steps
    raise AssertionError("the call never finished")


async def test_a_cancelled_create_or_join_leaves_no_record(
    url: str, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    async with aiolocks.connect(url) as backend:
        await backend.open()
        store = _store(backend)
        index = record_keys(prefix, name).index
        for kind in ("create", "expiring", "join"):

            async def call(i: int, kind: str = kind) -> object:
                key = f"{name}/{kind}-{i}"
                if kind == "join":
                    return await store.join(key, b"v")
                return await store.create(key, b"v", ttl=60 if kind == "expiring" else None)

            async def check(i: int, finished: bool, kind: str = kind) -> None:
                await settle(backend)  # the clean-up of a cancelled write ran
                record = record_keys(prefix, name, f"{kind}-{i}").record
                if finished:
                    assert await client.exists(record), "a finished write is there"
                    assert await store.delete(f"{name}/{kind}-{i}")
                else:
                    assert not await client.exists(record), f"{kind} cancelled at step {i} stayed"
                assert f"{kind}-{i}" not in await client.hkeys(index)

            steps = await _cancelled_at_every_step(call, check)
            assert steps > 1, "the call had await points to cancel at"
    await assert_nothing_lasting(client, prefix, within=2 * LINGER_MS)


async def test_cancelled_updates_deletes_reads_and_snapshots_leave_nothing_astray(
    url: str, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    async with aiolocks.connect(url) as backend:
        await backend.open()
        store = _store(backend)
        hub = backend._driver.node.hub
        channel = record_keys(prefix, name).channel
        version = await store.create(f"{name}/a", b"0")
        assert version is not None

        async def update(i: int) -> object:
            record = await store.read(f"{name}/a")
            assert record is not None
            return await store.update(f"{name}/a", str(i).encode(), version=record.version)

        async def update_checked(i: int, finished: bool) -> None:
            record = await store.read(f"{name}/a")
            assert record is not None and record.ttl is None
            assert not finished or record.value == str(i).encode()

        await _cancelled_at_every_step(update, update_checked)

        async def create(i: int) -> None:
            assert await store.create(f"{name}/d{i}", b"x") is not None

        async def delete(i: int) -> object:
            return await store.delete(f"{name}/d{i}")

        async def delete_checked(i: int, finished: bool) -> None:
            await settle(backend)
            gone = await store.read(f"{name}/d{i}") is None
            assert gone or not finished
            assert (f"d{i}" in await client.hkeys(record_keys(prefix, name).index)) != gone
            if not gone:
                assert await store.delete(f"{name}/d{i}")

        await _cancelled_at_every_step(delete, delete_checked, create)

        async def snapshot(i: int) -> object:
            with await store.snapshot(name) as snap:
                return snap.records

        async def snapshot_checked(i: int, finished: bool) -> None:
            entry = hub._channels.get(channel)
            assert entry is None or not entry.listeners, "a cancelled snapshot still listens"

        await _cancelled_at_every_step(snapshot, snapshot_checked)
        assert await store.delete(f"{name}/a")
    await assert_nothing_lasting(client, prefix)


async def test_a_create_reaching_redis_after_its_clean_up_writes_nothing(
    url: str, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    """The create of a cancelled caller may reach Redis after the clean-up
    (another connection): the clean-up's outcome key makes it lose."""
    async with aiolocks.connect(url) as backend:
        await backend.open()
        store = _store(backend)
        keys = record_keys(prefix, name, "late")
        op_id = store._mint()
        await store._abandon(keys, op_id, give_up=0)  # the clean-up first
        reply = await store._call(keys, "create", op_id, [b"v", 0, ""], "a late create")
        assert int(reply[0]) == -1
        assert not await client.exists(keys.record)
        assert await store.read(f"{name}/late") is None
    await assert_nothing_lasting(client, prefix)


async def test_resent_writes_answer_as_the_first_send(
    url: str, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    """redis-py resends a command after a connection error: a write that ran
    answers its resend the same way (same version; a delete: True)."""
    async with aiolocks.connect(url) as backend:
        await backend.open()
        store = _store(backend)
        keys = record_keys(prefix, name, "r")
        op = store._mint()
        first = await store._call(keys, "create", op, [b"v", 0, ""], "create")
        assert await store._call(keys, "create", op, [b"v", 0, ""], "create") == first
        version = int(first[1])
        op = store._mint()
        update = [b"w", 0, version]
        newer = await store._call(keys, "update", op, update, "update")
        assert int(newer[0]) == 1
        assert await store._call(keys, "update", op, update, "update") == newer
        op = store._mint()
        assert await store._call(keys, "delete", op, ["", ""], "delete") == 1
        assert await store._call(keys, "delete", op, ["", ""], "delete") == 1
        assert await store._call(keys, "delete", store._mint(), ["", ""], "delete") == 0
    await assert_nothing_lasting(client, prefix)


async def test_versions_never_come_back_even_after_the_index_went(
    url: str, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    async with aiolocks.connect(url) as backend:
        await backend.open()
        store = _store(backend)
        versions: list[int] = []
        for _ in range(3):
            version = await store.create(f"{name}/x", b"v")
            assert version is not None
            versions.append(version)
            assert await store.delete(f"{name}/x")
            # as if the emptied index had lingered out: its counter is gone
            await client.delete(record_keys(prefix, name).index)
        assert versions == sorted(set(versions)), f"a version came back: {versions}"
    await assert_nothing_lasting(client, prefix)


async def test_keys_and_channel_sit_under_the_key_prefix(
    url: str, client: redis.asyncio.Redis, prefix: str, name: str
) -> None:
    async with aiolocks.connect(url) as backend:
        await backend.open()
        store = _store(backend)
        assert await store.create(f"{name}/kept", b"1") is not None
        assert await store.create(f"{name}/short", b"2", ttl=30) is not None
        entry = await store.join(f"{name}/member", b"3")
        assert entry is not None
        index = record_keys(prefix, name).index
        assert index == f"{prefix}{{records:{name}}}"
        assert sorted(await client.keys(f"{prefix}*")) == sorted(
            [index, f"{index}/kept", f"{index}/short", f"{index}/member"]
        )
        assert await client.pttl(index) == -1, "a persistent child keeps its index"
        assert await backend.list_locks() == [], "records are no locks to `aiolocks list`"
        with await store.snapshot(name):
            assert index in await client.pubsub_channels(f"{prefix}*")
        assert await store.delete(f"{name}/kept")
        # only expiring children left: the index expires after the last of them
        assert 30_000 < await client.pttl(index) <= 30_000 + LINGER_MS
    await assert_nothing_lasting(client, prefix, within=30_000 + LINGER_MS)


async def test_a_cluster_prefix_lives_in_one_slot(redis_cluster: RedisCluster, name: str) -> None:
    prefix = f"aiolocks-test-{uuid.uuid4().hex[:10]}:"
    url = f"{redis_cluster.url}?key_prefix={prefix}"
    raw = redis.asyncio.RedisCluster.from_url(
        redis_cluster.url.replace("redis+cluster://", "redis://").split(",")[0],
        decode_responses=True,
    )
    try:
        async with aiolocks.connect(url) as backend:
            await backend.open()
            store = _store(backend)
            children = [f"c{i}" for i in range(8)]
            for child in children:
                assert await store.create(f"{name}/{child}", b"v", ttl=60) is not None
            with await store.snapshot(name) as snap:
                assert sorted(snap.records) == children
            keys = [record_keys(prefix, name, c) for c in children]
            names = [keys[0].index, *(k.record for k in keys), *keys[0].script_keys("x")]
            slots = {await raw.cluster_keyslot(key) for key in names}
            assert len(slots) == 1, f"one prefix over {len(slots)} slots"
            for child in children:
                assert await store.delete(f"{name}/{child}")
    finally:
        await raw.aclose()


#: the least-privilege ACL line of docs/security.md, for the key prefix ``locks:``
LOCKER_ACL = (
    "locker on >L0ckerPw ~locks:* &locks:* &__keyspace@*__:locks:* "
    "-@all +@read +@write +@scripting +@pubsub +@connection +time -@dangerous"
)


@pytest.fixture(scope="module")
def acl_redis() -> Iterator[RedisServer]:
    """A server whose ``locker`` user has exactly the documented ACL line."""
    with RedisServer(password="Adm1nPw", acl_users=[LOCKER_ACL]) as server:
        yield server


async def test_the_documented_acl_covers_the_record_store(acl_redis: RedisServer) -> None:
    base = f"redis://locker:L0ckerPw@127.0.0.1:{acl_redis.port}/0?keyspace_events=listen"
    name = f"acl/{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(f"{base}&key_prefix=locks:") as backend:
        await backend.open()
        store = _store(backend)
        version = await store.create(f"{name}/a", b"1", ttl=30)
        assert version is not None
        entry = await store.join(f"{name}/m", b"2")
        assert entry is not None
        hub = backend._driver.node.hub
        channel = f"__keyspace@0__:{record_keys('locks:', name, 'm').record}"
        await eventually(lambda: hub.is_confirmed(channel), 10, what="the keyspace watch")
        with await store.snapshot(name) as snap:
            assert sorted(snap.records) == ["a", "m"]
            assert await store.update(f"{name}/a", b"3", version=version) is not None
            await asyncio.wait_for(snap.changed(None), 10)
        assert await store.delete(f"{name}/a")
    async with aiolocks.connect(f"{base}&key_prefix=elsewhere:") as outside:
        await outside.open()
        with pytest.raises(aiolocks.AccessDeniedError):
            await _store(outside).create(f"{name}/a", b"1")
