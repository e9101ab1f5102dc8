"""A barrier across processes (``asyncio.Barrier``'s ``wait``, Curator's DistributedBarrier).

The design
----------
Two kinds of record under the prefix ``barrier/<name>``:

* ``state``, persistent: the current *generation* (a random id), how many
  parties have arrived in it, ``parties`` and whether it is broken;
* ``<generation>.<party>``, one ephemeral record per waiting party, written
  with :meth:`Records.join`, so it goes when the party's session ends.

A party first joins its arrival record, then counts itself in with a
compare-and-set of ``state`` (its index is the count before its own). The
party that makes the count reach ``parties`` *trips* the barrier by deleting
``state``: every waiter of that generation sees ``state`` gone (or holding
another generation) and returns its index. Because a party joins before it
counts, a generation with fewer arrival records than its count has lost a
counted party (its session ended, it timed out or was cancelled): the
waiters then mark the generation broken (compare-and-set on that very
generation, so a barrier that tripped meanwhile is never broken after the
fact) and raise :class:`BrokenBarrierError`.

As ``threading.Barrier``: a ``wait`` that times out breaks the barrier and
raises :class:`BrokenBarrierError`, so do the other waiters. A ``wait``
cancelled after its party counted breaks it too (the others could never be
released otherwise); cancelled before, it leaves as if it had not come. A
broken generation heals by itself once every party of it has left (the last
one out, or the next arrival, deletes ``state``), so the next round starts
clean; an arrival while some party of the broken generation is still there
raises at once. A barrier that tripped or healed leaves nothing on the
server; each party deletes its own arrival record on its way out (tasks
owned by the backend, waited for even when the caller is cancelled).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, final

from .clock import monotonic
from .coordination import dumps, finish, loads, store_of
from .errors import AccessDeniedError, BackendUnavailableError, BrokenBarrierError
from .records import Entry, Records, Snapshot
from .timeouts import check_timeout

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Barrier"]

logger = logging.getLogger("aiolocks")

_STATE = "state"


@final
class Barrier:
    """A barrier of ``parties`` parties, in any processes: ``wait()`` returns when all arrived.

    >>> barrier = backend.barrier("batches/2026-12-03/start", parties=3)  # doctest: +SKIP
    >>> index = await barrier.wait(timeout=30)  # doctest: +SKIP

    Each of the ``parties`` callers of ``wait()`` of one generation gets a
    distinct index ``0 .. parties - 1`` (the order of arrival), as with
    :class:`asyncio.Barrier`; the barrier is then ready for the next
    generation. A party whose session ends (process killed, backend closed,
    session expired) breaks the barrier; so does a ``wait`` that times out,
    as with :class:`threading.Barrier`, or that is cancelled after it
    arrived. Every waiter of a broken generation gets
    :class:`BrokenBarrierError`; once they all left, the barrier is usable
    again. See the module docstring for the design.

    :raises BrokenBarrierError: the barrier broke (or was broken when the
        wait began and some of its parties are still there).
    :raises ValueError: ``parties`` differs from the one the current
        generation was started with.
    """

    __slots__ = ("_engine", "_key", "_name", "_parties", "_prefix")

    def __init__(self, engine: Engine, name: str, parties: int) -> None:
        canonical = engine.validate_name(name)
        if isinstance(parties, bool) or not isinstance(parties, int) or parties < 1:
            raise ValueError(f"barrier {name!r}: parties must be an int >= 1, got {parties!r}")
        store_of(engine, f"barrier({name!r})")
        self._engine = engine
        self._name = name
        self._parties = parties
        self._prefix = f"barrier/{canonical}"
        self._key = f"{self._prefix}/{_STATE}"

    @property
    def name(self) -> str:
        """The name this barrier was created with."""
        return self._name

    @property
    def parties(self) -> int:
        """How many parties must arrive to release them all."""
        return self._parties

    def __repr__(self) -> str:
        return f"<Barrier {self._name!r} parties={self._parties}>"

    async def wait(self, timeout: float | None = None) -> int:
        """Arrive and wait for the other parties; this party's index of arrival.

        ``timeout`` (seconds, ``None``: no limit): when it passes first, the
        barrier is broken and :class:`BrokenBarrierError` raised.
        """
        seconds = check_timeout(timeout)
        engine = self._engine
        engine.check_open()
        await engine.open()
        store = store_of(engine, "barrier")
        end = None if seconds is None else monotonic() + seconds
        party = uuid.uuid4().hex[:12]
        while True:
            generation = await self._current(store)
            entry = await self._arrive(store, generation, party)
            try:
                index = await self._wait_in(store, generation, entry, end)
            finally:
                await self._leave(store, generation, entry)
            if index is not None:
                return index

    async def _wait_in(
        self, store: Records, generation: str, entry: Entry, end: float | None
    ) -> int | None:
        """Count in and wait; the index, ``None`` when the generation ended before we counted."""
        counting, cancelled = await finish(
            self._engine, self._count_in(store, generation), name=f"aiolocks-barrier:{self._key}"
        )
        if cancelled is not None:
            if not counting.cancelled() and counting.exception() is None:
                index = counting.result()
                if index is not None and index + 1 < self._parties:
                    await self._break_quietly(store, generation)
            raise cancelled
        index = counting.result()
        if index is None or index + 1 == self._parties:
            return index  # not counted (start again), or we tripped it
        try:
            outcome = await self._released(store, generation, entry, end)
        except BaseException:
            # cancelled (or failed) after counting: the others could never be released
            await self._break_quietly(store, generation)
            raise
        if outcome == "released":
            return index
        if outcome != "broken" and not await self._break_quietly(store, generation):
            return index  # it tripped while we were about to break it
        reasons = {
            "broken": "another party broke it",
            "timeout": "the wait timed out",
            "left": "a party left (its session ended, or its wait timed out or was cancelled)",
            "lost": "this party's session ended",
        }
        raise BrokenBarrierError(f"barrier {self._name!r} is broken: {reasons[outcome]}")

    async def _current(self, store: Records) -> str:
        """The generation to arrive in: the live one, a new one, or a healed broken one."""
        while True:
            with await store.snapshot(self._prefix) as snap:
                record = snap.records.get(_STATE)
                if record is None:
                    generation = uuid.uuid4().hex[:12]
                    state = {"gen": generation, "arrived": 0, "parties": self._parties}
                    if await self._create_state(store, dumps(state)):
                        return generation
                    continue
                state = loads(record.value)
                self._check_parties(state)
                generation = str(state.get("gen"))
                if not state.get("broken"):
                    return generation
                if _arrivals(snap, generation):
                    raise BrokenBarrierError(
                        f"barrier {self._name!r} is broken and parties of its generation "
                        "are still there"
                    )
            # broken and empty: heal it, then start a new generation
            await store.delete(self._key, version=record.version)

    async def _create_state(self, store: Records, value: bytes) -> bool:
        """Create ``state``; a create cancelled in flight is undone, then cancellation goes on."""
        created, cancelled = await finish(
            self._engine, store.create(self._key, value), name=f"aiolocks-barrier:{self._key}"
        )
        if cancelled is not None:
            if not created.cancelled() and created.exception() is None:
                version = created.result()
                if version is not None:
                    await finish(
                        self._engine,
                        store.delete(self._key, version=version),
                        name=f"aiolocks-barrier-undo:{self._key}",
                    )
            raise cancelled
        return created.result() is not None

    def _check_parties(self, state: dict[str, Any]) -> None:
        if state.get("parties", self._parties) != self._parties:
            raise ValueError(
                f"barrier {self._name!r} was started with parties={state.get('parties')}, "
                f"this one has parties={self._parties}"
            )

    async def _arrive(self, store: Records, generation: str, party: str) -> Entry:
        """Join this party's arrival record (undone if the caller is cancelled meanwhile)."""
        value = dumps({"holder": self._engine.client_id})
        joined, cancelled = await finish(
            self._engine,
            store.join(f"{self._prefix}/{generation}.{party}", value),
            name=f"aiolocks-barrier-arrive:{self._key}",
        )
        if cancelled is not None:
            if not joined.cancelled() and joined.exception() is None:
                entry = joined.result()
                if entry is not None:
                    await self._leave(store, generation, entry)
            raise cancelled
        entry = joined.result()
        if entry is None:  # a random party id that exists: impossible unless forged
            raise RuntimeError(f"barrier {self._name!r}: arrival record {party!r} already exists")
        return entry

    async def _count_in(self, store: Records, generation: str) -> int | None:
        """Count this party in: its index, or ``None`` when the generation ended first."""
        while True:
            record = await store.read(self._key)
            if record is None:
                return None
            state = loads(record.value)
            if state.get("gen") != generation:
                return None
            if state.get("broken"):
                raise BrokenBarrierError(f"barrier {self._name!r} broke as this party arrived")
            index = int(state.get("arrived", 0))
            if index + 1 >= self._parties:
                # the last party trips the barrier: the generation's state goes
                if await store.delete(self._key, version=record.version):
                    return index
            elif (
                await store.update(
                    self._key, dumps({**state, "arrived": index + 1}), version=record.version
                )
                is not None
            ):
                return index

    async def _released(
        self, store: Records, generation: str, entry: Entry, end: float | None
    ) -> str:
        """Wait for the end of the generation: released, broken, left, lost or timeout."""
        mine = entry.key.rpartition("/")[2]
        while True:
            with await store.snapshot(self._prefix) as snap:
                record = snap.records.get(_STATE)
                if entry.lost or mine not in snap.records:
                    return "lost"
                state = None if record is None else loads(record.value)
                if state is None or state.get("gen") != generation:
                    return "released"
                if state.get("broken"):
                    return "broken"
                if _arrivals(snap, generation) < int(state.get("arrived", 0)):
                    return "left"
                bound = None if end is None else end - monotonic()
                if bound is not None and bound <= 0:
                    return "timeout"
                await snap.changed(bound)

    async def _break(self, store: Records, generation: str) -> bool:
        """Mark ``generation`` broken; ``False`` when it already tripped (released)."""
        while True:
            record = await store.read(self._key)
            if record is None:
                return False
            state = loads(record.value)
            if state.get("gen") != generation:
                return False
            if state.get("broken"):
                return True
            broken = dumps({**state, "broken": True})
            if await store.update(self._key, broken, version=record.version) is not None:
                return True

    async def _break_quietly(self, store: Records, generation: str) -> bool:
        """:meth:`_break` to its end whatever happens to the caller; an unreachable server
        counts as broken (the other parties see this one's record go with its session)."""
        attempt, cancelled = await finish(
            self._engine,
            self._break(store, generation),
            name=f"aiolocks-barrier-break:{self._key}",
        )
        error = None if attempt.cancelled() else attempt.exception()
        if isinstance(error, BackendUnavailableError | AccessDeniedError):
            logger.warning("barrier %r: could not mark it broken: %s", self._name, error)
        if cancelled is not None:
            raise cancelled
        if error is not None and not isinstance(error, BackendUnavailableError | AccessDeniedError):
            raise error
        return attempt.cancelled() or error is not None or attempt.result()

    async def _leave(self, store: Records, generation: str, entry: Entry) -> None:
        """Delete this party's arrival record; the last one out of a broken generation heals it."""
        left, cancelled = await finish(
            self._engine,
            self._leave_now(store, generation, entry),
            name=f"aiolocks-barrier-leave:{self._key}",
        )
        if not left.cancelled() and left.exception() is not None:
            logger.warning("barrier %r: leaving failed: %s", self._name, left.exception())
        if cancelled is not None:
            raise cancelled

    async def _leave_now(self, store: Records, generation: str, entry: Entry) -> None:
        if not entry.lost:
            await store.delete(entry.key, version=entry.version)
        with await store.snapshot(self._prefix) as snap:
            record = snap.records.get(_STATE)
            if record is None or _arrivals(snap, generation):
                return
            state = loads(record.value)
            if state.get("gen") != generation or not state.get("broken"):
                return
        await store.delete(self._key, version=record.version)


def _arrivals(snap: Snapshot, generation: str) -> int:
    """How many arrival records of ``generation`` the snapshot holds."""
    start = generation + "."
    return sum(1 for child in snap.records if child.startswith(start))
