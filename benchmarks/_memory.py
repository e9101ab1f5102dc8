"""Memory per waiting task: N tasks wait on one held mutex, measured with tracemalloc.

What is counted: every Python allocation made while the N waiters queue up
(the task objects and their coroutine frames, the engine's attempt, the
driver's state, futures, watch callbacks, pub/sub doorbells), divided by N.
The waiters are then cancelled and the lock released, so the run also
checks that nothing is left held.
"""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
import uuid
from typing import Any

import aiolocks

__all__ = ["memory_per_waiter"]


async def _until_steady(timeout: float) -> None:
    """Wait until traced memory stops growing (every waiter has reached its wait)."""
    end = time.monotonic() + timeout
    last = -1
    steady = 0
    while time.monotonic() < end and steady < 3:
        await asyncio.sleep(0.2)
        current = tracemalloc.get_traced_memory()[0]
        steady = steady + 1 if abs(current - last) < 4096 else 0
        last = current


async def memory_per_waiter(url: str, waiters: int, *, timeout: float = 120.0) -> dict[str, Any]:
    """Bytes allocated per task waiting on one held mutex (``waiters`` tasks)."""
    async with aiolocks.connect(url) as backend:
        name = f"bench/memory/{uuid.uuid4().hex}"
        holder = backend.mutex(name)
        assert await holder.acquire()
        # Warm up the connection, pools and subscriptions with a few waiters.
        warm = [asyncio.create_task(backend.mutex(name).acquire()) for _ in range(4)]
        await asyncio.sleep(0.5)
        for task in warm:
            task.cancel()
        await asyncio.gather(*warm, return_exceptions=True)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tasks = [asyncio.create_task(backend.mutex(name).acquire()) for _ in range(waiters)]
            await _until_steady(timeout)
            gc.collect()
            used = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        acquired = sum(1 for r in results if r is True)
        await holder.release()
        return {
            "waiters": waiters,
            "bytes_per_waiter": used / waiters,
            "kib_per_waiter": round(used / waiters / 1024, 2),
            "acquired_by_waiters": acquired,
            "holds_left": len(backend._holds),
        }
