"""Group membership on every backend with a record store (tooz's and Curator's scenarios).

Members join and leave, are listed and watched; a member whose backend
closes leaves and the others see it; a member whose own record goes while
its ``async with group.join()`` body runs gets ``LockLostError``; a
cancelled join or leave never leaves a member behind.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import aiolocks
from aiolocks._core.group import member_child
from aiolocks._core.records import SupportsRecords

from ..polling import eventually

pytestmark = pytest.mark.asyncio

#: the bound on one wait for a change (never reached when things work)
BOUND = 15.0


def group_of(backend: aiolocks.Backend, name: str) -> aiolocks.Group:
    """``backend.group(name)``; skip where the backend has no record store (after checking
    that it says so with NotImplementedError, before any I/O)."""
    if not isinstance(backend._driver, SupportsRecords):
        with pytest.raises(NotImplementedError, match="record store"):
            backend.group(name)
        pytest.skip("backend has no record store")
    return backend.group(name)


@pytest.fixture
def group_name() -> str:
    return f"conformance/group-{uuid.uuid4().hex[:10]}"


async def ids(group: aiolocks.Group) -> list[str]:
    return [member.id for member in await group.members()]


async def next_list(
    watch: AsyncIterator[list[aiolocks.Member]], wanted: Callable[[list[str]], bool]
) -> list[str]:
    """The ids of the first list ``watch`` yields that ``wanted`` accepts."""

    async def scan() -> list[str]:
        async for members in watch:
            found = [member.id for member in members]
            if wanted(found):
                return found
        raise AssertionError("watch() ended")

    return await asyncio.wait_for(scan(), BOUND)


async def test_join_list_and_leave(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, group_name: str
) -> None:
    group, seen_from_other = group_of(backend, group_name), group_of(other_backend, group_name)
    assert await group.members() == []
    capabilities = {"cpus": 8, "zones": ["a", "b"], "gpu": None, "ratio": 0.5, "x": {"y": True}}
    async with group.join("host-a", capabilities) as member:
        assert (member.id, member.capabilities, member.group) == ("host-a", capabilities, group)
        assert not member.is_lost
        listed = await seen_from_other.members()
        assert listed == [member]
        assert listed[0].capabilities == capabilities
        async with seen_from_other.join() as anonymous:
            assert len(anonymous.id) == 32  # a uuid
            assert await ids(group) == sorted(["host-a", anonymous.id])
        assert await ids(group) == ["host-a"]
    assert await seen_from_other.members() == []
    assert not member.is_lost


async def test_duplicate_member_id_is_refused(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, group_name: str
) -> None:
    group, other = group_of(backend, group_name), group_of(other_backend, group_name)
    async with group.join("same"):
        with pytest.raises(ValueError, match="already has a member 'same'"):
            async with other.join("same"):
                pytest.fail("a second member with the same id joined")
        assert await ids(other) == ["same"]
    async with other.join("same"):  # free again once the first left
        assert await ids(group) == ["same"]
    assert await group.members() == []


@pytest.mark.parametrize(
    ("member_id", "capabilities", "problem"),
    [
        ("", None, "member_id"),
        ("a\nb", None, "member_id"),
        (42, None, "member_id"),
        ("x" * 1025, None, "member_id"),
        ("ok", ["not", "a", "dict"], "capabilities"),
        ("ok", {"nan": float("nan")}, "capabilities"),
        ("ok", {1: "int key"}, "capabilities"),
        ("ok", {"set": {1, 2}}, "capabilities"),
        ("ok", {"big": "x" * 70_000}, "capabilities"),
    ],
)
async def test_bad_input_is_a_value_error_before_any_io(
    backend_url: str, member_id: object, capabilities: object, problem: str
) -> None:
    unopened = aiolocks.connect(backend_url)._backend  # never opened: no I/O possible
    if not isinstance(unopened._driver, SupportsRecords):
        pytest.skip("backend has no record store")
    group = unopened.group("conformance/bad-input")
    with pytest.raises(ValueError, match=problem):
        group.join(member_id, capabilities)  # type: ignore[arg-type]
    with pytest.raises(aiolocks.InvalidLockNameError):
        unopened.group("bad//name")


async def test_watch_sees_joins_leaves_and_a_closed_backend(
    backend: aiolocks.Backend, backend_url: str, group_name: str
) -> None:
    group = group_of(backend, group_name)
    watch = group.watch()
    try:
        assert await next_list(watch, lambda found: True) == []
        async with aiolocks.connect(backend_url) as third:
            joined = asyncio.Event()
            left = asyncio.Event()

            async def member_in_third() -> None:
                async with group_of(third, group_name).join("gone-with-session"):
                    joined.set()
                    await left.wait()

            holder = asyncio.ensure_future(member_in_third())
            await asyncio.wait_for(joined.wait(), BOUND)
            assert await next_list(watch, lambda found: found != []) == ["gone-with-session"]
            async with group.join("local"):
                assert await next_list(watch, lambda found: len(found) == 2) == [
                    "gone-with-session",
                    "local",
                ]
            assert await next_list(watch, lambda found: len(found) == 1) == ["gone-with-session"]
        # the third backend closed: its member's session ended
        with pytest.raises(aiolocks.LockLostError, match="backend was closed"):
            await holder
        assert await next_list(watch, lambda found: found == []) == []
    finally:
        await watch.aclose()  # type: ignore[attr-defined]


async def test_a_lost_member_gets_lock_lost_error_and_the_others_see_it_leave(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, group_name: str
) -> None:
    group, other = group_of(backend, group_name), group_of(other_backend, group_name)
    store = other_backend._driver.records()
    entered = asyncio.Event()
    member: aiolocks.Member | None = None

    async def body() -> None:
        nonlocal member
        async with group.join("victim") as member:
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.ensure_future(body())
    await asyncio.wait_for(entered.wait(), BOUND)
    # an operator deletes the member record behind the member's back
    key = f"group/{group_name}/{member_child('victim')}"
    assert await store.delete(key)
    with pytest.raises(aiolocks.LockLostError, match="was lost while the block ran"):
        await asyncio.wait_for(task, BOUND)
    assert member is not None and member.is_lost
    assert await other.members() == []
    async with other.join("victim"):  # the id is free again
        pass


async def test_cancellation_at_every_await_point_leaves_no_member(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, group_name: str
) -> None:
    group, other = group_of(backend, group_name), group_of(other_backend, group_name)
    finished = 0

    async def join_and_leave(trial: int) -> None:
        async with group.join("cancelled", {"trial": trial}):
            pass

    for trial in range(400):
        task = asyncio.ensure_future(join_and_leave(trial))
        # cancel after `trial` loop iterations, then after growing real delays, so
        # that the cancellation lands in the join, the body and the leave
        if trial < 100:
            for _ in range(trial):
                await asyncio.sleep(0)
        else:
            await asyncio.sleep(0.0005 * (trial - 100))
        finished_first = task.done()
        task.cancel()
        outcome = (await asyncio.gather(task, return_exceptions=True))[0]
        if not finished_first:  # the cancellation is never swallowed
            assert isinstance(outcome, asyncio.CancelledError), f"trial {trial}: {outcome!r}"
        assert await other.members() == [], f"trial {trial}: a member was left behind"
        if finished_first:
            finished += 1
            if finished >= 3:
                break
    assert finished >= 1, "the join never completed: the trials did not reach its end"


async def test_churn_of_many_joins_and_leaves(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, group_name: str
) -> None:
    group, other = group_of(backend, group_name), group_of(other_backend, group_name)
    watch = other.watch()
    everyone = [f"m{i:02d}" for i in range(20)]
    gate = asyncio.Event()
    joined: list[str] = []

    async def member(member_id: str, rounds: int) -> None:
        for _ in range(rounds):  # join and leave quickly
            async with group.join(member_id):
                await asyncio.sleep(0)
        async with group.join(member_id, {"final": True}):
            joined.append(member_id)
            await gate.wait()

    try:
        tasks = [asyncio.ensure_future(member(m, i % 4)) for i, m in enumerate(everyone)]
        await eventually(lambda: len(joined) == len(everyone), BOUND, what="all to join")
        assert await next_list(watch, lambda found: found == everyone) == everyone
        assert all(m.capabilities == {"final": True} for m in await other.members())
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
        assert await next_list(watch, lambda found: found == []) == []
        assert await group.members() == []
    finally:
        await watch.aclose()  # type: ignore[attr-defined]


async def _member_in_body(
    group: aiolocks.Group, member_id: str
) -> tuple[asyncio.Task[None], list[aiolocks.Member]]:
    """A task inside ``async with group.join(member_id)`` (until cancelled), and its member."""
    entered = asyncio.Event()
    members: list[aiolocks.Member] = []

    async def body() -> None:
        async with group.join(member_id) as member:
            members.append(member)
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.ensure_future(body())
    await asyncio.wait_for(entered.wait(), BOUND)
    return task, members


async def test_a_session_loss_reported_by_the_driver_cancels_the_body(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, group_name: str
) -> None:
    group, other = group_of(backend, group_name), group_of(other_backend, group_name)
    task, (member,) = await _member_in_body(group, "expired")
    entry = member._membership._entry  # type: ignore[union-attr]
    assert entry is not None
    entry.mark_lost("session expired (reported by the test)")  # what a driver does
    with pytest.raises(aiolocks.LockLostError, match=r"session expired \(reported by the test\)"):
        await asyncio.wait_for(task, BOUND)
    assert member.is_lost
    # the exit still deleted what the server might have kept
    assert await other.members() == []


async def test_a_cancellation_beside_the_loss_wins(
    backend: aiolocks.Backend, group_name: str
) -> None:
    group = group_of(backend, group_name)
    task, (member,) = await _member_in_body(group, "both")
    entry = member._membership._entry  # type: ignore[union-attr]
    assert entry is not None
    entry.mark_lost("lost (reported by the test)")
    task.cancel()  # somebody else also cancels the task: that cancellation propagates
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await group.members() == []


async def test_closing_the_backend_during_a_join_raises_and_ends_the_member(
    backend_url: str, other_backend: aiolocks.Backend, group_name: str
) -> None:
    other = group_of(other_backend, group_name)
    for steps in (0, 2, 6, 15, 40):
        closing = await aiolocks.connect(backend_url)
        group = group_of(closing, group_name)
        member_id = f"closing-{steps}"
        task = asyncio.ensure_future(_join_forever(group, member_id))
        for _ in range(steps):
            await asyncio.sleep(0)
        await closing.close()
        outcome = (await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), BOUND))[0]
        # never a bare CancelledError: nobody cancelled the joining task
        assert isinstance(outcome, aiolocks.LockLostError | aiolocks.BackendUnavailableError), (
            f"after {steps} steps: {outcome!r}"
        )
        if isinstance(outcome, aiolocks.LockLostError):
            # the member had joined: its record went with the closed session
            await eventually(_absent(other, member_id), BOUND, what=f"{member_id} to leave")
        # (A join still on the wire when the backend closed may be applied after
        # the driver let go of its session: that record goes when the session
        # ends on the server, for a Redis key when its lease lapses.)


def _absent(group: aiolocks.Group, member_id: str) -> Callable[[], Awaitable[bool]]:
    async def absent() -> bool:
        return member_id not in await ids(group)

    return absent


async def _join_forever(group: aiolocks.Group, member_id: str) -> None:
    async with group.join(member_id):
        await asyncio.sleep(3600)
