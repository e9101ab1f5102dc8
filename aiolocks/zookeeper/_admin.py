"""ZooKeeper administration: walk ``/aiolocks/<kind>/`` for locks, delete holder nodes.

A force-released holder learns at once that its node is gone (a watch on
the lock's folder or on its own node): its ``async with`` body is cancelled
and raises :class:`~aiolocks.LockLostError`. Waiters watching the deleted
node move up at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, final

from aiozk import exc as zk_exc
from aiozk import protocol

from .._core.driver import Family
from ._internals import parse_node
from ._layout import ROOT
from ._layout import escape as _escape

if TYPE_CHECKING:
    from ._driver import ZooKeeperDriver

__all__ = ["ZooKeeperAdmin", "unescape"]

#: the children of a semaphore's path that hold its nodes
_SEMAPHORE_DIRS = ("leases", "locks")
#: the families laid out as a semaphore (a semaphore mutex is one with one lease)
_LEASED = (Family.SEMAPHORE, Family.SEMAPHORE_MUTEX)


def unescape(escaped: str) -> str:
    """The inverse of the driver's path escaping (``%25``, ``%uXXXX``, ``%UXXXXXX``)."""
    if "%" not in escaped:
        return escaped
    out: list[str] = []
    i = 0
    while i < len(escaped):
        ch = escaped[i]
        if ch == "%" and escaped.startswith("%25", i):
            out.append("%")
            i += 3
        elif ch == "%" and escaped.startswith("%u", i):
            out.append(chr(int(escaped[i + 2 : i + 6], 16)))
            i += 6
        elif ch == "%" and escaped.startswith("%U", i):
            out.append(chr(int(escaped[i + 2 : i + 8], 16)))
            i += 8
        else:
            out.append(ch)
            i += 1
    return "".join(out)


@final
class ZooKeeperAdmin:
    """:class:`aiolocks._core.admin.AdminDriver` over a ZooKeeper driver."""

    def __init__(self, driver: ZooKeeperDriver, connect_timeout: float) -> None:
        self._driver = driver
        self._timeout = connect_timeout

    async def lock_names(self, prefix: str) -> list[tuple[Family, str]]:
        """Every lock path with lock nodes below it, walking only where ``prefix`` leads."""
        wanted = _escape(prefix)
        found: list[tuple[Family, str]] = []
        for family in Family:
            base = f"{ROOT}/{family.value}"
            await self._walk(family, base, "", wanted, found)
        return found

    async def _walk(
        self, family: Family, path: str, name: str, wanted: str, found: list[tuple[Family, str]]
    ) -> None:
        internals = self._driver.internals
        deadline = time.monotonic() + self._timeout
        children = await internals.list_children(path, deadline)
        if name and name.startswith(wanted):
            if family in _LEASED:
                holds = False
                for sub in _SEMAPHORE_DIRS:
                    if sub in children:
                        entries = await internals.list_children(f"{path}/{sub}", deadline)
                        holds = holds or any(parse_node(path, c) for c in entries)
            else:
                holds = any(parse_node(path, c) is not None for c in children)
            if holds:
                found.append((family, unescape(name)))
        for child in children:
            if parse_node(path, child) is not None:
                continue
            if family in _LEASED and child in _SEMAPHORE_DIRS and name:
                continue
            candidate = f"{name}/{child}" if name else child
            if candidate.startswith(wanted) or wanted.startswith(candidate):
                await self._walk(family, f"{path}/{child}", candidate, wanted, found)

    async def force_release(self, name: str, family: Family) -> int:
        """Delete the node of every holder (waiters stay queued and move up)."""
        driver = self._driver
        internals = driver.internals
        holders = [
            p.node for p in await driver.participants(name, family) if p.is_holder and p.node
        ]
        deadline = time.monotonic() + self._timeout
        removed = 0
        for node_path in holders:
            try:
                await internals.monitor.call(
                    protocol.DeleteRequest(path=internals._abs(node_path), version=-1),
                    deadline,
                    retry=True,
                )
            except zk_exc.NoNode:
                continue
            removed += 1
        return removed
