"""One read of a group per backend, shared by its members, watchers and partitioners.

The backend's record store is wrapped to count ``snapshot()`` calls: with
several members and watchers of one group in one backend, a change costs
one read, not one per follower; a watcher that stops iterating does not
keep the shared follower task alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from typing import Any

import pytest

import aiolocks
from aiolocks._core import groupfeed
from aiolocks._core.records import Records, Snapshot, SupportsRecords

from ..polling import eventually, settle

pytestmark = pytest.mark.asyncio

MEMBERS = 4
WATCHERS = 4


class CountingStore:
    """The driver's store, counting the snapshots taken through it."""

    def __init__(self, store: Records) -> None:
        self.store = store
        self.snapshots = 0

    async def snapshot(self, prefix: str) -> Snapshot:
        self.snapshots += 1
        return await self.store.snapshot(prefix)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _idle(backend: aiolocks.Backend, prefix: str) -> bool:
    """The group's follower has published its last read and waits for a change."""
    follower = groupfeed._followers.get(backend._engine, {}).get(prefix)
    return (
        follower is not None
        and follower.latest is not None
        and follower.latest.read_no == follower.reads
        and follower.wanted <= follower.reads
    )


async def test_members_and_watchers_share_one_read_per_change(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    driver = backend._driver
    if not isinstance(driver, SupportsRecords):
        pytest.skip("backend has no record store")
    counting = CountingStore(driver.records())
    monkeypatch.setattr(driver, "records", lambda: counting)
    name = f"conformance/group-shared-{uuid.uuid4().hex[:10]}"
    group = backend.group(name)
    prefix = group._prefix
    seen: list[list[str]] = [[] for _ in range(WATCHERS)]

    async def watcher(index: int) -> None:
        async for members in group.watch():
            seen[index] = [member.id for member in members]
            if "outsider" in seen[index]:
                break  # stops iterating: must not keep the follower alive

    async with contextlib.AsyncExitStack() as stack:
        partitioners = []
        for index in range(MEMBERS):
            member = await stack.enter_async_context(group.join(f"member-{index}"))
            partitioners.append(aiolocks.Partitioner(member).changes())
        watchers = [asyncio.ensure_future(watcher(index)) for index in range(WATCHERS)]
        try:
            for changes in partitioners:  # each partitioner sees every member
                partition = await asyncio.wait_for(anext(changes), 15)
                while len(partition.members) < MEMBERS:
                    partition = await asyncio.wait_for(anext(changes), 15)
            everyone = [f"member-{index}" for index in range(MEMBERS)]
            await eventually(
                lambda: all(ids == everyone for ids in seen) and _idle(backend, prefix),
                15,
                what="every watcher to see every member",
            )
            before = counting.snapshots
            async with other_backend.group(name).join("outsider"):
                for changes in partitioners:
                    partition = await asyncio.wait_for(anext(changes), 15)
                    assert "outsider" in partition.members
                await asyncio.wait_for(asyncio.gather(*watchers), 15)
                assert all("outsider" in ids for ids in seen)
                await eventually(lambda: _idle(backend, prefix), 15, what="the follower idle")
                reads = counting.snapshots - before
                # one read for the change (a driver may wake early once), not one per follower
                assert 1 <= reads <= 2 < MEMBERS + WATCHERS, reads
        finally:
            for task in watchers:
                task.cancel()
            for changes in partitioners:
                await changes.aclose()  # type: ignore[attr-defined]
            await asyncio.gather(*watchers, return_exceptions=True)
    # the members left, the watchers stopped: nobody follows the group any more
    assert groupfeed.follower_task(backend._engine, prefix) is None
    await settle(backend)
    assert await group.members() == []
    assert groupfeed.follower_task(backend._engine, prefix) is None


async def test_a_watcher_that_stops_iterating_ends_the_follower(
    backend: aiolocks.Backend,
) -> None:
    if not isinstance(backend._driver, SupportsRecords):
        pytest.skip("backend has no record store")
    group = backend.group(f"conformance/group-shared-{uuid.uuid4().hex[:10]}")
    async for members in group.watch():
        assert members == []
        found = groupfeed.follower_task(backend._engine, group._prefix)
        assert found is not None and not found.done()
        break
    else:
        raise AssertionError("watch() ended")
    follower = found
    # the abandoned iterator is finalized by the event loop, which cancels the follower
    await eventually(lambda: follower.done(), 15, what="the follower task to end")
    assert groupfeed.follower_task(backend._engine, group._prefix) is None
    await settle(backend)


async def test_a_slow_watcher_skips_to_the_last_state(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend
) -> None:
    if not isinstance(backend._driver, SupportsRecords):
        pytest.skip("backend has no record store")
    name = f"conformance/group-shared-{uuid.uuid4().hex[:10]}"
    group = backend.group(name)
    watch = group.watch()
    try:
        assert await asyncio.wait_for(anext(watch), 15) == []
        async with contextlib.AsyncExitStack() as stack:
            for index in range(3):  # three changes while the watcher does not iterate
                await stack.enter_async_context(other_backend.group(name).join(f"m-{index}"))
                await eventually(
                    functools.partial(_read_ids, backend, group._prefix, index + 1),
                    15,
                    what="the follower to read the join",
                )
            members = await asyncio.wait_for(anext(watch), 15)
            assert [member.id for member in members] == ["m-0", "m-1", "m-2"]
    finally:
        await watch.aclose()  # type: ignore[attr-defined]


def _read_ids(backend: aiolocks.Backend, prefix: str, count: int) -> bool:
    """The follower's last read has ``count`` members."""
    follower = groupfeed._followers.get(backend._engine, {}).get(prefix)
    latest = None if follower is None else follower.latest
    return latest is not None and len(latest.records) == count


class FailingStore(CountingStore):
    """The driver's store, whose snapshots fail once ``fail`` is set."""

    fail = False

    async def snapshot(self, prefix: str) -> Snapshot:
        if self.fail:
            raise RuntimeError("the store broke")
        return await super().snapshot(prefix)


async def test_a_member_whose_group_can_no_longer_be_followed_is_lost(
    backend: aiolocks.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error of the shared read ends the membership loudly, never silently."""
    driver = backend._driver
    if not isinstance(driver, SupportsRecords):
        pytest.skip("backend has no record store")
    failing = FailingStore(driver.records())
    monkeypatch.setattr(driver, "records", lambda: failing)
    group = backend.group(f"conformance/group-failing-{uuid.uuid4().hex[:10]}")
    steps: list[str] = []
    with pytest.raises(aiolocks.LockLostError, match="following the group failed"):
        async with group.join("a") as member:
            steps.append("joined")
            await eventually(lambda: _idle(backend, group._prefix), 15, what="the first read")
            failing.fail = True
            groupfeed._followers[backend._engine][group._prefix].want_fresh()
            await asyncio.sleep(30)
            steps.append("body went on")
    assert steps == ["joined"]
    assert member.is_lost
    failing.fail = False
    await settle(backend)
