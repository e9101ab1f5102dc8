"""The process-local lock store: FIFO queues and futures, no server.

It is the engine of the ``memory://`` backend (``aiolocks.memory`` adds
administration and ``doctor`` on top) and the store the engine takes degraded
holds from when the server is unreachable (``on_unavailable="local"``). It
lives in ``_core`` so that the core imports no backend package.

One :class:`_Queue` per (family, name): ``holders`` in grant order and
``waiters`` in arrival order. :meth:`_Store.pump` grants from the head of the
waiters while the head is grantable and stops at the first that is not, so
the queue is strictly FIFO: a reader behind a waiting writer waits, a small
semaphore request behind a large one waits. A waiter awaits its own future;
nothing polls.
"""

from __future__ import annotations

import asyncio
import types
import weakref
from collections.abc import Generator, Mapping
from typing import cast

from .driver import Attempt, Capabilities, Family, Grant, Mode, Request
from .options import check_portable_options
from .participants import Participant
from .tasks import TaskSet, wait_done

__all__ = ["LocalDriver"]


class _Entry(Attempt):
    """One acquire attempt: its place in the queue and, once granted, its grants."""

    __slots__ = ("future", "grants", "queued")

    def __init__(self, request: Request) -> None:
        # Attempt.__init__'s two fields set here: one call less per acquire
        self.request = request
        self.deadline: float | None = None
        self.future: asyncio.Future[None] | None = None
        self.grants: list[Grant] | None = None
        self.queued = False

    def granted(self) -> list[Grant] | None:
        """The grants, once the queue granted this entry (a call, so mypy does not narrow)."""
        return self.grants


class _Queue:
    __slots__ = ("holders", "waiters")

    def __init__(self) -> None:
        self.holders: dict[Grant, None] = {}
        self.waiters: list[_Entry] = []

    def grantable(self, request: Request) -> bool:
        if request.mode is Mode.READ:
            return not any(g.request.mode is Mode.WRITE for g in self.holders)
        if request.mode is Mode.LEASE:
            return len(self.holders) + request.count <= request.max_leases
        return not self.holders


class _Store:
    """Everything one ``memory://<store>`` holds: queues and fencing counters."""

    __slots__ = ("queues", "tokens")

    def __init__(self) -> None:
        self.queues: dict[tuple[Family, str], _Queue] = {}
        self.tokens: dict[tuple[Family, str], int] = {}

    def queue(self, family: Family, name: str) -> _Queue:
        key = (family, name)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = _Queue()
        return queue

    def drop_if_idle(self, family: Family, name: str) -> None:
        queue = self.queues.get((family, name))
        if queue is not None and not queue.holders and not queue.waiters:
            del self.queues[(family, name)]

    def grant(self, queue: _Queue, request: Request) -> list[Grant]:
        key = (request.family, request.name)
        if request.count == 1:
            token = self.tokens[key] = self.tokens.get(key, 0) + 1
            grant = Grant(request, token, key)  # handle: the queue's key
            queue.holders[grant] = None
            return [grant]
        grants = []
        for _ in range(request.count):
            token = self.tokens.get(key, 0) + 1
            self.tokens[key] = token
            grant = Grant(request, token, handle=key)
            queue.holders[grant] = None
            grants.append(grant)
        return grants

    def pump(self, family: Family, name: str) -> None:
        queue = self.queues.get((family, name))
        if queue is None:
            return
        while queue.waiters and queue.grantable(queue.waiters[0].request):
            entry = queue.waiters.pop(0)
            entry.queued = False
            entry.grants = self.grant(queue, entry.request)
            if entry.future is not None and not entry.future.done():
                entry.future.set_result(None)
        self.drop_if_idle(family, name)

    def remove_waiter(self, entry: _Entry) -> None:
        request = entry.request
        queue = self.queues.get((request.family, request.name))
        if queue is not None and entry.queued:
            entry.queued = False
            queue.waiters.remove(entry)
        # A waiter leaving the head can unblock the ones behind it.
        self.pump(request.family, request.name)

    def release(self, grant: Grant) -> bool:
        request = grant.request
        key = (request.family, request.name)
        queue = self.queues.get(key)
        if queue is None:
            return False
        held = grant in queue.holders
        if held:
            del queue.holders[grant]
        if queue.waiters:
            self.pump(request.family, request.name)
        elif not queue.holders:
            del self.queues[key]
        return held


@types.coroutine
def _yield() -> Generator[None, None, None]:
    """One pass of the event loop, like ``asyncio.sleep(0)`` without its extra frame."""
    yield


# One dict of stores per event loop: futures belong to a loop.
_stores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Store]] = (
    weakref.WeakKeyDictionary()
)


def _store(name: str) -> _Store:
    loop = asyncio.get_running_loop()
    stores = _stores.get(loop)
    if stores is None:
        stores = _stores[loop] = {}
    store = stores.get(name)
    if store is None:
        store = stores[name] = _Store()
    return store


class LocalDriver:
    """In-process driver: FIFO queues and futures. See the module docstring.

    ``memory://`` is this driver with administration and ``doctor`` added
    (``aiolocks.memory._driver.MemoryDriver``); the engine takes its degraded
    holds (``on_unavailable="local"``) from a bare one.
    """

    capabilities = Capabilities(fair=True, queue_visible=True, can_lose=False)

    def __init__(self, store: str = "default") -> None:
        self._store_name = store
        self._store: _Store | None = None

    def describe(self) -> str:
        """``memory://`` or ``memory://<store>``."""
        return "memory://" if self._store_name == "default" else f"memory://{self._store_name}"

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        """Accept ``fair`` (always FIFO here), ``lease_time`` and ``watchdog`` (no effect here).

        They are accepted so that code written for a server backend runs
        unchanged on ``memory://``; memory holds never lapse.
        """
        return check_portable_options(family, options, "memory://")

    async def open(self, tasks: TaskSet) -> None:
        """Bind to this event loop's store (no background work)."""
        self._store = _store(self._store_name)

    def _get_store(self) -> _Store:
        if self._store is None:
            self._store = _store(self._store_name)
        return self._store

    def begin(self, request: Request) -> Attempt:
        """A queue entry, not yet queued."""
        return _Entry(request)

    async def try_once(self, attempt: Attempt) -> list[Grant] | None:
        """Join the queue on the first try; granted when the queue reaches this entry."""
        entry = cast(_Entry, attempt)
        if entry.grants is not None:
            return entry.grants
        if entry.queued:
            return None
        request = entry.request
        store = self._store or self._get_store()
        key = (request.family, request.name)
        queue = store.queues.get(key)
        if queue is None:
            # Nobody holds or waits: granted at once (a downgrade always
            # finds its write hold's queue, and count <= max_leases was
            # checked before any of this).
            queue = store.queues[key] = _Queue()
            entry.grants = store.grant(queue, request)
            return entry.grants
        if not queue.waiters and request.downgrade_of is None and queue.grantable(request):
            # Nobody queued ahead: granted at once (what queueing and pumping
            # would do, without the round trip through the waiters list).
            entry.grants = store.grant(queue, request)
            return entry.grants
        downgrade = request.downgrade_of
        if downgrade is not None and downgrade in queue.holders:
            # Write -> read downgrade: granted at once, ahead of every waiter,
            # so a queued writer cannot slip in when the write is released.
            entry.grants = store.grant(queue, request)
            return entry.grants
        entry.queued = True
        queue.waiters.append(entry)
        store.pump(request.family, request.name)
        return entry.granted()

    async def wait_for_change(self, attempt: Attempt, bound: float | None) -> None:
        """Wait on the entry's future (set when the queue grants it) or ``bound``."""
        entry = cast(_Entry, attempt)
        if entry.grants is not None:
            return
        future = entry.future
        if future is None:
            future = entry.future = asyncio.get_running_loop().create_future()
        await wait_done(future, bound)

    async def abandon(self, attempt: Attempt) -> None:
        """Leave the queue, or give back what the queue granted meanwhile."""
        entry = cast(_Entry, attempt)
        store = self._get_store()
        granted, entry.grants = entry.grants, None
        if granted is not None:
            for grant in granted:
                store.release(grant)
        else:
            store.remove_waiter(entry)

    def finish(self, attempt: Attempt) -> None:
        """Nothing to drop: the future is the entry's own."""

    async def release(self, grant: Grant) -> bool:
        """Remove the holder and grant to the next waiters; ``False`` if it was not held.

        Yields to the event loop first, as a release over the network does, so
        that code tested on ``memory://`` meets the same cancellation point
        (the engine then finishes the release).
        """
        await _yield()
        return (self._store or self._get_store()).release(grant)

    async def participants(self, name: str, family: Family) -> list[Participant]:
        """Holders in grant order, then waiters in arrival order."""
        queue = self._get_store().queues.get((family, name))
        if queue is None:
            return []
        holders = [
            Participant(
                id=grant.request.participant,
                is_holder=True,
                fencing_token=grant.token,
                mode=grant.request.mode.value,
            )
            for grant in queue.holders
        ]
        waiters = [
            Participant(
                id=entry.request.participant, is_holder=False, mode=entry.request.mode.value
            )
            for entry in queue.waiters
        ]
        return holders + waiters

    async def close(self) -> None:
        """Nothing to disconnect; the core has released every hold."""
