"""The ZooKeeper record store against a real server: what the conformance suite cannot force.

Sessions expired from outside, nodes deleted and written behind the store's
back, expiry judged by the server's clock (the process's own clock is made
wrong on purpose), where the nodes live in both layouts, and cancellation
at every request of every method.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiozk
import pytest
import pytest_asyncio
from aiozk import protocol

import aiolocks
from aiolocks._core.records import Entry
from aiolocks.testing.proxy import TcpProxy
from aiolocks.testing.servers import ZooKeeperServer
from aiolocks.zookeeper import ZooKeeperBackend
from aiolocks.zookeeper._records import ZooKeeperRecords

from .conftest import expire_session, until

pytestmark = [pytest.mark.zookeeper, pytest.mark.asyncio]

ROOT = "/aiolocks/records"


def _store(backend: ZooKeeperBackend) -> ZooKeeperRecords:
    return backend._zk.records()


@pytest.fixture
def key() -> str:
    return f"group-{uuid.uuid4().hex[:8]}/member"


@pytest_asyncio.fixture
async def second(zk_url: str) -> AsyncIterator[ZooKeeperBackend]:
    """Another process's backend on the same chroot."""
    backend = await aiolocks.connect(zk_url)
    assert isinstance(backend, ZooKeeperBackend)
    try:
        yield backend
    finally:
        await backend.close()


def _header(ttl_ms: int) -> bytes:
    """A record header as the store writes it (magic, write id, ttl in ms)."""
    return struct.pack(">4s16sQ", b"alr1", uuid.uuid4().bytes, ttl_ms)


async def record_nodes(client: Any, path: str = ROOT) -> dict[str, bytes]:
    """Every record node (data with the store's header) under ``path``, by path."""
    found: dict[str, bytes] = {}
    try:
        children = await client.get_children(path)
    except aiozk.exc.NoNode:
        return found
    for child in children:
        full = f"{path}/{child}"
        try:
            data = await client.get_data(full)
        except aiozk.exc.NoNode:
            continue
        if data and data.startswith(b"alr1"):
            found[full] = data
        found.update(await record_nodes(client, full))
    return found


# -- ephemeral entries: lost with their session or their node ------------------------------


async def test_session_expiry_marks_the_entry_lost(
    zookeeper_server: ZooKeeperServer, backend: ZooKeeperBackend, observer: Any, key: str
) -> None:
    store = _store(backend)
    entry = await store.join(key, b"me")
    assert entry is not None
    assert f"{ROOT}/{key}" in await record_nodes(observer)
    await expire_session(zookeeper_server.hosts, backend)
    await until(lambda: entry.lost, what="the entry to be marked lost")
    assert entry.lost_reason is not None and "expired" in entry.lost_reason
    assert await store.read(key) is None, "the ephemeral node outlived its session"
    # the key is free again, for a new entry in the new session
    again = await store.join(key, b"me again")
    assert again is not None and not again.lost and again.version != entry.version


async def test_node_deleted_behind_its_back_marks_the_entry_lost(
    backend: ZooKeeperBackend, observer: Any, key: str
) -> None:
    store = _store(backend)
    entry = await store.join(key, b"me")
    assert entry is not None
    # an update consumes the server's data watch: the store must watch again
    for value in (b"one", b"two"):
        newer = await store.update(key, value, version=entry.version)
        assert newer is not None
        entry.version = newer
    lost: list[Entry] = []
    entry.add_loss_listener(lost.append)
    await observer.delete(f"{ROOT}/{key}")
    await until(lambda: entry.lost, what="the entry to be marked lost")
    assert lost == [entry]
    assert entry.lost_reason is not None and "deleted" in entry.lost_reason


async def test_own_delete_and_close_are_no_loss(
    backend: ZooKeeperBackend, observer: Any, key: str
) -> None:
    store = _store(backend)
    entry = await store.join(key, b"me")
    assert entry is not None
    # updated first: the node no longer carries the join's write id
    newer = await store.update(key, b"updated", version=entry.version)
    assert newer is not None
    entry.version = newer
    assert not await store.delete(key, version=entry.version + 1), "deleted at a wrong version"
    assert await store.delete(key, version=entry.version)
    other = await store.join(key, b"again")
    assert other is not None
    newer = await store.update(key, b"updated", version=other.version)
    assert newer is not None
    await backend.close()
    assert await record_nodes(observer) == {}
    assert not entry.lost and not other.lost


async def test_an_aiozk_client_backend_deletes_its_entries_at_close(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any, key: str
) -> None:
    """The application's session outlives the backend: its ephemeral records must not."""
    client = aiozk.ZKClient(zookeeper_server.hosts, chroot=chroot, session_timeout=10)
    await client.start()
    try:
        backend = ZooKeeperBackend(client)
        await backend.open()
        entry = await _store(backend).join(key, b"me")
        assert entry is not None and await record_nodes(observer)
        assert await _store(backend).update(key, b"updated", version=entry.version) is not None
        await backend.close()
        assert await record_nodes(observer) == {}, "a departed member stayed in the group"
        assert not entry.lost
    finally:
        await client.close()


# -- expiry by the server's clock --------------------------------------------------------


async def test_expiry_is_judged_by_the_server_clock(
    backend: ZooKeeperBackend, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's wall clock is decades off: the server's ``mtime`` decides alone."""
    store = _store(backend)
    prefix = f"clock-{uuid.uuid4().hex[:8]}"
    await observer.ensure_path(f"{ROOT}/{prefix}")
    # written by someone else: expired 1 ms after the server took it
    await observer.create(f"{ROOT}/{prefix}/old", _header(1) + b"old")
    assert await store.create(f"{prefix}/long", b"long", ttl=600) is not None
    for wrong in (0.0, time.time() + 10 * 365 * 86400):
        monkeypatch.setattr(time, "time", lambda wrong=wrong: wrong)
        assert await store.read(f"{prefix}/old") is None, f"expired record seen at time {wrong}"
        record = await store.read(f"{prefix}/long")
        assert record is not None, f"live record missed at time {wrong}"
        assert record.ttl is not None and 590 < record.ttl <= 600
        with await store.snapshot(prefix) as snap:
            assert sorted(snap.records) == ["long"]
    monkeypatch.undo()
    # the expired node found is deleted (in the background)
    await until(
        lambda: _absent(observer, f"{ROOT}/{prefix}/old"), what="the expired node to be deleted"
    )


async def _absent(client: Any, path: str) -> bool:
    return not await client.exists(path)


async def _settled(client: Any, store: ZooKeeperRecords, key: str) -> bool:
    """The store keeps an entry for ``key`` exactly while its node exists."""
    return bool(await client.exists(f"{ROOT}/{key}")) == (key in store._members)


async def _no_records(client: Any) -> bool:
    return await record_nodes(client) == {}


async def test_one_of_many_creators_takes_an_expired_record(
    backend: ZooKeeperBackend, second: ZooKeeperBackend, observer: Any
) -> None:
    """Creators racing over an expired node: exactly one wins, none deletes the winner's."""
    prefix = f"once-{uuid.uuid4().hex[:8]}"
    await observer.ensure_path(f"{ROOT}/{prefix}")
    for round_ in range(5):
        path = f"{ROOT}/{prefix}/job"
        if round_ == 0:
            await observer.create(path, _header(1) + b"expired")
        else:
            await observer.set_data(path, _header(1) + b"expired")
        stores = [_store(backend), _store(second)] * 3
        results = await asyncio.gather(
            *(s.create(f"{prefix}/job", f"run-{i}".encode(), ttl=600) for i, s in enumerate(stores))
        )
        winners = [i for i, version in enumerate(results) if version is not None]
        assert len(winners) == 1, f"round {round_}: {results}"
        record = await _store(second).read(f"{prefix}/job")
        assert record is not None and record.value == f"run-{winners[0]}".encode()
        assert record.version == results[winners[0]]


async def test_changed_wakes_at_the_expiry_without_any_event(
    backend: ZooKeeperBackend, key: str
) -> None:
    """ZooKeeper fires nothing on our ttl: ``changed()`` bounds itself by the earliest expiry."""
    store = _store(backend)
    prefix = key.rpartition("/")[0]
    assert await store.create(f"{prefix}/short", b"x", ttl=0.5) is not None
    assert await store.create(f"{prefix}/long", b"y", ttl=600) is not None
    with await store.snapshot(prefix) as snap:
        assert sorted(snap.records) == ["long", "short"]
        # unbounded, yet returns: a store without the expiry bound hangs here
        await asyncio.wait_for(snap.changed(None), 30)
    started = time.monotonic()
    while True:
        with await store.snapshot(prefix) as snap:
            if "short" not in snap.records:
                break
            await asyncio.wait_for(snap.changed(None), 30)
        assert time.monotonic() - started < 30, "the expiry was never seen"
    assert sorted(snap.records) == ["long"]


# -- where the nodes live ----------------------------------------------------------------


async def test_both_layouts_keep_records_in_one_folder(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any, key: str
) -> None:
    """``layout=curator`` keeps records under ``/aiolocks/records`` too: one group for all."""
    base = f"zk://{zookeeper_server.hosts}{chroot}"
    curator = await aiolocks.connect(f"{base}?layout=curator")
    default = await aiolocks.connect(base)
    assert isinstance(curator, ZooKeeperBackend) and isinstance(default, ZooKeeperBackend)
    try:
        entry = await _store(curator).join(key, b"curator")
        assert entry is not None
        assert list(await record_nodes(observer)) == [f"{ROOT}/{key}"]
        assert not await observer.exists(f"/{key}"), "a record in Curator's lock paths"
        record = await _store(default).read(key)
        assert record is not None and record.value == b"curator" and record.ephemeral
        assert await _store(default).join(key, b"default") is None
    finally:
        await curator.close()
        await default.close()


async def test_record_nodes_carry_the_creator_acl(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any, key: str
) -> None:
    """With credentials, records are writable by that identity only (readable by anyone)."""
    base = f"{zookeeper_server.hosts}{chroot}"
    owner = await aiolocks.connect(f"zk://alice:secret@{base}")
    stranger = await aiolocks.connect(f"zk://mallory:guess@{base}")
    assert isinstance(owner, ZooKeeperBackend) and isinstance(stranger, ZooKeeperBackend)
    try:
        version = await _store(owner).create(key, b"mine")
        assert version is not None
        record = await _store(stranger).read(key)
        assert record is not None and record.value == b"mine"
        with pytest.raises(aiolocks.AccessDeniedError):
            await _store(stranger).update(key, b"theirs", version=version)
        with pytest.raises(aiolocks.AccessDeniedError):
            await _store(stranger).delete(key)
        for path in (f"{ROOT}/{key}", f"{ROOT}/{key.rpartition('/')[0]}", ROOT):
            acl = await observer.get_acl(path)
            creator, world = sorted(acl, key=lambda a: a.id.scheme)
            assert creator.id.scheme == "digest" and creator.id.id.startswith("alice:"), path
            assert (world.id.scheme, world.id.id, world.perms) == ("world", "anyone", 1), path
        assert await _store(owner).delete(key, version=version)
    finally:
        await owner.close()
        await stranger.close()


async def test_doctor_does_not_report_records_as_lock_leftovers(
    backend: ZooKeeperBackend, key: str
) -> None:
    assert await _store(backend).create(key, b"persistent") is not None
    report = await backend.doctor()
    assert "zk-empty-lock-parents" not in report.codes(), report.render()
    assert "zk-stale-lock-nodes" not in report.codes(), report.render()


# -- cancellation at every request -------------------------------------------------------


class CancelAtRequest:
    """Cancel a task when the link sends its ``n``-th request, or when that reply arrives."""

    def __init__(self, backend: ZooKeeperBackend, n: int, *, after_reply: bool) -> None:
        link: Any = backend._zk.link
        self.link = link
        self.n = n
        self.after_reply = after_reply
        self.sent = 0
        self.task: asyncio.Task[Any] | None = None
        self._send = self.link.send

    def __enter__(self) -> CancelAtRequest:
        self.link.send = self._intercept
        return self

    def __exit__(self, *_: object) -> None:
        del self.link.send  # the class's method again

    def _intercept(self, request: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self._send(request)
        self.sent += 1
        task = self.task
        if self.sent == self.n and task is not None:
            if self.after_reply:
                fut.add_done_callback(lambda _: task.cancel())
            else:
                task.cancel()
        return fut


async def _sweep(
    backend: ZooKeeperBackend,
    operation: Callable[[], Awaitable[object]],
    check: Callable[[bool], Awaitable[None]],
) -> int:
    """Run ``operation`` cancelled at each of its requests (sent, then answered) until it
    completes; ``check(cancelled)`` after each run. The number of runs."""
    runs = 0
    for n in range(1, 40):
        for after_reply in (False, True):
            with CancelAtRequest(backend, n, after_reply=after_reply) as cancel:
                task = asyncio.ensure_future(operation())
                cancel.task = task
                try:
                    await task
                    cancelled = False
                except asyncio.CancelledError:
                    cancelled = True
            runs += 1
            await check(cancelled)
            if cancel.sent < n:
                return runs  # it finished before its n-th request: every point was hit
    raise AssertionError("the operation never completed")


def _record_watches(backend: ZooKeeperBackend) -> list[Any]:
    """Watch callbacks still registered on record paths (own session's table), but for the
    snapshot cache's own on the nodes it keeps."""
    session: Any = backend._zk.session
    cache = _store(backend)._cache
    kept = {f"{folder}/{name}" for folder, names in cache._folders.items() for name in names}
    return [
        key
        for key, callbacks in session.watch_callbacks.items()
        if ROOT in str(key) and [c for c in callbacks if not (c == cache._fired and key[1] in kept)]
    ]


@pytest.mark.parametrize(
    ("method", "over_expired", "requests"),
    [("create", False, 1), ("create", True, 4), ("join", False, 2), ("join", True, 6)],
)
async def test_cancelled_create_and_join_leave_no_node(
    backend: ZooKeeperBackend, observer: Any, method: str, over_expired: bool, requests: int
) -> None:
    """Cancelled at any request (a fresh key, or one an expired record holds): the key ends
    absent, or as it was, never holding a record nobody knows of."""
    store = _store(backend)
    key = f"cancel-{uuid.uuid4().hex[:8]}/{method}"
    path = f"{ROOT}/{key}"
    expired = _header(1) + b"expired"
    await observer.ensure_path(path.rpartition("/")[0])

    async def reset() -> None:
        if over_expired:
            await observer.create(path, expired)

    async def operation() -> object:
        if method == "join":
            return await store.join(key, b"v")
        return await store.create(key, b"v", ttl=60)

    async def untouched() -> bool:
        try:
            return bool(await observer.get_data(path) == expired)
        except aiozk.exc.NoNode:
            return True

    async def check(cancelled: bool) -> None:
        if cancelled:
            # the cleanup runs in the backend's task set
            await until(lambda: len(backend._tasks) == 0, what="the cleanup to finish")
            assert await untouched(), f"{key} neither removed nor left as it was"
            assert store._members == {}, "a cancelled join left an entry"
            if not await _absent(observer, path):
                await observer.delete(path)
        else:
            assert await store.delete(key)
        await until(lambda: _no_records(observer), what="no record node left")
        await reset()

    await reset()
    runs = await _sweep(backend, operation, check)
    assert runs > 2 * requests, f"{method}: fewer requests cancelled than expected ({runs})"


async def test_cancelled_update_delete_read_snapshot_leave_nothing(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    store = _store(backend)
    prefix = f"cancel-{uuid.uuid4().hex[:8]}"
    key = f"{prefix}/mine"
    entry = await store.join(key, b"start")
    assert entry is not None
    assert await store.create(f"{prefix}/ttl", b"t", ttl=600) is not None

    async def update() -> object:
        record = await store.read(key)
        assert record is not None
        return await store.update(key, b"next", version=record.version)

    async def delete_and_rejoin() -> object:
        record = await store.read(key)
        assert record is not None
        return await store.delete(key, version=record.version)

    async def snapshot() -> object:
        with await store.snapshot(prefix) as snap:
            return dict(snap.records)

    async def read() -> object:
        return await store.read(f"{prefix}/ttl")

    async def check(_cancelled: bool) -> None:
        held = store._members.get(key)
        member_path = f"{ROOT}/{key}"
        watches = [
            k for k in _record_watches(backend) if held is None or not k[1].endswith(member_path)
        ]
        assert watches == [], "a cancelled call left watch callbacks"
        # a delete cancelled in flight is settled in the backend's task set
        await until(lambda: len(backend._tasks) == 0, what="the background work to finish")
        assert await _settled(observer, store, key), (
            f"node exists: {await observer.exists(f'{ROOT}/{key}')}, entry: {store._members}"
        )
        if key not in store._members:
            assert await store.join(key, b"start") is not None  # deleted: join again
        nodes = await record_nodes(observer)
        assert sorted(nodes) == [f"{ROOT}/{prefix}/mine", f"{ROOT}/{prefix}/ttl"], nodes

    for operation in (update, snapshot, read, delete_and_rejoin):
        await _sweep(backend, operation, check)
    # the entry still reports a deletion behind its back
    held = store._members.get(key)
    assert held is not None
    current = held[0]
    await observer.delete(f"{ROOT}/{key}")
    await until(lambda: current.lost, what="the entry to be marked lost after the sweeps")
    assert _record_watches(backend) == [], "a cancelled call left watch callbacks"


# -- a write whose reply is lost with the connection -------------------------------------


@pytest.mark.parametrize("method", ["create", "join", "update"])
async def test_a_write_whose_reply_was_lost_is_read_back(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any, method: str
) -> None:
    """The server applied it, the connection broke before the reply: the call still
    reports its own write (not "exists"/"changed"), found by the write's id."""
    key = f"lost-{uuid.uuid4().hex[:8]}/{method}"
    path = f"{ROOT}/{key}"
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        slow = await aiolocks.connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10")
        assert isinstance(slow, ZooKeeperBackend)
        try:
            store = _store(slow)
            version = await store.create(f"{key}-warm", b"x")  # folders exist
            assert version is not None
            if method == "update":
                version = await store.create(key, b"old")
                assert version is not None
            proxy.delay(0.3)
            if method == "create":
                call: Awaitable[object] = store.create(key, b"new")
            elif method == "join":
                call = store.join(key, b"new")
            else:
                call = store.update(key, b"new", version=version)
            task = asyncio.ensure_future(call)
            await until(lambda: _holds(observer, path, b"new"), what="the write applied")
            proxy.cut()  # the reply is lost with the connection
            proxy.heal()
            result = await task
            data, stat = await observer.get(path)
            assert data.endswith(b"new")
            written = result.version if isinstance(result, Entry) else result
            assert written == stat.last_modified_zxid, f"{method} did not report its own write"
            if method == "join":
                assert stat.ephemeral_owner == slow.session_id
        finally:
            proxy.heal()
            await slow.close()


async def _holds(client: Any, path: str, value: bytes) -> bool:
    try:
        return bool((await client.get_data(path)).endswith(value))
    except aiozk.exc.NoNode:
        return False


async def test_an_entry_lost_while_its_session_lives_removes_its_node(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any, key: str
) -> None:
    """``suspended_is_lost``: a dropped connection loses the entry at once, but the session
    survives; once reconnected, the store removes the node nobody stands for any more."""
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        url = f"zk://{proxy.netloc}{chroot}?session_timeout=10&suspended_is_lost=1"
        backend = await aiolocks.connect(url)
        assert isinstance(backend, ZooKeeperBackend)
        try:
            entry = await _store(backend).join(key, b"me")
            assert entry is not None
            session = backend.session_id
            proxy.cut()
            await until(lambda: entry.lost, what="the entry to be lost on suspension")
            assert entry.lost_reason is not None and "suspended" in entry.lost_reason
            await until(lambda: _absent(observer, f"{ROOT}/{key}"), what="the orphan removed")
            assert backend.session_id == session, "the session was not meant to expire"
        finally:
            await backend.close()


async def test_a_snapshot_of_a_missing_prefix_wakes_when_it_appears(
    backend: ZooKeeperBackend, second: ZooKeeperBackend, key: str
) -> None:
    """No folder yet: an exists watch, not a poll, reports the first record."""
    prefix = key.rpartition("/")[0]
    with await _store(backend).snapshot(prefix) as snap:
        assert snap.records == {}
        waiter = asyncio.ensure_future(snap.changed(None))
        await asyncio.sleep(0)
        assert not waiter.done()
        assert await _store(second).create(key, b"first") is not None
        await asyncio.wait_for(waiter, 10)
    with await _store(backend).snapshot(prefix) as snap:
        assert {child: r.value for child, r in snap.records.items()} == {"member": b"first"}


# -- snapshots keep what they read while its data watch holds -----------------------------


class _Requests:
    """Counts the requests the backend's session sends (wraps its link's ``send``)."""

    def __init__(self, backend: ZooKeeperBackend) -> None:
        self.link: Any = backend._zk.monitor.link
        self.sent: list[Any] = []

    def __enter__(self) -> _Requests:
        send = self.link.send

        def counting(request: Any) -> Any:
            self.sent.append(request)
            return send(request)

        self.link.send = counting
        return self

    def __exit__(self, *_exc: object) -> None:
        del self.link.send  # the class's method again

    def reads(self) -> list[str]:
        """The paths of the data reads sent."""
        return [r.path for r in self.sent if isinstance(r, protocol.GetDataRequest)]


async def _values(store: ZooKeeperRecords, prefix: str) -> dict[str, bytes]:
    with await store.snapshot(prefix) as snap:
        return {child: record.value for child, record in snap.records.items()}


async def test_a_snapshot_reads_only_the_children_changed_since_the_last(
    backend: ZooKeeperBackend, second: ZooKeeperBackend
) -> None:
    """20 children: the second snapshot lists them and reads none; after another backend
    changes one, the next reads that one only, and sees its new value."""
    store = _store(backend)
    prefix = f"cache-{uuid.uuid4().hex[:8]}"
    expected = {f"m{i}": b"v%d" % i for i in range(20)}
    for child, value in expected.items():
        assert await store.create(f"{prefix}/{child}", value) is not None
    with _Requests(backend) as requests:
        assert await _values(store, prefix) == expected
    assert len(requests.reads()) == 20
    with _Requests(backend) as requests:
        assert await _values(store, prefix) == expected
    assert len(requests.sent) <= 2, requests.sent
    assert requests.reads() == []
    # another session writes one child: its watch event reaches us before any later reply
    other = _store(second)
    changed = await other.read(f"{prefix}/m7")
    assert changed is not None
    assert await other.update(f"{prefix}/m7", b"new", version=changed.version) is not None
    with _Requests(backend) as requests:
        assert await _values(store, prefix) == {**expected, "m7": b"new"}
    assert requests.reads() == [store._abs(f"{prefix}/m7")]
    assert len(requests.sent) == 2, requests.sent
    # a deleted child leaves the snapshot (and the cache), an added one is read
    assert await other.delete(f"{prefix}/m3")
    assert await other.create(f"{prefix}/m20", b"v20") is not None
    with _Requests(backend) as requests:
        values = await _values(store, prefix)
    assert values == {
        **{c: v for c, v in expected.items() if c != "m3"},
        "m7": b"new",
        "m20": b"v20",
    }
    assert requests.reads() == [store._abs(f"{prefix}/m20")]
    assert "m3" not in store._cache._folders.get(store._abs(f"{prefix}/m3").rpartition("/")[0], {})


async def test_a_session_expiry_drops_the_snapshot_cache(
    zookeeper_server: ZooKeeperServer, backend: ZooKeeperBackend, second: ZooKeeperBackend
) -> None:
    """The watches died with the session: the next snapshot reads every child again."""
    store = _store(backend)
    prefix = f"cache-{uuid.uuid4().hex[:8]}"
    expected = {f"m{i}": b"v%d" % i for i in range(5)}
    for child, value in expected.items():
        assert await store.create(f"{prefix}/{child}", value) is not None
    assert await _values(store, prefix) == expected
    assert store._cache._folders
    await expire_session(zookeeper_server.hosts, backend)
    assert store._cache._folders == {}
    changed = await _store(second).read(f"{prefix}/m1")
    assert changed is not None
    assert await _store(second).update(f"{prefix}/m1", b"new", version=changed.version)
    with _Requests(backend) as requests:
        assert await _values(store, prefix) == {**expected, "m1": b"new"}
    assert sorted(requests.reads()) == sorted(store._abs(f"{prefix}/{c}") for c in expected)
    with _Requests(backend) as requests:
        assert await _values(store, prefix) == {**expected, "m1": b"new"}
    assert requests.reads() == []


async def test_a_dropped_connection_drops_the_snapshot_cache(
    zookeeper_server: ZooKeeperServer, chroot: str, second: ZooKeeperBackend
) -> None:
    """Same session, but events may have been missed while away: everything is read again."""
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        backend = await aiolocks.connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10")
        assert isinstance(backend, ZooKeeperBackend)
        try:
            store = _store(backend)
            prefix = f"cache-{uuid.uuid4().hex[:8]}"
            expected = {f"m{i}": b"v%d" % i for i in range(5)}
            for child, value in expected.items():
                assert await store.create(f"{prefix}/{child}", value) is not None
            assert await _values(store, prefix) == expected
            assert store._cache._folders
            session = backend.session_id
            proxy.refuse(True)
            proxy.cut()
            await until(lambda: not store._cache._folders, what="the cache to be dropped")
            changed = await _store(second).read(f"{prefix}/m2")
            assert changed is not None
            assert await _store(second).update(f"{prefix}/m2", b"new", version=changed.version)
            proxy.heal()
            with _Requests(backend) as requests:
                assert await _values(store, prefix) == {**expected, "m2": b"new"}
            assert len(requests.reads()) == len(expected)
            assert backend.session_id == session, "the session was not meant to expire"
        finally:
            await backend.close()


async def test_an_aiozk_client_backend_keeps_no_snapshot_cache(
    zookeeper_server: ZooKeeperServer, chroot: str, second: ZooKeeperBackend
) -> None:
    """aiozk runs watch callbacks after the replies that follow them: nothing is kept."""
    client = aiozk.ZKClient(zookeeper_server.hosts, chroot=chroot, session_timeout=10)
    await client.start()
    try:
        backend = ZooKeeperBackend(client)
        await backend.open()
        try:
            store = _store(backend)
            prefix = f"cache-{uuid.uuid4().hex[:8]}"
            assert await store.create(f"{prefix}/a", b"old") is not None
            assert await _values(store, prefix) == {"a": b"old"}
            assert store._cache._folders == {}
            changed = await _store(second).read(f"{prefix}/a")
            assert changed is not None
            assert await _store(second).update(f"{prefix}/a", b"new", version=changed.version)
            assert await _values(store, prefix) == {"a": b"new"}
        finally:
            await backend.close()
    finally:
        await client.close()
