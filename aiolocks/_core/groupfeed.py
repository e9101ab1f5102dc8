"""One read of a group per backend, shared by everything in the process that follows it.

Every ``group.watch()`` iterator, every ``Partitioner.changes()`` and every
membership's check of its own record needs the member list after each
change. Reading it once per follower multiplies the store's reads by the
number of followers in the process; here one :class:`_Follower` per
(backend, group) runs the snapshot loop in a service task of the backend
and publishes each read to its subscribers.

* **Latest state, in order.** Each read (or failure) gets the next sequence
  number; a subscriber takes the newest one after the one it saw last: a
  slow consumer skips intermediate states, never the last one, and never
  sees an older state after a newer one.
* **Fresh on arrival.** A new subscriber only takes a read that *started*
  after it subscribed (it wakes the follower for it, and several arriving
  together share one read): a member checking its own record never judges
  a list read before its join, and ``watch()`` still starts with the
  members now.
* **Lifetime.** The first subscriber starts the task; the last one leaving
  cancels it. The backend's ``close()`` cancels it too: its subscribers
  then get :class:`BackendUnavailableError` ("closed").
* **Errors.** A failed read is published like a state (the consumer
  decides: ``watch()`` raises it, a membership's check waits for the next
  read) and the follower reads again after a growing pause.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .backoff import Backoff
from .errors import BackendUnavailableError
from .records import Record, Records
from .tasks import wait_done, wait_finished

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["GroupRead", "Subscription", "subscribe"]

logger = logging.getLogger("aiolocks")

#: how long the follower waits between two reads when nothing wakes it
RECHECK = 30.0


@dataclass(frozen=True, slots=True)
class GroupRead:
    """One read of the group: its records (child -> record) or the error it raised."""

    seq: int
    #: the number of the read (reads are numbered as they start)
    read_no: int
    records: dict[str, Record]
    error: Exception | None = None

    @property
    def state(self) -> tuple[tuple[str, int], ...]:
        """The sorted (child, record version) pairs: equal reads have equal states."""
        return tuple(sorted((child, record.version) for child, record in self.records.items()))


class _Follower:
    """The snapshot loop of one group prefix in one backend, and its subscribers."""

    def __init__(self, engine: Engine, store: Records, prefix: str) -> None:
        self.engine = engine
        self.store = store
        self.prefix = prefix
        self.subscribers = 0
        self.latest: GroupRead | None = None
        #: reads started so far; a subscriber wants a read numbered above its arrival's
        self.reads = 0
        self.wanted = 0
        self.ended = False
        loop = asyncio.get_running_loop()
        self._news: asyncio.Future[None] = loop.create_future()
        self._poke: asyncio.Future[None] | None = None
        self.task = engine.tasks.spawn(
            self._run(), name=f"aiolocks-group-follower:{prefix}", service=True
        )
        self.task.add_done_callback(self._on_done)

    def want_fresh(self) -> int:
        """Ask for a read starting from now on; its number."""
        self.wanted = max(self.wanted, self.reads + 1)
        poke = self._poke
        if poke is not None and not poke.done():
            poke.set_result(None)
        return self.wanted

    async def _run(self) -> None:
        backoff = Backoff(float("inf"), first=0.1, cap=2.0)
        # (a driver may turn a cancellation into an error: hence the checks)
        while self.subscribers > 0 and not self.engine.closed:
            self.reads += 1
            read_no = self.reads
            try:
                with await self.store.snapshot(self.prefix) as snap:
                    self._publish(read_no, snap.records, None)
                    backoff = Backoff(float("inf"), first=0.1, cap=2.0)
                    if self.wanted <= read_no:
                        await self._wait(snap.changed(RECHECK))
            except Exception as exc:
                logger.debug("following group %r: %s", self.prefix, exc)
                self._publish(read_no, {}, exc)
                await backoff.wait()

    async def _wait(self, changed: Coroutine[Any, Any, None]) -> None:
        """Wait for the snapshot's change or a subscriber asking for a fresh read."""
        waiting = asyncio.ensure_future(changed)
        poke = self._poke = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait((waiting, poke), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._poke = None
            if not waiting.done():  # end the wait before the snapshot closes
                waiting.cancel()
                again = await wait_finished(waiting)
                if again is not None:
                    raise again
        if not waiting.cancelled() and waiting.done():
            waiting.result()  # (a failed wait is a failed read)

    def _publish(self, read_no: int, records: dict[str, Record], error: Exception | None) -> None:
        seq = 1 if self.latest is None else self.latest.seq + 1
        self.latest = GroupRead(seq, read_no, dict(records), error)
        self._wake()

    def _wake(self) -> None:
        news, self._news = self._news, asyncio.get_running_loop().create_future()
        if not news.done():
            news.set_result(None)

    def _on_done(self, task: asyncio.Task[None]) -> None:
        self.ended = True
        followers = _followers.get(self.engine)
        if followers is not None and followers.get(self.prefix) is self:
            del followers[self.prefix]
        if not self._news.done():
            self._news.set_result(None)

    def leave(self) -> None:
        """One subscriber less; the last one stops the task."""
        self.subscribers -= 1
        if self.subscribers <= 0:
            followers = _followers.get(self.engine)
            if followers is not None and followers.get(self.prefix) is self:
                del followers[self.prefix]
            self.task.cancel()

    async def next_read(self, seen: int, fresh: int) -> GroupRead:
        """The latest read newer than ``seen`` and numbered ``fresh`` or above."""
        while True:
            latest = self.latest
            if latest is not None and latest.seq > seen and latest.read_no >= fresh:
                return latest
            if self.ended:
                self.engine.check_open()
                raise BackendUnavailableError(f"following the group {self.prefix!r} ended")
            await wait_done(self._news)


class Subscription:
    """One follower of a group: ``await next()`` gives each newer read in turn."""

    __slots__ = ("_follower", "_fresh", "_seen")

    def __init__(self, follower: _Follower) -> None:
        self._follower = follower
        self._seen = 0
        self._fresh = follower.want_fresh()

    async def next(self) -> GroupRead:
        """The latest read after the last one returned (the first: read after subscribing)."""
        read = await self._follower.next_read(self._seen, self._fresh)
        self._seen = read.seq
        return read


_followers: weakref.WeakKeyDictionary[Engine, dict[str, _Follower]] = weakref.WeakKeyDictionary()


@contextmanager
def subscribe(engine: Engine, store: Records, prefix: str) -> Iterator[Subscription]:
    """Follow the group at ``prefix`` for the ``with`` block (no I/O; no await).

    :raises BackendUnavailableError: the backend is closed.
    """
    engine.check_open()
    followers = _followers.setdefault(engine, {})
    follower = followers.get(prefix)
    if follower is None or follower.ended:
        follower = followers[prefix] = _Follower(engine, store, prefix)
    follower.subscribers += 1
    try:
        yield Subscription(follower)
    finally:
        follower.leave()


def follower_task(engine: Engine, prefix: str) -> asyncio.Task[None] | None:
    """The follower task of ``prefix`` in ``engine`` now, if any (for tests)."""
    follower = _followers.get(engine, {}).get(prefix)
    return None if follower is None else follower.task
