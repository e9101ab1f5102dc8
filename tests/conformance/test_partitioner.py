"""The partitioner: the same owner on every member, ~1/N of the keys move, views on a group.

The hashing is a pure function of the member list, measured here with 10
members and 100,000 keys (no server needed); ``changes()`` is then run on a
real group on every backend with a record store.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest

import aiolocks
from aiolocks import Partition

from .test_group import BOUND, group_of

KEYS = [f"key-{i}" for i in range(100_000)]
MEMBERS = [f"worker-{i}" for i in range(10)]


def owners(members: list[str], keys: list[str] = KEYS) -> list[str]:
    view = Partition(members[0], members)
    return [view.owner(key) for key in keys]


@pytest.fixture(scope="module")
def ten() -> list[str]:
    return owners(MEMBERS)


def test_every_member_computes_the_same_owner(ten: list[str]) -> None:
    shuffled = MEMBERS[:]
    random.Random(7).shuffle(shuffled)
    sample = KEYS[::97]
    for member_id in shuffled:  # each member's own view, the list in another order
        view = Partition(member_id, shuffled)
        assert [view.owner(key) for key in sample] == ten[::97]
        expected = [k for k, o in zip(sample, ten[::97], strict=True) if o == member_id]
        assert view.select(sample) == expected
    # another process (another hash seed) computes the same owners
    script = (
        "import json, sys; from aiolocks import Partition; "
        "members, keys = json.load(sys.stdin); view = Partition(members[0], members); "
        "print(json.dumps([view.owner(k) for k in keys]))"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps([MEMBERS, sample]),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "", **_pythonpath()},
    )
    assert json.loads(child.stdout) == ten[::97]


def _pythonpath() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(sys.path)}


def test_keys_spread_evenly(ten: list[str]) -> None:
    counts = Counter(ten)
    assert set(counts) == set(MEMBERS)
    share = len(KEYS) / len(MEMBERS)
    # binomial spread: the standard deviation is ~95 keys of 10,000
    assert all(abs(count - share) < 0.05 * share for count in counts.values()), counts


def test_a_join_moves_about_one_key_in_n_and_only_to_the_newcomer(ten: list[str]) -> None:
    after = owners([*MEMBERS, "worker-new"])
    moved = [(old, new) for old, new in zip(ten, after, strict=True) if old != new]
    assert {new for _, new in moved} == {"worker-new"}, "a key moved between old members"
    fraction = len(moved) / len(KEYS)
    assert abs(fraction - 1 / 11) < 0.01, fraction


def test_a_leave_moves_exactly_the_keys_of_the_member_that_left(ten: list[str]) -> None:
    after = owners([m for m in MEMBERS if m != "worker-3"])
    moved = [old for old, new in zip(ten, after, strict=True) if old != new]
    assert set(moved) == {"worker-3"}
    assert len(moved) == ten.count("worker-3")
    fraction = len(moved) / len(KEYS)
    assert abs(fraction - 1 / 10) < 0.01, fraction


def test_views_and_bad_input() -> None:
    view = Partition("a", ["b", "a", "a"])
    assert view.members == ("a", "b")
    assert view.version == Partition("b", ["a", "b"]).version != Partition("a", ["a"]).version
    key = KEYS[0]
    assert (key in view) == view.owns(key) == (view.owner(key) == "a")
    assert 42 not in view
    with pytest.raises(ValueError, match="must be a str"):
        view.owner(42)  # type: ignore[arg-type]
    empty = Partition("a", [])
    assert not empty.owns(key)
    with pytest.raises(LookupError, match="no members"):
        empty.owner(key)
    with pytest.raises(ValueError, match="needs a Member"):
        aiolocks.Partitioner("worker-1")  # type: ignore[arg-type]


async def next_view(changes: AsyncIterator[Partition], size: int) -> Partition:
    async def scan() -> Partition:
        async for view in changes:
            if len(view.members) == size:
                return view
        raise AssertionError("changes() ended")

    return await asyncio.wait_for(scan(), BOUND)


@pytest.mark.asyncio
async def test_changes_on_a_real_group(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend
) -> None:
    name = f"conformance/partitioner-{uuid.uuid4().hex[:10]}"
    group, other = group_of(backend, name), group_of(other_backend, name)
    keys = KEYS[:2000]
    async with group.join("first") as first:
        partitioner = aiolocks.Partitioner(first)
        with pytest.raises(RuntimeError, match="iterate changes"):
            partitioner.owns(keys[0])
        changes = partitioner.changes()
        try:
            alone = await next_view(changes, 1)
            assert partitioner.partition is alone and alone.members == ("first",)
            assert all(partitioner.owns(key) for key in keys)
            async with other.join("second") as second:
                theirs = aiolocks.Partitioner(second)
                their_changes = theirs.changes()
                try:
                    their_view = await next_view(their_changes, 2)
                    # not told yet: the first member still answers from its last view
                    assert all(partitioner.owns(key) for key in keys)
                    both = await next_view(changes, 2)
                    assert both.version == their_view.version
                    mine, their_keys = set(both.select(keys)), set(their_view.select(keys))
                    assert mine.isdisjoint(their_keys) and mine | their_keys == set(keys)
                    assert 0.3 < len(mine) / len(keys) < 0.7
                    for key in keys[:200]:
                        assert partitioner.owner(key) == theirs.owner(key)
                        assert partitioner.owns(key) != theirs.owns(key)
                finally:
                    await their_changes.aclose()  # type: ignore[attr-defined]
            again = await next_view(changes, 1)
            assert again.members == ("first",) and again.version != both.version
            assert all(partitioner.owns(key) for key in keys)
        finally:
            await changes.aclose()  # type: ignore[attr-defined]
