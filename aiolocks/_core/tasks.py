"""Owned background tasks and cancellation-proof waiting.

Two idioms from STYLE.md live here:

* Every background task (acquire attempts, releases, orphan cleanup, leader
  loops) is owned by a :class:`TaskSet` that the backend drains on
  ``close()``. No fire-and-forget ``create_task``.
* Work that must reach the server runs in its own task and is awaited with
  :func:`wait_finished`, which keeps waiting when the caller is cancelled and
  reports the cancellation afterwards. A bare ``CancelScope(shield=True)`` is
  pierced by a second native ``task.cancel()``; a separate task is not, and
  anyio's level-triggered cancellation cannot re-cancel it either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["TaskSet", "wait_finished"]

T = TypeVar("T")

logger = logging.getLogger("aiolocks")


class TaskSet:
    """Background tasks owned by one backend."""

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(
        self, coro: Coroutine[Any, Any, T], *, name: str, log_errors: bool = True
    ) -> asyncio.Task[T]:
        """Start ``coro`` as a task owned by this set."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._on_done if log_errors else self._on_done_quiet)
        return task

    def _on_done_quiet(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # mark retrieved; the awaiting side handles it

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error("background task %s failed", task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self, *, cancel: bool) -> None:
        """Wait for every task (cancelling them first when ``cancel``), even if cancelled."""
        while self._tasks:
            pending = list(self._tasks)
            if cancel:
                for task in pending:
                    task.cancel()
            gathered = asyncio.gather(*pending, return_exceptions=True)
            cancelled = await wait_finished(gathered)
            if cancelled:
                raise asyncio.CancelledError


async def wait_finished(
    fut: asyncio.Future[Any], *, cancel_inner: bool = False, timeout: float | None = None
) -> asyncio.CancelledError | None:
    """Wait until ``fut`` is done, whatever happens to the caller meanwhile.

    Returns the first :class:`asyncio.CancelledError` delivered to the caller
    while waiting (``None`` if there was none); the caller re-raises it once it
    has dealt with the outcome, so cancellation is delayed, never swallowed.
    With ``cancel_inner``, the first cancellation is passed on to ``fut``
    (used for acquire attempts, whose own cleanup then runs to completion).
    With ``timeout``, stop waiting after that many seconds (``fut`` goes on).
    """
    cancelled: asyncio.CancelledError | None = None
    if fut.done():
        return None
    loop = asyncio.get_running_loop()
    end = None if timeout is None else loop.time() + timeout
    timer: asyncio.TimerHandle | None = None
    while not fut.done():
        # One plain future per wait (asyncio.wait builds sets and closures).
        waiter: asyncio.Future[None] = loop.create_future()

        def wake(_: object, waiter: asyncio.Future[None] = waiter) -> None:
            if not waiter.done():
                waiter.set_result(None)

        fut.add_done_callback(wake)
        if end is not None:
            left = end - loop.time()
            if left <= 0:
                fut.remove_done_callback(wake)
                break
            timer = loop.call_later(left, wake, None)
        try:
            await waiter
        except asyncio.CancelledError as exc:
            # anyio re-delivers its cancellation on every await while the scope
            # is cancelled; we keep waiting, because leaving now would strand
            # a node or key on the server.
            if cancelled is None:
                cancelled = exc
                if cancel_inner:
                    fut.cancel()
        finally:
            fut.remove_done_callback(wake)
            if timer is not None:
                timer.cancel()
                timer = None
    return cancelled
