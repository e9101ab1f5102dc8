"""Cancellation at every await point of a record-based recipe.

:class:`CancellingStore` wraps a backend's real record store (the server is
still real) and cancels a chosen task when the ``at``-th store call begins
(or, with ``after``, when it returned). :func:`sweep` runs a scenario once
per call position, both ways, until a run makes fewer calls than the
position: every await point on the store has then been hit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import aiolocks
from aiolocks._core.records import Records, SupportsRecords

__all__ = ["CancellingStore", "store_of", "sweep"]


def store_of(backend: aiolocks.Backend) -> Records:
    """The backend's record store, or skip the test when it has none."""
    driver = backend._driver
    if not isinstance(driver, SupportsRecords):
        pytest.skip("backend has no record store")
    return driver.records()


class CancellingStore:
    """A record store that cancels ``victim`` at its ``at``-th call."""

    def __init__(self, inner: Records, at: int, *, after: bool) -> None:
        self.inner = inner
        self.at = at
        self.after = after
        self.calls = 0
        self.victim: asyncio.Task[Any] | None = None

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        hit = self.calls == self.at and self.victim is not None
        if hit and not self.after:
            assert self.victim is not None
            self.victim.cancel()
        result = await getattr(self.inner, method)(*args, **kwargs)
        if hit and self.after:
            assert self.victim is not None
            self.victim.cancel()
        return result

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("create", *args, **kwargs)

    async def join(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("join", *args, **kwargs)

    async def update(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("update", *args, **kwargs)

    async def delete(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("delete", *args, **kwargs)

    async def read(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("read", *args, **kwargs)

    async def snapshot(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("snapshot", *args, **kwargs)


async def sweep(
    backend: aiolocks.Backend,
    monkeypatch: pytest.MonkeyPatch,
    scenario: Callable[[int], Awaitable[None]],
    check: Callable[[int], Awaitable[None]],
    *,
    limit: int = 40,
) -> int:
    """Run ``scenario(run)`` with the store cancelling its task at call 1, 2, ... (before and
    after the call), then ``check(run)``; the number of store calls of an uncancelled run."""
    driver = backend._driver
    inner = store_of(backend)
    hits = 0
    for at in range(1, limit):
        for after in (False, True):
            wrapper = CancellingStore(inner, at, after=after)
            monkeypatch.setattr(driver, "records", lambda wrapper=wrapper: wrapper)
            run = 2 * at + after
            task = asyncio.ensure_future(scenario(run))
            wrapper.victim = task
            try:
                await asyncio.wait_for(asyncio.shield(task), 30)
            except asyncio.CancelledError:
                hits += 1
            finally:
                monkeypatch.setattr(driver, "records", lambda: inner)
            await check(run)
            if wrapper.calls < at:
                assert hits, "no run was cancelled"
                return at - 1
    raise AssertionError(f"the scenario still made {limit} store calls")
