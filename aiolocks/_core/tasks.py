"""Owned background tasks and cancellation-proof waiting.

Two rules of the engine live here:

* Every background task (abandoned acquire attempts, releases sent again
  after a cancellation, orphan cleanup, leader loops, renewal loops) is owned
  by the engine's one :class:`TaskSet`, which the backend drains on
  ``close()``. No fire-and-forget ``create_task``, no task set in a driver.
* Work that must reach the server after the caller was cancelled runs in
  its own task and is awaited with
  :func:`wait_finished`, which keeps waiting when the caller is cancelled and
  reports the cancellation afterwards. A bare ``CancelScope(shield=True)`` is
  pierced by a second native ``task.cancel()``; a separate task is not, and
  anyio's level-triggered cancellation cannot re-cancel it either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

__all__ = [
    "TaskSet",
    "cancelled_again",
    "gather_keeping_cancel",
    "running_task",
    "stop_task",
    "wait_done",
    "wait_finished",
]

T = TypeVar("T")

logger = logging.getLogger("aiolocks")


#: The Python versions whose asyncio this module was tested against (lowest,
#: highest): asyncio's private dict of running tasks is read only on these.
TESTED_PYTHONS = ((3, 11), (3, 13))

CurrentTasks = dict[asyncio.AbstractEventLoop, "asyncio.Task[Any]"]


def _private_current_tasks(version: tuple[int, ...] | None = None) -> CurrentTasks | None:
    """asyncio's private dict of running tasks, where reading it is known to be right and worth it.

    Only on a tested Python (:data:`TESTED_PYTHONS`) whose
    ``asyncio.current_task`` is the Python function over that dict (3.11):
    there, reading the dict skips a Python frame on every acquire and
    release. ``None`` anywhere else (``current_task`` written in C from 3.12
    on, an untested Python, the dict renamed or gone): callers then use the
    public ``asyncio.current_task``.
    """
    low, high = TESTED_PYTHONS
    if not low <= tuple((version or sys.version_info)[:2]) <= high:
        return None
    if getattr(asyncio.current_task, "__module__", None) != "asyncio.tasks":
        return None  # written in C: already as fast as the dict
    tasks = getattr(asyncio.tasks, "_current_tasks", None)
    return tasks if isinstance(tasks, dict) else None


def _running_task_reader(tasks: CurrentTasks | None) -> Callable[[], asyncio.Task[Any] | None]:
    """``asyncio.current_task`` itself, or (given the private dict) the same without its frame."""
    if tasks is None:
        return asyncio.current_task
    get_loop = asyncio.get_running_loop
    get = tasks.get

    def running_task() -> asyncio.Task[Any] | None:
        """The running task (``None`` outside one); ``RuntimeError`` without a running loop."""
        return get(get_loop())

    return running_task


def _task_of_loop_reader(
    tasks: CurrentTasks | None,
) -> Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None]:
    """``asyncio.current_task`` itself, or (given the private dict) its lookup by loop."""
    if tasks is None:
        return asyncio.current_task
    return tasks.get


_CURRENT_TASKS = _private_current_tasks()

#: The running task, exactly ``asyncio.current_task()``: ``None`` outside a
#: task, ``RuntimeError`` without a running loop. Every acquire and release
#: asks it; on Python 3.11 ``asyncio.current_task`` is a Python function over
#: the C-level dict of current tasks, which this reads directly (several
#: times cheaper); from 3.12 on it is written in C and used as it is.
running_task: Callable[[], asyncio.Task[Any] | None] = _running_task_reader(_CURRENT_TASKS)

#: ``task_of_loop(asyncio.get_running_loop())`` is :func:`running_task` with
#: one Python frame less on Python 3.11 (the locks' acquire and release).
task_of_loop: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None] = (
    _task_of_loop_reader(_CURRENT_TASKS)
)


class TaskSet:
    """Background tasks owned by one backend."""

    __slots__ = ("_services", "_tasks")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        #: the long-lived ones among ``_tasks`` (see ``spawn(service=True)``)
        self._services: set[asyncio.Task[Any]] = set()

    def spawn(
        self,
        coro: Coroutine[Any, Any, T],
        *,
        name: str,
        log_errors: bool = True,
        service: bool = False,
    ) -> asyncio.Task[T]:
        """Start ``coro`` as a task owned by this set.

        ``service``: a watcher that lives as long as something it serves (a
        lease's ``release_by_id`` desk), ended by its owner; ``len()`` does
        not count it as work in flight. ``drain`` finishes it like any task.
        """
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        if service:
            self._services.add(task)
        task.add_done_callback(self._on_done if log_errors else self._on_done_quiet)
        return task

    def _on_done_quiet(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._services.discard(task)
        if not task.cancelled():
            task.exception()  # mark retrieved; the awaiting side handles it

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._services.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error("background task %s failed", task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        """Background work in flight (services not counted)."""
        return len(self._tasks) - len(self._services)

    async def drain(self, *, cancel: bool) -> None:
        """Wait for every task (cancelling them first when ``cancel``), even if cancelled.

        Only tasks not done yet are waited for: a done task whose done
        callback (which takes it out of the set) has not run yet needs
        nothing more. Waiting for it would also spin: since Python 3.12,
        ``asyncio.gather`` of done tasks returns a finished future, so no
        await would ever let the event loop run that callback.
        """
        while True:
            pending = [task for task in self._tasks if not task.done()]
            if not pending:
                return
            if cancel:
                for task in pending:
                    task.cancel()
            gathered = asyncio.gather(*pending, return_exceptions=True)
            cancelled = await wait_finished(gathered)
            if cancelled:
                raise asyncio.CancelledError


async def wait_done(fut: asyncio.Future[Any], timeout: float | None = None) -> bool:
    """Wait until ``fut`` is done or ``timeout`` passed; ``True`` if done. Never cancels ``fut``.

    A cancellation of the caller propagates (``fut`` goes on). One plain
    future and a timer per wait: ``asyncio.wait()`` builds sets and closures,
    and this runs on the acquire/release paths.
    """
    if fut.done():
        return True
    if timeout is not None and timeout <= 0:
        return False
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    fut.add_done_callback(wake)
    timer = None if timeout is None else loop.call_later(timeout, wake)
    try:
        await waiter
    finally:
        fut.remove_done_callback(wake)
        if timer is not None:
            timer.cancel()
    return fut.done()


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
    loop = asyncio.get_running_loop()
    end = None if timeout is None else loop.time() + timeout
    while not fut.done():
        try:
            if not await wait_done(fut, None if end is None else end - loop.time()):
                break  # timed out
        except asyncio.CancelledError as exc:
            # anyio re-delivers its cancellation on every await while the scope
            # is cancelled; we keep waiting, because leaving now would strand
            # a node or key on the server.
            if cancelled is None:
                cancelled = exc
                if cancel_inner:
                    fut.cancel()
    return cancelled


async def stop_task(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` (a loop of our own) and wait until it has ended.

    The wait goes on through a cancellation of the caller, which is raised
    afterwards: the task is gone either way. An error the task ended with
    (other than its cancellation) is raised to the caller.
    """
    task.cancel()
    cancelled = await wait_finished(task)
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation is what counts
        raise cancelled
    if not task.cancelled():
        task.result()


async def gather_keeping_cancel(
    coros: Sequence[Coroutine[Any, Any, T]], *, return_exceptions: bool = False
) -> list[Any]:
    """``asyncio.gather`` for concurrent calls, keeping the caller's cancellation intact.

    (Redlock's calls to every master use it.)

    When the caller is cancelled, ``gather`` may raise a new, bare
    ``CancelledError`` (the one of whichever call finished last) instead of
    the one the caller was cancelled with. anyio's cancel scopes recognise
    their own cancellation by its message, so a bare one escapes a
    ``move_on_after`` block as an error. Here the calls run as tasks, the
    caller's own ``CancelledError`` is re-raised once every call has
    finished (they are cancelled, and they record what they may have
    written on the way), and repeated cancel deliveries meanwhile (anyio
    re-delivers until the scope is left) are absorbed.
    """
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(coro) for coro in coros]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks)
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        while not all(task.done() for task in tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(tasks)
        for task in tasks:  # retrieved: the caller's cancellation is what counts
            if not task.cancelled():
                task.exception()
        raise
    results: list[Any] = []
    for task in tasks:
        if task.cancelled():
            if not return_exceptions:
                raise asyncio.CancelledError()  # a call cancelled by somebody else
            results.append(asyncio.CancelledError())
            continue
        exc = task.exception()
        if exc is not None:
            if not return_exceptions:
                raise exc
            results.append(exc)
        else:
            results.append(task.result())
    return results


async def cancelled_again() -> None:
    """Raise the cancellation a client library swallowed (the task is still cancelling).

    The swallowed error carried its canceller's message, now lost. anyio's
    cancel scopes catch only a cancellation with their own message, and they
    deliver it again on every loop pass while the task is still inside: give
    them two passes to do so, so that ``move_on_after`` around an acquire ends
    the scope instead of cancelling the whole task. A plain ``Task.cancel()``
    is not delivered again: a message-less error stands in for it (asyncio's
    timeouts count cancellations, not messages).
    """
    for _ in range(2):
        await asyncio.sleep(0)
    raise asyncio.CancelledError()
