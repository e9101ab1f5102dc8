"""`gather_keeping_cancel` (Redlock's per-master calls) keeps the caller's cancellation as it came.

``asyncio.gather`` raises a new, bare ``CancelledError`` when every call it
still waits for absorbs the cancellation (a command that finished just as it
was cancelled, a client library that swallows it). anyio's cancel scopes
recognise their own cancellation by its message, so a bare one escaped
``move_on_after`` around a Redlock acquire (seen in the anyio conformance
module, about one run in ten). No server needed: the calls are stand-ins
that absorb a cancellation the way those calls can.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from aiolocks._core.tasks import gather_keeping_cancel

pytestmark = pytest.mark.asyncio


async def absorbing(finished: list[str], name: str) -> str:
    """A per-master call that absorbs a cancellation and returns normally."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(0.01)  # it even takes a moment to wind down
    finished.append(name)
    return name


async def test_move_on_after_catches_its_cancel_when_every_call_absorbs_it() -> None:
    finished: list[str] = []
    with anyio.move_on_after(0.05) as scope:
        await gather_keeping_cancel([absorbing(finished, f"m{i}") for i in range(5)])
        raise AssertionError("not reached: the scope's deadline cancels the wait")
    assert scope.cancelled_caught
    # every call finished before the cancellation went on (what they wrote is known)
    assert sorted(finished) == [f"m{i}" for i in range(5)]


async def test_the_callers_own_cancelled_error_is_raised() -> None:
    finished: list[str] = []
    waiting = asyncio.create_task(
        gather_keeping_cancel([absorbing(finished, f"m{i}") for i in range(3)])
    )
    await asyncio.sleep(0.01)
    waiting.cancel("the caller's message")
    with pytest.raises(asyncio.CancelledError) as info:
        await waiting
    assert info.value.args == ("the caller's message",)
    assert len(finished) == 3


async def test_results_and_errors_as_gather_gives_them() -> None:
    async def ok(value: int) -> int:
        await asyncio.sleep(0)
        return value

    async def fails() -> int:
        raise ValueError("master said no")

    assert await gather_keeping_cancel([ok(1), ok(2)]) == [1, 2]
    mixed = await gather_keeping_cancel([ok(1), fails()], return_exceptions=True)
    assert mixed[0] == 1 and isinstance(mixed[1], ValueError)
    with pytest.raises(ValueError, match="master said no"):
        await gather_keeping_cancel([ok(1), fails()])
    assert await gather_keeping_cancel([]) == []
