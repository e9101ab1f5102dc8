"""ZooKeeper administration: walk ``/aiolocks/<kind>/`` for locks, delete holder nodes.

With ``layout=curator`` the walk starts at the root instead, and a folder's
kind is told by its lock nodes' names (a semaphore mutex is listed as a
semaphore there: Curator lays both out the same way).

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
        """Every lock path with lock nodes below it, walking only where ``prefix`` leads.

        A semaphore's own ``leases``/``locks`` folders are walked into too:
        ``x/leases`` is a valid name of its own, whose folder is the one
        holding ``x``'s lease nodes (skipped as nodes), and which is listed
        when *its* ``leases``/``locks`` folders hold nodes.
        """
        found: list[tuple[Family, str]] = []
        if self._driver.layout == "curator":
            await self._walk_curator("", prefix, found)
            return found
        wanted = _escape(prefix)
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
            candidate = f"{name}/{child}" if name else child
            if candidate.startswith(wanted) or wanted.startswith(candidate):
                await self._walk(family, f"{path}/{child}", candidate, wanted, found)

    async def _walk_curator(self, name: str, wanted: str, found: list[tuple[Family, str]]) -> None:
        """``layout=curator``: a lock is any folder with lock nodes; their names give its kind.

        The walk starts at the root (below the chroot) and follows only the
        folders ``wanted`` leads to; ``/zookeeper`` is the server's own.
        """
        internals = self._driver.internals
        deadline = time.monotonic() + self._timeout
        path = f"/{name}" if name else "/"
        children = await internals.list_children(path, deadline)
        family = await self._curator_family(path, children, deadline)
        if family is not None and name.startswith(wanted):
            found.append((family, name))
        for child in children:
            if parse_node(path, child) is not None or (not name and child == "zookeeper"):
                continue
            candidate = f"{name}/{child}" if name else child
            if candidate.startswith(wanted) or wanted.startswith(f"{candidate}/"):
                await self._walk_curator(candidate, wanted, found)

    async def _curator_family(
        self, path: str, children: list[str], deadline: float
    ) -> Family | None:
        """Which recipe's nodes a folder holds (a semaphore mutex is a semaphore there)."""
        kinds = {n.kind for n in (parse_node(path, c) for c in children) if n is not None}
        if kinds & {"read", "write"}:
            return Family.READ_WRITE
        if "latch" in kinds:
            return Family.LEADER
        if "lock" in kinds:
            return Family.MUTEX
        internals = self._driver.internals
        base = path.rstrip("/")
        for sub in _SEMAPHORE_DIRS:
            if sub in children:
                entries = await internals.list_children(f"{base}/{sub}", deadline)
                if any(parse_node(base, c) is not None for c in entries):
                    return Family.SEMAPHORE
        return None

    async def _curator_holds(self, name: str, family: Family) -> bool:
        """``layout=curator``: the folder of ``name`` holds ``family``'s nodes.

        A semaphore mutex's folder cannot be told from a semaphore's (Curator
        lays both out alike): it is listed, and force-released, as a semaphore.
        """
        if family is Family.SEMAPHORE_MUTEX:
            return False
        path = self._driver.path_of(family, name)
        deadline = time.monotonic() + self._timeout
        children = await self._driver.internals.list_children(path, deadline)
        return await self._curator_family(path, children, deadline) is family

    async def force_release(self, name: str, family: Family) -> int:
        """Delete the node of every holder (waiters stay queued and move up)."""
        driver = self._driver
        internals = driver.internals
        if driver.layout == "curator" and not await self._curator_holds(name, family):
            # Every family maps to the same folder there: act only on the
            # recipe whose nodes are in it, else a second family's pass
            # would delete the waiter that the first pass made the holder.
            return 0
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
