"""``stop_task``: stopping a loop of our own without losing the caller's cancellation.

The idiom it replaces, ``task.cancel()`` then ``await task`` under
``suppress(CancelledError)``, swallowed a cancellation of the caller that
arrived while the task was still finishing, and returned before the task
had ended (the ZooKeeper links closed their loops that way).
"""

from __future__ import annotations

import asyncio

import pytest

from aiolocks._core.tasks import stop_task

pytestmark = pytest.mark.asyncio


async def test_a_cancelled_caller_waits_for_the_task_then_is_cancelled() -> None:
    in_cleanup = asyncio.Event()
    cleanup_may_end = asyncio.Event()
    task_done_when_stopper_left: list[bool] = []

    async def loop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            in_cleanup.set()
            await cleanup_may_end.wait()

    async def stopping(task: asyncio.Task[None]) -> None:
        try:
            await stop_task(task)
        finally:
            task_done_when_stopper_left.append(task.done())

    started = asyncio.Event()

    async def started_loop() -> None:
        started.set()
        await loop()

    task = asyncio.get_running_loop().create_task(started_loop())
    await started.wait()
    stopper = asyncio.get_running_loop().create_task(stopping(task))
    await in_cleanup.wait()  # the stopper cancelled the task and waits for it
    stopper.cancel()
    cleanup_may_end.set()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert task_done_when_stopper_left == [True]
    assert task.cancelled()


async def test_an_error_the_task_ends_with_reaches_the_caller() -> None:
    started = asyncio.Event()

    async def loop() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            raise ValueError("cleanup failed")

    task = asyncio.get_running_loop().create_task(loop())
    await started.wait()
    with pytest.raises(ValueError, match="cleanup failed"):
        await stop_task(task)
