"""The etcd record store against real servers: its key layout and leases, losses behind its
back, and cancellation at every await of every method (the contract itself is
``tests/conformance/test_records.py``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

import aiolocks
from aiolocks._core.records import Entry
from aiolocks.etcd._client import EtcdClient, RangeOp, Watch
from aiolocks.etcd._driver import EtcdDriver
from aiolocks.etcd._records import FOLDER, EtcdRecords
from aiolocks.testing import EtcdServer, TcpProxy
from aiolocks.testing.pytest_plugin import require_managed

from ..polling import eventually

pytestmark = [pytest.mark.etcd, pytest.mark.asyncio]

PATIENCE = 20.0


@pytest_asyncio.fixture
async def backend(url: str) -> AsyncIterator[aiolocks.Backend]:
    """An open etcd backend under a fresh prefix (lease TTL 5 s)."""
    async with aiolocks.connect(url) as opened:
        await opened.open()
        yield opened


def _driver(backend: aiolocks.Backend) -> EtcdDriver:
    driver = backend._driver
    assert isinstance(driver, EtcdDriver)
    return driver


def _store(backend: aiolocks.Backend) -> EtcdRecords:
    return _driver(backend).records()


def _full(backend: aiolocks.Backend, key: str) -> bytes:
    return _driver(backend).root + FOLDER + key.encode()


async def _raw(client: EtcdClient, backend: aiolocks.Backend, key: str) -> Any:
    return await client.get(_full(backend, key))


def _session_lease(backend: aiolocks.Backend) -> int:
    session = _driver(backend)._session
    assert session is not None
    return session.lease_id


async def _leases(etcd: EtcdServer) -> set[int]:
    """Every lease the server has (``etcdctl lease list``)."""
    text = await asyncio.to_thread(etcd.etcdctl, "lease", "list")
    return {int(line, 16) for line in text.split()[3:] if line.strip()}


async def _lease_alive(client: EtcdClient, lease: int) -> bool:
    return (await client.lease_time_to_live(lease)).ttl >= 0


def _key() -> str:
    return f"group-{uuid.uuid4().hex[:8]}/member"


async def test_records_sit_in_their_folder_under_the_prefix(
    backend: aiolocks.Backend, client: EtcdClient
) -> None:
    store = _store(backend)
    group = f"group-{uuid.uuid4().hex[:8]}"
    plain = await store.create(f"{group}/plain", b"p")
    expiring = await store.create(f"{group}/expiring", b"x", ttl=30)
    entry = await store.join(f"{group}/member", b"m")
    assert plain is not None and expiring is not None and entry is not None
    root = _driver(backend).root
    assert root.endswith(b"/") and len(root) > 1
    found = await client.range(RangeOp.of(root + FOLDER + group.encode() + b"/", prefix=True))
    by_child = {kv.key.rsplit(b"/", 1)[1].decode(): kv for kv in found.kvs}
    assert sorted(by_child) == ["expiring", "member", "plain"]
    assert by_child["plain"].lease == 0 and by_child["plain"].mod_revision == plain
    assert by_child["member"].lease == _session_lease(backend)
    assert by_child["member"].mod_revision == entry.version
    own = by_child["expiring"].lease
    assert own not in (0, _session_lease(backend)), "an expiring record has a lease of its own"
    assert (await client.lease_time_to_live(own)).granted_ttl == 30
    # the values carry the kind, and a record is no lock
    assert by_child["plain"].value.endswith(b"p") and by_child["member"].value[:1] == b"e"
    assert await backend.list_locks("") == []


async def test_ttl_rounds_up_and_bad_input_is_a_value_error(
    backend: aiolocks.Backend, client: EtcdClient
) -> None:
    store = _store(backend)
    key = _key()
    assert await store.create(key, b"v", ttl=1.2) is not None
    kv = await _raw(client, backend, key)
    assert (await client.lease_time_to_live(kv.lease)).granted_ttl == 2
    record = await store.read(key)
    assert record is not None and record.ttl is not None and 0 < record.ttl <= 2
    with pytest.raises(ValueError, match="ttl"):
        await store.create(_key(), b"v", ttl=0)
    with pytest.raises(ValueError, match="child"):
        await store.create("no-child/", b"v")
    with pytest.raises(ValueError, match="bytes"):
        await store.create(_key(), "text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="version"):
        await store.update(key, b"v", version="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefix"):
        await store.snapshot("group/")
    assert await store.delete(key)


async def test_expiring_records_use_their_own_lease_and_writes_leak_none(
    backend: aiolocks.Backend, client: EtcdClient, etcd: EtcdServer
) -> None:
    store = _store(backend)
    key = _key()
    before = await _leases(etcd)
    version = await store.create(key, b"a", ttl=30)
    assert version is not None
    first = (await _raw(client, backend, key)).lease
    assert await _leases(etcd) - before == {first}
    assert await store.create(key, b"b", ttl=30) is None  # exists: its new lease revoked
    assert await store.update(key, b"b", version=version + 10**6, ttl=30) is None  # stale
    assert await _leases(etcd) - before == {first}
    version = await store.update(key, b"b", version=version, ttl=30)
    assert version is not None
    second = (await _raw(client, backend, key)).lease
    assert second != first and not await _lease_alive(client, first), "old lease left behind"
    version = await store.update(key, b"c", version=version)  # no expiry from now on
    assert version is not None
    assert (await _raw(client, backend, key)).lease == 0
    assert not await _lease_alive(client, second)
    version = await store.update(key, b"d", version=version, ttl=30)
    assert version is not None
    third = (await _raw(client, backend, key)).lease
    assert await store.delete(key, version=version)
    assert not await _lease_alive(client, third), "a deleted record's lease was left"
    assert await _leases(etcd) - before == set()


async def test_session_lease_revoked_behind_our_back_loses_the_entry(
    backend: aiolocks.Backend, client: EtcdClient, other_etcd_store: EtcdRecords
) -> None:
    store = _store(backend)
    key = _key()
    entry = await store.join(key, b"m")
    assert entry is not None
    told: list[Entry] = []
    entry.add_loss_listener(told.append)
    await client.lease_revoke(_session_lease(backend))
    await eventually(lambda: entry.lost, PATIENCE, what="the entry to be marked lost")
    assert told == [entry] and entry.lost_reason
    assert await other_etcd_store.read(key) is None
    # the backend goes on in a new session: the key is free again
    again = await store.join(key, b"n")
    assert again is not None and not again.lost
    assert await store.delete(key)


async def test_key_deleted_behind_our_back_loses_only_that_entry(
    backend: aiolocks.Backend, client: EtcdClient
) -> None:
    store = _store(backend)
    doomed, kept = _key(), _key()
    entry = await store.join(doomed, b"m")
    other = await store.join(kept, b"k")
    assert entry is not None and other is not None
    await client.delete(_full(backend, doomed))  # etcdctl del, say
    await eventually(lambda: entry.lost, PATIENCE, what="the deleted entry to be marked lost")
    assert entry.lost_reason is not None and "deleted" in entry.lost_reason
    assert not other.lost
    assert (await _raw(client, backend, kept)).lease == _session_lease(backend)
    # an own delete is no loss, and a delete of a record someone else removed says so
    assert await store.delete(kept, version=other.version)
    assert not other.lost
    assert not await store.delete(doomed)


async def test_session_that_ends_unreachable_loses_the_entry(
    etcd: EtcdServer, client: EtcdClient
) -> None:
    require_managed(etcd)
    async with TcpProxy(etcd.host, etcd.port) as proxy:
        url = f"etcd://{proxy.netloc}/t-{uuid.uuid4().hex[:10]}?lease_ttl=2&request_timeout=1"
        async with aiolocks.connect(url) as backend:
            await backend.open()
            store = _store(backend)
            key = _key()
            entry = await store.join(key, b"m")
            assert entry is not None
            proxy.stall()  # nothing reaches the server: only the session deadline tells
            try:
                await eventually(lambda: entry.lost, PATIENCE, what="the session to end")
                assert entry.lost_reason is not None
                assert "session lease" in entry.lost_reason
            finally:
                proxy.heal()
            await eventually(
                lambda: _gone(client, backend, key), PATIENCE, what="the server to expire it"
            )


async def _gone(client: EtcdClient, backend: aiolocks.Backend, key: str) -> bool:
    return await _raw(client, backend, key) is None


async def test_changed_ignores_keys_deeper_than_a_child(
    backend: aiolocks.Backend, client: EtcdClient
) -> None:
    store = _store(backend)
    group = f"group-{uuid.uuid4().hex[:8]}"
    own_client = _driver(backend).client
    # A watch on the same stream as the snapshot's: etcd sends the events of
    # one stream in revision order, so once this one saw the marker, the
    # snapshot's watch has been handed the deeper key's event already.
    marker = _full(backend, f"{group}-marker/x")
    async with await own_client.watch(marker) as seen:
        with await store.snapshot(group) as snap:
            waiter = asyncio.ensure_future(snap.changed(None))
            try:
                assert await store.create(f"{group}/sub/deeper", b"x") is not None
                await client.put(marker, b"m")
                async with asyncio.timeout(PATIENCE):
                    await anext(seen)
                for _ in range(5):
                    await asyncio.sleep(0)  # let the waiter run, had it been woken
                assert not waiter.done(), "a key below a child woke the snapshot"
                assert await store.create(f"{group}/child", b"c") is not None
                await asyncio.wait_for(waiter, PATIENCE)
            finally:
                waiter.cancel()
    assert await store.delete(f"{group}/sub/deeper") and await store.delete(f"{group}/child")


@pytest_asyncio.fixture
async def other_etcd_store(url: str) -> AsyncIterator[EtcdRecords]:
    """The record store of a second backend on the same prefix."""
    async with aiolocks.connect(url) as opened:
        await opened.open()
        yield _store(opened)


# -- cancellation at every await


class _Canceller:
    """Cancels the task under test at its ``at``-th call to the client.

    ``after``: the call reaches etcd and is answered first (the nastiest case:
    applied, but the caller never learns it); else it is never sent.
    """

    def __init__(self, client: EtcdClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.at = -1
        self.after = False
        self.calls = 0
        for name in ("txn", "range", "lease_grant", "lease_revoke", "lease_time_to_live", "watch"):
            monkeypatch.setattr(client, name, self._wrap(getattr(client, name)))

    def _wrap(self, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            if self.task is None or asyncio.current_task() is not self.task:
                return await call(*args, **kwargs)
            index, self.calls = self.calls, self.calls + 1
            if index == self.at and not self.after:
                self.task.cancel()
                await asyncio.sleep(0)
            result = await call(*args, **kwargs)
            if index == self.at:
                if isinstance(result, Watch):
                    # a watch cancelled once confirmed is closed by ``EtcdClient.watch`` itself
                    result.close()
                self.task.cancel()
                await asyncio.sleep(0)
            return result

        return wrapped

    async def run(self, op: Callable[[], Awaitable[object]], at: int, after: bool) -> bool:
        """Run ``op``; ``True`` when it was cancelled at call ``at``."""
        self.at, self.after, self.calls = at, after, 0
        self.task = asyncio.ensure_future(op())
        try:
            await self.task
        except asyncio.CancelledError:
            return True
        finally:
            self.task = None
        return False


def _background(backend: aiolocks.Backend) -> list[asyncio.Task[Any]]:
    """The clean-up tasks the store left in the engine's task set (not the entries' watches)."""
    tasks: set[asyncio.Task[Any]] = backend._tasks._tasks
    return [t for t in tasks if not t.done() and t.get_name() != "aiolocks-etcd-member"]


def _member_tasks(backend: aiolocks.Backend) -> int:
    tasks: set[asyncio.Task[Any]] = backend._tasks._tasks
    return sum(1 for t in tasks if not t.done() and t.get_name() == "aiolocks-etcd-member")


def _watches(client: EtcdClient) -> int:
    hub = client._hub
    return 0 if hub is None else hub.watch_count


Scenario = tuple[str, Callable[[], Awaitable[object]], Entry | None]


async def _scenario(store: EtcdRecords, kind: str) -> Scenario:
    """A fresh key set up for ``kind``, the call to cancel, and the entry it may delete."""
    key = _key()
    if kind == "create":
        return key, lambda: store.create(key, b"v", ttl=30), None
    if kind == "create-plain":
        return key, lambda: store.create(key, b"v"), None
    if kind == "join":
        return key, lambda: store.join(key, b"v"), None
    if kind == "snapshot":  # of a prefix with an expiring child (its ttl is read too)
        assert await store.create(key, b"v", ttl=30) is not None
        return key, lambda: store.snapshot(key.rpartition("/")[0]), None
    if kind == "delete-member":
        entry = await store.join(key, b"v")
        assert entry is not None
        return key, lambda: store.delete(key, version=entry.version), entry
    version = await store.create(key, b"v", ttl=30)
    assert version is not None
    if kind == "update":
        return key, lambda: store.update(key, b"w", version=version, ttl=30), None
    return key, lambda: store.delete(key, version=version), None


@pytest.mark.parametrize(
    "kind", ["create", "create-plain", "join", "snapshot", "delete-member", "update", "delete"]
)
async def test_cancelling_a_method_at_each_await_leaves_nothing_stray(
    kind: str, backend: aiolocks.Backend, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(backend)
    client = _driver(backend).client
    canceller = _Canceller(client, monkeypatch)
    at = 0
    while True:
        cancelled_any = False
        for after in (False, True):
            key, op, entry = await _scenario(store, kind)
            full = _full(backend, key)
            setup = await client.get(full)
            own = setup.lease if setup is not None and not setup.value.startswith(b"e") else 0
            before = await _leases(etcd)
            watches = _watches(client)
            if await canceller.run(op, at, after):
                cancelled_any = True
                await eventually(lambda: not _background(backend), PATIENCE, what="clean-ups")
                found = await client.get(full)
                new = await _leases(etcd) - before
                where = f"{kind} cancelled at call {at} ({'after' if after else 'before'} it)"
                assert new <= ({found.lease} if found is not None else set()), where
                if own and (found is None or found.lease != own):
                    assert not await _lease_alive(client, own), f"old lease leaked: {where}"
                if kind in ("create", "create-plain", "join"):
                    assert found is None, f"the key was left: {where}"
                if kind != "snapshot":
                    assert (key in store._entries) == (
                        found is not None and found.value.startswith(b"e")
                    ), where
                    assert _member_tasks(backend) == len(store._entries), where
                    assert entry is None or not entry.lost, f"own delete made a loss: {where}"
                else:
                    assert _watches(client) == watches, f"a watch was left open: {where}"
            await store.delete(key)
        if not cancelled_any:
            break  # the method made fewer calls than ``at``: every await was tried
        at += 1
    assert at >= 1, f"{kind} was never cancelled"
