"""The one polling helper of the test suite.

The library never polls: it waits on events (futures, watches, pub/sub,
LISTEN). A test sometimes has to wait for something it cannot be told about:
a server-side reaper, a lease lapsing, a waiter reaching a server queue.
It polls the real condition with :func:`eventually`, bounded, and fails with
the condition's description. Never a bare sleep as synchronisation.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

import aiolocks

__all__ = ["eventually", "settle"]


async def eventually(
    predicate: Callable[[], object | Awaitable[object]],
    timeout: float = 10.0,
    *,
    what: str = "",
    interval: float = 0.01,
) -> None:
    """Return once ``predicate()`` is truthy; ``AssertionError`` naming ``what`` after ``timeout``.

    ``predicate`` may be a plain function or return an awaitable (a coroutine
    function, or a lambda calling one); it is asked first at once, then every
    ``interval`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        await asyncio.sleep(interval)


async def settle(*backends: aiolocks.Backend, timeout: float = 10.0) -> None:
    """Wait until the background work every backend owns (re-sent releases, clean-ups,
    orphan releases) is done; ``AssertionError`` after ``timeout``."""
    for _ in range(5):  # let done-callbacks (orphan release) run first
        await asyncio.sleep(0)
    await eventually(
        lambda: not any(len(backend._tasks) for backend in backends),
        timeout,
        what="the backends' background work to finish",
        interval=0.005,
    )
