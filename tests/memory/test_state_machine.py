"""A Hypothesis state machine over ``memory://`` checking the lock invariants.

Actors are long-lived asyncio tasks (ownership is per task), each fed
commands through an inbox. Rules try, wait for, cancel and release holds on
one mutex, one read/write lock and one semaphore. Invariants after every
step: at most one exclusive holder; never a writer together with anybody
else; never more than ``max_leases`` leases; the backend's view
(``participants``) matches the model; once everything is released and no
waiter is left, the store holds nothing for these names.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import aiolocks
from aiolocks._core.localstore import _stores

ACTORS = 4
MAX_LEASES = 2
Command = Callable[[], Awaitable[Any]]


class Actor:
    """One asyncio task that runs the commands it is sent, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, index: int) -> None:
        self.inbox: asyncio.Queue[tuple[Command, asyncio.Future[Any]]] = asyncio.Queue()
        self.task = loop.create_task(self._serve(), name=f"actor-{index}")
        self.waiting: asyncio.Future[Any] | None = None

    async def _serve(self) -> None:
        while True:
            command, reply = await self.inbox.get()
            try:
                result = await command()
            except BaseException as exc:  # deliver everything, including cancellation
                if not reply.done():
                    reply.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise  # a cancelled actor ends; the machine replaces it
                continue
            if not reply.done():
                reply.set_result(result)


class LockMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.backend: aiolocks.Backend = self.run(aiolocks.connect("memory://hypothesis"))
        self.mutex = self.backend.mutex("sm/mutex")
        self.rw = self.backend.read_write_lock("sm/rw")
        self.sem = self.backend.semaphore("sm/sem", MAX_LEASES)
        self.actors = [Actor(self.loop, i) for i in range(ACTORS)]
        # model
        self.mutex_holder: dict[int, int] = {}  # actor -> reentrancy count
        self.readers: dict[int, int] = {}
        self.writer: dict[int, int] = {}
        self.leases: list[aiolocks.Lease] = []

    def run(self, aw: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(aw)

    def send(self, actor: int, command: Command) -> asyncio.Future[Any]:
        reply: asyncio.Future[Any] = self.loop.create_future()
        self.actors[actor].inbox.put_nowait((command, reply))
        return reply

    def call(self, actor: int, command: Command) -> Any:
        assert not self.busy(actor), f"actor {actor} is busy waiting"
        return self.run(asyncio.wait_for(self.send(actor, command), 5))

    def spin(self, rounds: int = 5) -> None:
        for _ in range(rounds):
            self.run(asyncio.sleep(0))

    def busy(self, actor: int) -> bool:
        waiting = self.actors[actor].waiting
        return waiting is not None and not waiting.done()

    # -- mutex ------------------------------------------------------------

    @precondition(lambda self: True)
    @rule(actor=st.integers(0, ACTORS - 1))
    def mutex_try(self, actor: int) -> None:
        if self.busy(actor):
            return
        got = self.call(actor, lambda: self.mutex.acquire(timeout=0))
        others = [a for a in self.mutex_holder if a != actor]
        assert got == (not others)
        if got:
            self.mutex_holder[actor] = self.mutex_holder.get(actor, 0) + 1

    @rule(actor=st.integers(0, ACTORS - 1))
    def mutex_release(self, actor: int) -> None:
        if self.busy(actor):
            return
        reply = self.send(actor, self.mutex.release)
        if actor in self.mutex_holder:
            self.run(reply)
            self.mutex_holder[actor] -= 1
            if not self.mutex_holder[actor]:
                del self.mutex_holder[actor]
        else:
            try:
                self.run(reply)
            except aiolocks.LockNotOwnedError:
                pass
            else:
                raise AssertionError("release by a non-owner must raise")

    @rule(actor=st.integers(0, ACTORS - 1), cancel=st.booleans())
    def mutex_wait(self, actor: int, cancel: bool) -> None:
        """Start a blocking acquire; cancel it or let it finish later."""
        if self.busy(actor) or actor in self.mutex_holder:
            return
        reply = self.send(actor, self.mutex.acquire)
        self.spin()
        if reply.done():
            assert reply.result() is True
            self.mutex_holder[actor] = 1
            return
        if cancel:
            self.actors[actor].task.cancel()
            self.spin()
            if reply.done() and not reply.cancelled() and reply.exception() is None:
                self.mutex_holder[actor] = 1  # won the race with the cancel
            if self.actors[actor].task.done():
                # The actor task ended: the core releases its task-bound holds
                # (orphans); leases are not task-bound and stay. Replace it.
                for book in (self.mutex_holder, self.readers, self.writer):
                    book.pop(actor, None)
                self.spin()
                self.actors[actor] = Actor(self.loop, actor)
            return
        self.actors[actor].waiting = reply
        reply.add_done_callback(functools.partial(self._waited, actor))

    def _waited(self, actor: int, reply: asyncio.Future[Any]) -> None:
        if not reply.cancelled() and reply.exception() is None and reply.result() is True:
            self.mutex_holder[actor] = 1

    # -- read/write -------------------------------------------------------

    @rule(actor=st.integers(0, ACTORS - 1), write=st.booleans())
    def rw_try(self, actor: int, write: bool) -> None:
        if self.busy(actor):
            return
        half = self.rw.write if write else self.rw.read
        try:
            got = self.call(actor, lambda: half.acquire(timeout=0))
        except aiolocks.DeadlockError:
            assert write and actor in self.readers and actor not in self.writer
            return
        book = self.writer if write else self.readers
        if got:
            book[actor] = book.get(actor, 0) + 1

    @rule(actor=st.integers(0, ACTORS - 1), write=st.booleans())
    def rw_release(self, actor: int, write: bool) -> None:
        if self.busy(actor):
            return
        book = self.writer if write else self.readers
        if actor not in book:
            return
        self.call(actor, (self.rw.write if write else self.rw.read).release)
        book[actor] -= 1
        if not book[actor]:
            del book[actor]

    # -- semaphore --------------------------------------------------------

    @rule(actor=st.integers(0, ACTORS - 1), n=st.integers(1, MAX_LEASES))
    def sem_try(self, actor: int, n: int) -> None:
        if self.busy(actor):
            return
        got = self.call(actor, lambda: self.sem.acquire_many(n, timeout=0))
        free = MAX_LEASES - len(self.leases)
        assert (got is not None) == (n <= free)
        if got:
            self.leases.extend(got)

    @rule(actor=st.integers(0, ACTORS - 1), data=st.data())
    def sem_release(self, actor: int, data: st.DataObject) -> None:
        if not self.leases or self.busy(actor):
            return
        lease = data.draw(st.sampled_from(self.leases))
        self.call(actor, lease.release)  # leases may be released by any task
        self.leases.remove(lease)

    # -- invariants -------------------------------------------------------

    @invariant()
    def exclusive_and_counted(self) -> None:
        if not hasattr(self, "backend"):
            return
        self.spin(2)
        assert len(self.mutex_holder) <= 1
        assert not (self.writer and any(a not in self.writer for a in self.readers))
        assert len(self.writer) <= 1
        assert len(self.leases) <= MAX_LEASES
        holders = [p for p in self.run(self.mutex.participants()) if p.is_holder]
        assert len(holders) == len(self.mutex_holder)
        lease_holders = [p for p in self.run(self.sem.participants()) if p.is_holder]
        assert len(lease_holders) == len(self.leases)
        rw_holders = [p for p in self.run(self.rw.read.participants()) if p.is_holder]
        assert len(rw_holders) == len(self.readers) + len(self.writer)

    def teardown(self) -> None:
        # release everything, stop the waiters, and check nothing is left;
        # each mutex release hands the lock to the next waiter, so repeat
        for _ in range(ACTORS + 1):
            for actor, count in list(self.mutex_holder.items()):
                for _ in range(count):
                    self.call(actor, self.mutex.release)
                del self.mutex_holder[actor]
            self.spin()
        assert not any(self.busy(actor) for actor in range(ACTORS))
        for actor, count in list(self.readers.items()):
            for _ in range(count):
                self.call(actor, self.rw.read.release)
        for actor, count in list(self.writer.items()):
            for _ in range(count):
                self.call(actor, self.rw.write.release)
        for lease in self.leases:
            self.run(lease.release())
        self.spin()
        for each in self.actors:
            each.task.cancel()
        self.spin(10)
        assert all(each.task.done() for each in self.actors)
        self.run(self.backend.close())
        store = _stores[self.loop]["hypothesis"]
        left = {key: q for key, q in store.queues.items() if q.holders or q.waiters}
        assert not left, f"the store still holds {left}"
        self.loop.close()


LockMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLockMachine = LockMachine.TestCase
