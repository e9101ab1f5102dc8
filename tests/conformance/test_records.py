"""The record store of every backend (the contract of ``aiolocks._core.records``).

The coordination recipes (groups, latches, barriers, ``once``) are built in
the core over it, so each backend's store must keep the contract exactly:
compare-and-set by version, expiry counted by the server, ephemeral records
that go with their session, and snapshots whose ``changed()`` wakes on every
kind of change.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import aiolocks
from aiolocks._core.records import Records, SupportsRecords

from ..polling import eventually

pytestmark = pytest.mark.asyncio


def _records(backend: aiolocks.Backend) -> Records:
    driver = backend._driver
    if not isinstance(driver, SupportsRecords):
        pytest.skip("backend has no record store")
    return driver.records()


@pytest_asyncio.fixture
async def store(backend: aiolocks.Backend) -> Records:
    await backend.open()
    return _records(backend)


@pytest_asyncio.fixture
async def other_store(other_backend: aiolocks.Backend) -> Records:
    await other_backend.open()
    return _records(other_backend)


@pytest_asyncio.fixture
async def prefix() -> AsyncIterator[str]:
    yield f"conformance/records-{uuid.uuid4().hex[:10]}"


async def test_create_read_update_delete_compare_by_version(store: Records, prefix: str) -> None:
    key = f"{prefix}/a"
    assert await store.read(key) is None
    version = await store.create(key, b"one")
    assert version is not None
    assert await store.create(key, b"two") is None, "create of an existing key must fail"
    record = await store.read(key)
    assert record is not None
    assert (record.value, record.version, record.ephemeral, record.ttl) == (
        b"one",
        version,
        False,
        None,
    )
    newer = await store.update(key, b"two", version=version)
    assert newer is not None and newer != version
    assert await store.update(key, b"three", version=version) is None, "stale version won"
    assert (await store.read(key)) == type(record)(b"two", newer)
    assert not await store.delete(key, version=version), "delete at a stale version"
    assert await store.delete(key, version=newer)
    assert await store.read(key) is None
    assert not await store.delete(key)
    assert await store.update(key, b"x", version=newer) is None, "update of an absent key"
    again = await store.create(key, b"again")
    assert again is not None and again not in (version, newer), "a version came back"
    assert await store.delete(key)


async def test_expiring_records_go_by_the_server(store: Records, prefix: str) -> None:
    key = f"{prefix}/ttl"
    version = await store.create(key, b"v", ttl=1.0)
    assert version is not None
    record = await store.read(key)
    assert record is not None and record.ttl is not None and 0 < record.ttl <= 1.0
    assert await store.create(key, b"w") is None
    await eventually(lambda: _absent(store, key), 10, what="the expiring record to expire")
    assert await store.create(key, b"w", ttl=30) is not None, "an expired key must be free"
    record = await store.read(key)
    assert record is not None and record.value == b"w"
    # update sets the expiry from this write on: none, then a short one
    kept = await store.update(key, b"x", version=record.version, ttl=None)
    assert kept is not None
    record = await store.read(key)
    assert record is not None and record.ttl is None
    short = await store.update(key, b"y", version=kept, ttl=0.5)
    assert short is not None
    await eventually(lambda: _absent(store, key), 10, what="the shortened record to expire")


async def _absent(store: Records, key: str) -> bool:
    return await store.read(key) is None


async def test_ephemeral_records_go_with_their_session(
    backend_url: str, other_store: Records, prefix: str
) -> None:
    key = f"{prefix}/member"
    async with aiolocks.connect(backend_url) as first:
        await first.open()
        store = _records(first)
        entry = await store.join(key, b"hello")
        assert entry is not None and entry.key == key and not entry.lost
        assert await store.join(key, b"again") is None
        assert await other_store.join(key, b"rival") is None
        record = await other_store.read(key)
        assert record is not None
        assert (record.value, record.version, record.ephemeral) == (b"hello", entry.version, True)
        newer = await store.update(key, b"changed", version=entry.version)
        assert newer is not None
        entry.version = newer
        record = await other_store.read(key)
        assert record is not None and record.value == b"changed" and record.ephemeral
    # the backend closed: its session ended, and the record with it
    await eventually(lambda: _absent(other_store, key), 15, what="the ephemeral record to go")
    assert not entry.lost, "an orderly close is not a loss"


async def test_deleting_an_ephemeral_record_is_not_a_loss(store: Records, prefix: str) -> None:
    key = f"{prefix}/leaving"
    entry = await store.join(key, b"x")
    assert entry is not None
    assert await store.delete(key, version=entry.version)
    assert await store.read(key) is None
    assert not entry.lost
    again = await store.join(key, b"y")
    assert again is not None and again.version != entry.version
    assert await store.delete(key)


async def test_snapshot_lists_children_and_wakes_on_every_change(
    store: Records, other_store: Records, prefix: str
) -> None:
    assert (await store.create(f"{prefix}/a", b"1")) is not None
    # a record under another prefix that merely starts the same is not a child
    assert (await store.create(f"{prefix}-not-a-child/x", b"0")) is not None
    with await store.snapshot(prefix) as snap:
        assert sorted(snap.records) == ["a"]
        assert snap.records["a"].value == b"1"
    version_b: int | None = None

    async def change_b() -> None:
        nonlocal version_b
        version_b = await other_store.create(f"{prefix}/b", b"2")

    async def update_a() -> None:
        record = await other_store.read(f"{prefix}/a")
        assert record is not None
        assert await other_store.update(f"{prefix}/a", b"1+", version=record.version)

    async def delete_b() -> None:
        assert await other_store.delete(f"{prefix}/b")

    for change, expect in [
        (change_b, {"a": b"1", "b": b"2"}),
        (update_a, {"a": b"1+", "b": b"2"}),
        (delete_b, {"a": b"1+"}),
    ]:
        await _wakes_on(store, prefix, change, expect)
    assert await store.delete(f"{prefix}/a")
    assert await store.delete(f"{prefix}-not-a-child/x")


async def _wakes_on(store: Records, prefix: str, change: object, expect: dict[str, bytes]) -> None:
    """``changed()`` of a snapshot taken before ``change`` returns, and a new read shows it."""
    assert callable(change)
    with await store.snapshot(prefix) as snap:
        waiter = asyncio.ensure_future(snap.changed(None))
        await asyncio.sleep(0)
        assert not waiter.done(), "changed() returned before anything changed"
        await change()
        await asyncio.wait_for(waiter, 10)
    with await store.snapshot(prefix) as snap:
        assert {child: record.value for child, record in snap.records.items()} == expect


async def test_snapshot_wakes_when_a_record_expires_or_its_session_ends(
    backend_url: str, store: Records, prefix: str
) -> None:
    assert await store.create(f"{prefix}/short", b"x", ttl=1.0) is not None
    with await store.snapshot(prefix) as snap:
        assert "short" in snap.records
        started = time.monotonic()
        while "short" in snap.records:
            await snap.changed(10)
            snap.close()
            snap = await store.snapshot(prefix)
            assert time.monotonic() - started < 15, "the expiry was never seen"
    async with aiolocks.connect(backend_url) as member_backend:
        await member_backend.open()
        entry = await _records(member_backend).join(f"{prefix}/member", b"m")
        assert entry is not None
        snap = await store.snapshot(prefix)
        assert "member" in snap.records
    try:
        started = time.monotonic()
        while "member" in snap.records:
            await snap.changed(10)
            snap.close()
            snap = await store.snapshot(prefix)
            assert time.monotonic() - started < 15, "the departed member was never seen"
    finally:
        snap.close()


async def test_changed_returns_by_its_bound(store: Records, prefix: str) -> None:
    with await store.snapshot(prefix) as snap:
        assert snap.records == {}
        await asyncio.wait_for(snap.changed(0.2), 10)


async def test_a_cancelled_wait_leaves_the_store_usable(store: Records, prefix: str) -> None:
    with await store.snapshot(prefix) as snap:
        waiter = asyncio.ensure_future(snap.changed(None))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert await store.create(f"{prefix}/after", b"ok") is not None
    assert await store.delete(f"{prefix}/after")
