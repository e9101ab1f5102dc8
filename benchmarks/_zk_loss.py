"""ZooKeeper loss latency: a held node deleted behind the holder's back -> body cancelled.

One sample: an aiolocks backend holds a mutex and its ``async with`` body
waits; a plain aiozk client (another session, as an operator or ``aiolocks
break`` would be) deletes the lock node; the body records when its
cancellation arrives. The clock starts just before the delete is sent, so a
sample includes the delete's trip to the server (an upper bound on the time
from the server-side deletion). The holder keeps a waiter-free queue, so
this measures the uncontended path (the child watch of the acquire's own
listing).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aiozk

import aiolocks

from ._stats import percentile

__all__ = ["zookeeper_loss_latency"]

#: an upper bound for one sample; a sample that hits it counts as missed
_BOUND_S = 10.0


async def _one(backend: aiolocks.Backend, deleter: Any, chroot: str, name: str) -> float | None:
    """Milliseconds from the delete to the body's cancellation; ``None`` if it never came."""
    lock = backend.mutex(name)
    inside = asyncio.Event()
    cancelled_at: list[float] = []

    async def body() -> None:
        try:
            async with lock:
                inside.set()
                try:
                    await asyncio.sleep(_BOUND_S * 2)
                except asyncio.CancelledError:
                    cancelled_at.append(time.perf_counter())
                    raise
        except aiolocks.LockLostError:
            pass

    task = asyncio.create_task(body())
    try:
        await asyncio.wait_for(inside.wait(), _BOUND_S)
        holders = [p for p in await lock.participants() if p.is_holder]
        path = holders[0].node if holders else None
        if path is None:
            raise RuntimeError(f"no holder node listed for {name!r}")
        started = time.perf_counter()
        await deleter.delete(f"{chroot}{path}" if chroot else path)
        await asyncio.wait_for(asyncio.shield(task), _BOUND_S)
    except TimeoutError:
        return None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    if not cancelled_at:
        return None
    return (cancelled_at[0] - started) * 1000.0


async def zookeeper_loss_latency(url: str, samples: int) -> dict[str, Any]:
    """p50/p99 (ms) from a server-side deletion of a held node to the body's cancellation."""
    hosts, _, rest = url.removeprefix("zk://").partition("/")
    chroot = "/" + rest.split("?", 1)[0] if rest else ""
    backend = await aiolocks.connect(url)
    deleter = aiozk.ZKClient(hosts, session_timeout=10)
    await deleter.start()
    values: list[float] = []
    missed = 0
    try:
        # warm up: parents exist, connections are hot
        async with backend.mutex("bench/loss/warmup"):
            pass
        for _ in range(samples):
            ms = await _one(backend, deleter, chroot.rstrip("/"), f"bench/loss/{uuid.uuid4().hex}")
            if ms is None:
                missed += 1
            else:
                values.append(ms)
    finally:
        await deleter.close()
        await backend.close()
    return {
        "samples": len(values),
        "missed": missed,
        "p50_ms": percentile(values, 50),
        "p99_ms": percentile(values, 99),
        "max_ms": max(values) if values else None,
    }
