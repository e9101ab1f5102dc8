"""Count-down latch (Redisson's ``RCountDownLatch``) over the record store.

The count is one persistent record, ``countdown/<name>/count`` (its value
is the count in decimal). ``try_set_count(n)`` creates it only when it is
absent, so a latch is set once per round; ``count_down()`` is a
compare-and-set decrement by version, retried on a conflict, and the
decrement that reaches zero deletes the record: an absent record *is* a
count of zero, and a latch that opened leaves nothing on the server.
``wait()`` reads a snapshot of the prefix and waits for its next change
until the record is gone (no polling where the server has events).

A count-down runs to its end in a task owned by the backend once it has
begun, even if the caller is cancelled meanwhile (the cancellation is
raised afterwards): a decrement is either not sent or counted exactly once,
never "maybe". The record outlives a process that set it and crashed, as
Redisson's does: it is the latch's state, not a hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from .clock import monotonic
from .coordination import finish, store_of
from .records import Records
from .timeouts import check_timeout

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["CountDownLatch"]


@final
class CountDownLatch:
    """A latch that opens when its count, shared by every process, reaches zero.

    >>> latch = backend.count_down_latch("batches/2026-12-03")  # doctest: +SKIP
    >>> await latch.try_set_count(3)  # the coordinator  # doctest: +SKIP
    True
    >>> await latch.count_down()  # each worker, when done  # doctest: +SKIP
    >>> await latch.wait(timeout=60)  # anybody  # doctest: +SKIP
    True

    ``try_set_count(n)`` sets the count only when it is zero (the latch is
    open), so the round's first caller sets it; ``count_down()`` at zero
    does nothing; ``wait()`` returns ``True`` once the count is zero, at
    once if it already is. The count lives on the server until it reaches
    zero, whatever happens to the processes.
    """

    __slots__ = ("_engine", "_key", "_name", "_prefix")

    def __init__(self, engine: Engine, name: str) -> None:
        canonical = engine.validate_name(name)
        store_of(engine, f"count_down_latch({name!r})")
        self._engine = engine
        self._name = name
        self._prefix = f"countdown/{canonical}"
        self._key = f"{self._prefix}/count"

    @property
    def name(self) -> str:
        """The name this latch was created with."""
        return self._name

    def __repr__(self) -> str:
        return f"<CountDownLatch {self._name!r}>"

    async def _store(self) -> Records:
        engine = self._engine
        engine.check_open()
        await engine.open()
        return store_of(engine, "count_down_latch")

    async def try_set_count(self, count: int) -> bool:
        """Set the count to ``count`` if it is zero; ``False`` when a count is already set.

        :raises ValueError: ``count`` is not an int >= 1.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        store = await self._store()
        created, cancelled = await finish(
            self._engine,
            store.create(self._key, str(count).encode()),
            name=f"aiolocks-countdown-set:{self._key}",
        )
        if cancelled is not None:
            # The count was set or not; either way the latch is consistent
            # (a set count is the state the caller asked for).
            raise cancelled
        return created.result() is not None

    async def count_down(self) -> None:
        """Decrease the count by one (nothing when it is zero); at zero every waiter wakes."""
        store = await self._store()
        done, cancelled = await finish(
            self._engine, self._decrement(store), name=f"aiolocks-countdown:{self._key}"
        )
        if cancelled is not None:
            raise cancelled
        done.result()

    async def _decrement(self, store: Records) -> None:
        while True:
            record = await store.read(self._key)
            if record is None:
                return
            count = _count(record.value)
            if count <= 1:
                if await store.delete(self._key, version=record.version):
                    return
            elif (
                await store.update(self._key, str(count - 1).encode(), version=record.version)
                is not None
            ):
                return
            # another process wrote in between: read again

    async def get_count(self) -> int:
        """The count now (0 when the latch is open)."""
        store = await self._store()
        record = await store.read(self._key)
        return 0 if record is None else _count(record.value)

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until the count is zero; ``False`` when ``timeout`` seconds passed first.

        ``timeout=0`` only checks. Cancelling the wait leaves nothing behind
        (it writes nothing).
        """
        seconds = check_timeout(timeout)
        store = await self._store()
        end = None if seconds is None else monotonic() + seconds
        while True:
            with await store.snapshot(self._prefix) as snap:
                record = snap.records.get("count")
                if record is None or _count(record.value) <= 0:
                    return True
                bound = None if end is None else end - monotonic()
                if bound is not None and bound <= 0:
                    return False
                await snap.changed(bound)


def _count(value: bytes) -> int:
    """The count in a record (an unreadable value counts as zero: the latch opens)."""
    try:
        return int(value)
    except ValueError:
        return 0
