"""Leader latch value, ``proclaim()`` and ``observe()`` (etcd's Proclaim/Observe).

On every backend with a record store: an observer that never runs for
leadership sees ``None`` while nobody leads, the leader with its value,
every proclaimed value and every change of leader, including a leader
whose backend closed.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

import aiolocks
from aiolocks import Participant
from aiolocks._core.records import SupportsRecords

from .test_group import BOUND

pytestmark = pytest.mark.asyncio

Seen = Participant | None


def latch_of(
    backend: aiolocks.Backend, name: str, pid: str | None = None, value: object = None
) -> aiolocks.LeaderLatch:
    """A latch of ``name``; skip where the backend has no record store."""
    if not isinstance(backend._driver, SupportsRecords):
        with pytest.raises(NotImplementedError, match="record store"):
            backend.leader_latch(name, pid, value={"needs": "a store"})
        pytest.skip("backend has no record store")
    return backend.leader_latch(name, pid, value)


@pytest.fixture
def latch_name() -> str:
    return f"conformance/observe-{uuid.uuid4().hex[:10]}"


async def seen(observed: AsyncIterator[Seen], wanted: Callable[[Seen], bool]) -> Seen:
    """The first leader ``observe()`` yields that ``wanted`` accepts."""

    async def scan() -> Seen:
        async for leader in observed:
            if wanted(leader):
                return leader
        raise AssertionError("observe() ended")

    return await asyncio.wait_for(scan(), BOUND)


def leads(pid: str, value: object = None) -> Callable[[Seen], bool]:
    return lambda leader: leader is not None and (leader.id, leader.value) == (pid, value)


async def test_observe_on_a_latch_that_never_runs(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, latch_name: str
) -> None:
    observer = latch_of(other_backend, latch_name)
    observed = observer.observe()
    try:
        assert await seen(observed, lambda leader: True) is None  # nobody leads
        async with latch_of(backend, latch_name, "a", {"url": "http://a"}) as latch:
            assert await latch.wait_for_leadership(timeout=BOUND)
            leader = await seen(observed, leads("a", {"url": "http://a"}))
            assert leader is not None and leader.is_holder
            assert leader.fencing_token == latch.fencing_token
            await latch.proclaim(["second", 2])
            assert latch.value == ["second", 2]
            await seen(observed, leads("a", ["second", 2]))
            current = await observer.leader()
            assert current is not None and (current.id, current.value) == ("a", ["second", 2])
        assert await seen(observed, lambda leader: leader is None) is None
        assert await observer.leader() is None
        assert not observer.is_started
    finally:
        await observed.aclose()  # type: ignore[attr-defined]


async def test_a_change_of_leader_is_seen(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, backend_url: str, latch_name: str
) -> None:
    observed = latch_of(other_backend, latch_name).observe()
    try:
        async with aiolocks.connect(backend_url) as doomed:
            first = latch_of(doomed, latch_name, "first", 1)
            await first.start()
            assert await first.wait_for_leadership(timeout=BOUND)
            await seen(observed, leads("first", 1))
            second = latch_of(backend, latch_name, "second")
            async with second:
                # a latch that does not lead keeps a proclaimed value for its term
                await second.proclaim("ready")
                assert not second.has_leadership
                await doomed.close()  # the first leader's session ends
                assert await second.wait_for_leadership(timeout=BOUND)
                await seen(observed, leads("second", "ready"))
            await seen(observed, lambda leader: leader is None)
    finally:
        await observed.aclose()  # type: ignore[attr-defined]


async def test_a_record_left_by_an_earlier_term_is_replaced(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, latch_name: str
) -> None:
    observer = latch_of(other_backend, latch_name)
    store = other_backend._driver.records()
    stale = json.dumps({"id": "ghost", "value": "old", "token": -1}).encode()
    key = f"latch/{latch_name}/leader"
    assert await store.create(key, stale) is not None
    observed = observer.observe()
    try:
        await seen(observed, leads("ghost", "old"))
        async with latch_of(backend, latch_name, "live", "new") as latch:
            assert await latch.wait_for_leadership(timeout=BOUND)
            await seen(observed, leads("live", "new"))
            # deleted behind the leader's back: written again while it leads
            record = await store.read(key)
            assert record is not None and await store.delete(key, version=record.version)
            await seen(observed, leads("live", "new"))
        await seen(observed, lambda leader: leader is None)
        assert await store.read(key) is None, "the leader record outlived the term"
    finally:
        await observed.aclose()  # type: ignore[attr-defined]


async def test_bad_values_are_a_value_error_before_any_io(
    backend: aiolocks.Backend, latch_name: str
) -> None:
    latch = latch_of(backend, latch_name)
    for bad in ({1, 2}, float("nan"), {1: "x"}, "x" * 70_000):
        with pytest.raises(ValueError, match="value"):
            backend.leader_latch(latch_name, "p", bad)
        with pytest.raises(ValueError, match="value"):
            await latch.proclaim(bad)
    assert latch.value is None
