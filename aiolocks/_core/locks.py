"""Mutex, SemaphoreMutex and ReadWriteLock, written once over the driver protocol.

Design note
-----------
Curator keeps a ``threadData`` map (thread -> LockData) per lock; aiolocks
keeps a per-backend ledger ``task -> Hold`` per (family, name, mode), so every
lock object of one name on one backend shares it (two Curator objects for one
path in one JVM self-deadlock; ours do not). Re-entry by the owning task
is a local count: no network call. The backend hold ends at the last release.

``SemaphoreMutex`` is not reentrant and not tied to a task: its hold belongs
to the lock object (Curator's lease semantics), and a second ``acquire`` by
the task that took it raises :class:`DeadlockError` at once instead of hanging
(trio's ``Lock`` does the same).

Cancellation: the engine owns every acquire attempt (``Engine.acquire``);
when the caller is cancelled, whatever the attempt may own on the server is
given back before the ``CancelledError`` propagates. Between "granted" and
"recorded in the ledger" there is no await. A release completes even when
the caller is cancelled; the cancellation is re-raised afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, final

from .driver import Family, Grant, Mode, Request
from .errors import DeadlockError, LockLostError, LockNotOwnedError, LockTimeoutError
from .hold import Hold
from .participants import Participant
from .tasks import running_task, task_of_loop
from .timeouts import check_timeout

# bound once: called on every acquire and release
_current_task = running_task
_task_of_loop = task_of_loop
_get_running_loop = asyncio.get_running_loop
_monotonic = time.monotonic

if TYPE_CHECKING:
    from .backend import Backend
    from .engine import Engine

__all__ = [
    "HoldContext",
    "Lock",
    "Mutex",
    "ReadLock",
    "ReadWriteLock",
    "SemaphoreMutex",
    "WriteLock",
]


def current_task(what: str) -> asyncio.Task[object]:
    """The running task, or a clear error outside of one."""
    try:
        task = _current_task()
    except RuntimeError:
        task = None
    if task is None:
        raise RuntimeError(f"{what} must be called from inside an asyncio task")
    return task


def _calling_task(lock: Lock, method: str) -> asyncio.Task[object]:
    """:func:`current_task` for a lock method; the error text is built only when raised."""
    try:
        task = _task_of_loop(_get_running_loop())
    except RuntimeError:
        task = None
    if task is None:
        raise RuntimeError(
            f"{type(lock).__name__}.{method}() must be called from inside an asyncio task"
        )
    return task


class Lock:
    """Behaviour shared by every lock: ``acquire``/``release``/``hold``/``async with``.

    Subclasses decide who owns a hold (:class:`Mutex` and the read/write
    halves: the current task, reentrantly; :class:`SemaphoreMutex`: the lock
    object).
    """

    _family: Family
    _mode: Mode
    _kind: str

    def __init__(
        self, engine: Engine, backend: Backend, name: str, options: Mapping[str, object]
    ) -> None:
        self._name = name
        self._key = engine.validate_name(name)
        self._engine = engine
        self._backend = backend
        self._options = engine.lock_options(self._family, options)
        # The engine's ledger key, built once (an enum's ``.value`` is a
        # Python-level property: not something to read on every call).
        self._ledger_key = (self._family, self._key, self._mode.value)
        # The last hold of this object that ended lost; keeps ``is_lost`` true
        # until the next successful acquire.
        self._ended_lost: Hold | None = None
        # The hold whose loss an ``async with`` of this object already raised
        # (a reentrant block inside the explicit pattern): not raised twice.
        self._loss_reported: Hold | None = None

    @property
    def name(self) -> str:
        """The name this lock was created with."""
        return self._name

    @property
    def backend(self) -> Backend:
        """The backend this lock lives on."""
        return self._backend

    def _sort_key(self) -> tuple[str, str, str, str]:
        return (self._engine.url, self._engine.client_id, self._key, self._mode.value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name!r} on {self._backend.url}>"

    # -- ownership hooks (subclasses) -----------------------------------------

    def _current_hold(self) -> Hold | None:
        raise NotImplementedError

    def _hold_of(self, task: asyncio.Task[object]) -> Hold | None:
        """The hold ``task`` would release: :meth:`_current_hold` with the task known."""
        raise NotImplementedError

    def _reenter(self, task: asyncio.Task[object]) -> bool:
        raise NotImplementedError

    #: holds belong to the acquiring task (released when it ends) or to the lock object
    _task_bound: bool = True

    def _request(self, task: asyncio.Task[object]) -> Request:
        # Positional (name, family, mode, participant, max_leases, count,
        # downgrade_of, owner, options): instantiating a class with keyword
        # arguments builds a dict per call.
        return Request(
            self._key,
            self._family,
            self._mode,
            f"{self._engine.client_id}/{task.get_name()}",  # participant_id()
            1,
            1,
            None,
            task if self._task_bound else None,
            self._options,
        )

    def _record(self, task: asyncio.Task[object], hold: Hold) -> None:
        raise NotImplementedError

    def _take_for_release(self, task: asyncio.Task[object], hold: Hold | None) -> Hold | None:
        """Count one release of ``hold`` (``_hold_of(task)``) down; the hold to end, if any."""
        raise NotImplementedError

    # -- public API -------------------------------------------------------------

    async def acquire(self, timeout: float | None = None) -> bool:
        """Acquire the lock; ``True`` once held, ``False`` when ``timeout`` passed first.

        ``timeout=None`` waits as long as it takes; ``0`` tries once. If the
        calling task is cancelled while waiting, nothing stays held and the
        ``CancelledError`` propagates.

        :raises DeadlockError: the call could only wait for the calling task.
        :raises LockLostError: re-entry into a hold that was already lost.
        :raises BackendUnavailableError: the server cannot be reached.
        """
        deadline = None
        if timeout is not None:
            seconds = check_timeout(timeout)
            if seconds is not None:
                deadline = _monotonic() + seconds
        task = _calling_task(self, "acquire")
        engine = self._engine
        if engine.closed:
            engine.check_open()
        if self._reenter(task):
            self._ended_lost = None
            return True
        request = self._request(task)
        grants = await engine.acquire(request, deadline, task)
        if not grants:
            return False
        # No await between the grant and recording it: a cancellation cannot fall between.
        self._granted(task, request, grants[0])
        return True

    def _granted(self, task: asyncio.Task[object], request: Request, grant: Grant) -> Hold:
        """Record a new hold of ``task`` (synchronous: called right after the grant)."""
        hold = Hold(self._engine, grant, self._kind, request.owner)
        self._record(task, hold)
        self._ended_lost = self._loss_reported = None
        return hold

    async def release(self) -> None:
        """Release one acquisition; the server hold ends at the last one.

        Completes even if the calling task is cancelled meanwhile (the
        cancellation is re-raised afterwards). If the hold was lost while it
        was held, the release still cleans up (the hold is gone either way)
        and then raises :class:`LockLostError`, like Redisson's ``unlock()``:
        the work done under the lock may have overlapped another holder's.
        A loss that an ``async with`` block of this lock object has already
        raised (a reentrant block inside the explicit pattern) is not raised
        a second time.

        :raises LockNotOwnedError: the lock is not held (by the current task,
            for a Mutex or a read/write half).
        :raises LockLostError: the hold was lost while it was held.
        """
        # The body of _release_noting_loss() inlined: one coroutine less.
        task = _calling_task(self, "release")
        hold = self._hold_of(task)
        if hold is not None and hold.grant.valid_until is not None:
            hold.grant.verify()  # a lease that ran out while the loop was busy counts as lost
        ended = self._take_for_release(task, hold)
        if ended is not None:
            try:
                await self._engine.release(ended)
            finally:
                # Also when cancelled meanwhile: is_lost must not forget the loss.
                if ended.grant.lost:
                    self._ended_lost = ended
        lost = hold if hold is not None and hold.grant.lost else None
        if lost is not None and lost is not self._loss_reported:
            self._loss_reported = lost
            raise LockLostError(
                f"{lost.kind} {lost.name!r} was lost while it was held "
                f"({lost.grant.lost_reason}; fencing token {lost.token}); it is released now"
            )

    async def _release_noting_loss(self) -> Hold | None:
        """``release()`` without raising on loss: the hold if it was lost, else ``None``.

        ``async with`` exits through here: it reports a loss in its own words.
        """
        task = _calling_task(self, "release")
        hold = self._hold_of(task)
        if hold is not None:
            hold.grant.verify()  # a lease that ran out while the loop was busy counts as lost
        ended = self._take_for_release(task, hold)
        try:
            if ended is not None:
                await self._engine.release(ended)
        finally:
            # Also when cancelled meanwhile: is_lost must not forget the loss.
            if ended is not None and hold is not None and hold.lost:
                self._ended_lost = hold
        if hold is None or not hold.lost:
            return None
        return hold

    def hold(self, timeout: float | None = None) -> HoldContext:
        """``async with lock.hold(timeout=5):`` acquire or raise :class:`LockTimeoutError`.

        >>> async with lock.hold(timeout=5):  # doctest: +SKIP
        ...     ...
        """
        return HoldContext(self, check_timeout(timeout))

    # ``async with`` awaits what these return: the coroutines of _enter and
    # _exit themselves, without a coroutine of their own around them.

    def __aenter__(self) -> Coroutine[Any, Any, Lock]:
        return _enter(self, None)

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Coroutine[Any, Any, None]:
        return _exit(self, exc)

    @property
    def fencing_token(self) -> int | None:
        """Fencing token of the current hold; ``None`` when not held (by this task, for a Mutex).

        Tokens strictly increase across successive holds of one name. Pass it
        to the resource you protect, which rejects writes with a smaller
        token than it has seen: that stops a holder that lost its lock while
        paused.
        """
        hold = self._current_hold()
        return None if hold is None else hold.token

    @property
    def is_lost(self) -> bool:
        """The current hold was lost (session expired, lease not renewed, key taken).

        Stays true after a lost hold has been released (by ``release()`` or at
        the end of ``async with``), until the next successful acquire of this
        lock object.
        """
        hold = self._current_hold()
        if hold is not None:
            return not hold.grant.verify()
        return self._ended_lost is not None

    @property
    def is_degraded(self) -> bool:
        """The current hold is process-local: the server was unreachable when it was taken.

        Only with ``connect(url, on_unavailable="local")``. Such a hold
        excludes only the tasks of this process, its fencing token comes from
        the local store (not comparable with the server's), and it stays local
        until released, even when the server answers again meanwhile.
        ``False`` when not held (by this task, for a Mutex).
        """
        hold = self._current_hold()
        return hold is not None and hold.degraded

    def is_owned_by_current_task(self) -> bool:
        """The current asyncio task holds this lock (Curator's isOwnedByCurrentThread)."""
        raise NotImplementedError

    def is_acquired_in_this_process(self) -> bool:
        """Some task of this process (on this backend) holds this lock."""
        return self._engine.is_held_here(self._family, self._key, self._mode.value)

    async def participants(self) -> list[Participant]:
        """Holders first, then waiters in queue order where the backend queues."""
        return await self._engine.participants(self._family, self._key)


@final
class HoldContext:
    """``async with lock.hold(timeout)``: acquire, run the body, release.

    The body is cancelled if the hold is lost, and the block then raises
    :class:`LockLostError`. ``as`` binds the lock itself.
    """

    __slots__ = ("_lock", "_timeout")

    def __init__(self, lock: Lock, timeout: float | None) -> None:
        self._lock = lock
        self._timeout = timeout

    def __aenter__(self) -> Coroutine[Any, Any, Lock]:
        return _enter(self._lock, self._timeout)

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Coroutine[Any, Any, None]:
        return _exit(self._lock, exc)


async def _enter(lock: Lock, timeout: float | None) -> Lock:
    """``async with lock`` / ``lock.hold(timeout)``: acquire, then register the body."""
    task = _calling_task(lock, "acquire")
    deadline = None if timeout is None else _monotonic() + timeout
    engine = lock._engine
    if engine.closed:
        engine.check_open()
    hold: Hold | None
    if lock._reenter(task):
        lock._ended_lost = None
        hold = lock._hold_of(task)
    else:
        request = lock._request(task)
        grants = await engine.acquire(request, deadline, task)
        # No await between the grant and recording it.
        hold = lock._granted(task, request, grants[0]) if grants else None
    if hold is None:
        raise LockTimeoutError(f"{lock._kind} {lock.name!r} was not acquired within {timeout} s")
    if hold.grant.verify():
        # the common case of enter_hold_body(), without its second task lookup
        hold.enter_body(task)
        return lock
    try:
        await enter_hold_body(hold, lock._release_noting_loss)
    except LockLostError:
        lock._loss_reported = hold
        raise
    return lock


async def _exit(lock: Lock, exc: BaseException | None) -> None:
    """The ``__aexit__`` of ``async with lock`` / ``lock.hold(timeout)``.

    :func:`exit_hold_body` with the lock's release inlined: one task lookup
    and no coroutine between this one and the engine's release.
    """
    task = current_task("async with")
    hold = lock._hold_of(task)
    outcome = "held"
    try:
        if hold is not None and not hold.leave_body(task):  # a loss to settle (rare)
            outcome = await hold.exit_body(task, exc)
    finally:
        # Release even if settling the loss raised: the hold must not outlive the block.
        # (What _release_noting_loss() does.)
        if hold is not None and hold.grant.valid_until is not None:
            hold.grant.verify()
        ended = lock._take_for_release(task, hold)
        if ended is not None:
            try:
                await lock._engine.release(ended)
            finally:
                if ended.grant.lost:
                    lock._ended_lost = ended
    try:
        _raise_outcome(hold, exc, outcome)
    except LockLostError:
        lock._loss_reported = hold
        raise


async def enter_hold_body(hold: Hold | None, release: Callable[[], Awaitable[object]]) -> None:
    """Register an ``async with`` body, unless its hold is already lost.

    A grant can expire between the server's answer and the body's start
    (the event loop was blocked past the lease or session timeout): then
    give it back and raise, rather than run the body unprotected.
    """
    if hold is None:
        return
    if not hold.grant.verify():
        await release()
        raise LockLostError(
            f"{hold.kind} {hold.name!r} was lost before the block could start "
            f"({hold.grant.lost_reason})"
        )
    hold.enter_body(current_task("async with"))


async def exit_hold_body(
    hold: Hold | None,
    exc: BaseException | None,
    release: Callable[[], Awaitable[object]],
) -> None:
    """Shared ``__aexit__``: settle loss, release, and turn a loss into LockLostError."""
    task = current_task("async with")
    outcome = "held"
    try:
        if hold is not None and not hold.leave_body(task):  # a loss to settle (rare)
            outcome = await hold.exit_body(task, exc)
    finally:
        # Release even if settling the loss raised: the hold must not outlive the block.
        await release()
    _raise_outcome(hold, exc, outcome)


def _raise_outcome(hold: Hold | None, exc: BaseException | None, outcome: str) -> None:
    """The end of an ``async with`` exit, after the release: raise what the outcome says."""
    if outcome == "held" and hold is not None and hold.grant.lost:
        # The server had nothing left to release: the hold was lost while the
        # block ran (a failover, a key deleted behind our back) and nobody
        # could tell us sooner.
        outcome = "lost"
    if outcome == "cancelled":
        if isinstance(exc, asyncio.CancelledError):
            return
        raise asyncio.CancelledError
    if outcome == "lost":
        assert hold is not None
        raise LockLostError(
            f"{hold.kind} {hold.name!r} was lost while the block ran "
            f"({hold.grant.lost_reason}; fencing token {hold.token})"
        ) from exc


class _TaskOwnedLock(Lock):
    """Reentrant per task: Mutex and the read/write halves."""

    def _current_hold(self) -> Hold | None:
        try:
            task = _current_task()
        except RuntimeError:
            return None
        if task is None:
            return None
        ledger = self._engine.ledgers.get(self._ledger_key)
        return None if ledger is None else ledger.get(task)

    def _hold_of(self, task: asyncio.Task[object]) -> Hold | None:
        ledger = self._engine.ledgers.get(self._ledger_key)
        return None if ledger is None else ledger.get(task)

    def _reenter(self, task: asyncio.Task[object]) -> bool:
        ledger = self._engine.ledgers.get(self._ledger_key)
        if ledger is None:
            return False
        hold = ledger.get(task)
        if hold is None:
            return False
        if hold.lost:
            raise LockLostError(
                f"{self._kind} {self._name!r} is held by the current task but its hold was lost "
                f"({hold.grant.lost_reason}); release it before acquiring again"
            )
        hold.count += 1
        return True

    def _record(self, task: asyncio.Task[object], hold: Hold) -> None:
        ledgers = self._engine.ledgers
        key = self._ledger_key
        ledger = ledgers.get(key)
        if ledger is None:
            ledger = ledgers[key] = {}
        ledger[task] = hold
        hold.ledger_key = key
        # A bound method, not a closure: nothing to build per hold but the method object.
        hold.on_owner_done = hold.owner_ended
        task.add_done_callback(hold.on_owner_done)

    def _granted(self, task: asyncio.Task[object], request: Request, grant: Grant) -> Hold:
        hold = Hold(self._engine, grant, self._kind, task)
        self._record(task, hold)
        self._ended_lost = self._loss_reported = None
        return hold

    def _take_for_release(self, task: asyncio.Task[object], hold: Hold | None) -> Hold | None:
        if hold is None:
            raise LockNotOwnedError(f"{self._kind} {self._name!r} is not held by the current task")
        hold.count -= 1
        if hold.count > 0:
            return None
        ledgers = self._engine.ledgers
        ledger = ledgers[self._ledger_key]
        del ledger[task]
        if not ledger:
            del ledgers[self._ledger_key]  # keep the dict of ledgers small
        if hold.on_owner_done is not None:
            task.remove_done_callback(hold.on_owner_done)
            hold.on_owner_done = None
        return hold

    def is_owned_by_current_task(self) -> bool:
        """The current asyncio task holds this lock (Curator's isOwnedByCurrentThread)."""
        return self._current_hold() is not None


@final
class Mutex(_TaskOwnedLock):
    """A distributed mutex, reentrant per asyncio task (InterProcessMutex / RLock).

    >>> lock = backend.mutex("locks/pay/order-1001")  # doctest: +SKIP
    >>> async with lock.hold(timeout=5):  # doctest: +SKIP
    ...     ...

    Guarantees: one holder at a time per name across every process using
    the backend; re-entry by the holding task costs no network call and must
    be matched by as many releases; fair (FIFO) where the backend queues;
    fencing tokens strictly increase. If the hold is lost (session expiry,
    lease not renewed), the ``async with`` body is cancelled and
    :class:`LockLostError` is raised. A task that ends while holding has its
    hold released (with a warning).

    :raises LockNotOwnedError: ``release()`` by a task that does not hold it.
    """

    _family = Family.MUTEX
    _mode = Mode.EXCLUSIVE
    _kind = "mutex"


@final
class SemaphoreMutex(Lock):
    """A non-reentrant mutex whose hold belongs to the lock object (InterProcessSemaphoreMutex).

    >>> lock = backend.semaphore_mutex("jobs/nightly")  # doctest: +SKIP
    >>> async with lock:  # doctest: +SKIP
    ...     ...

    Any task may release it (lease semantics) and it is not released when
    the acquiring task ends. A second ``acquire`` by the task that holds it
    raises :class:`DeadlockError` at once, even with ``timeout=0``.

    :raises DeadlockError: acquire by the task that already holds it.
    :raises LockNotOwnedError: ``release()`` while this object holds nothing.
    """

    _family = Family.SEMAPHORE_MUTEX
    _mode = Mode.EXCLUSIVE
    _kind = "semaphore mutex"
    _task_bound = False

    def __init__(
        self, engine: Engine, backend: Backend, name: str, options: Mapping[str, object]
    ) -> None:
        super().__init__(engine, backend, name, options)
        self._hold: Hold | None = None
        self._holder_task: asyncio.Task[object] | None = None

    def _current_hold(self) -> Hold | None:
        return self._hold

    def _hold_of(self, task: asyncio.Task[object]) -> Hold | None:
        return self._hold

    def _reenter(self, task: asyncio.Task[object]) -> bool:
        ledger = self._engine.ledgers.get(self._ledger_key)
        if ledger is not None and task in ledger:
            raise DeadlockError(
                f"semaphore mutex {self._name!r} is already held by the current task and is "
                "not reentrant; use backend.mutex() for a reentrant lock"
            )
        return False

    def _record(self, task: asyncio.Task[object], hold: Hold) -> None:
        self._hold = hold
        self._holder_task = task
        self._engine.ledger(self._family, self._key, self._mode.value)[task] = hold

    def _take_for_release(self, task: asyncio.Task[object], hold: Hold | None) -> Hold | None:
        if hold is None:
            raise LockNotOwnedError(f"semaphore mutex {self._name!r} is not held by this object")
        self._hold = None
        holder, self._holder_task = self._holder_task, None
        ledger = self._engine.ledger(self._family, self._key, self._mode.value)
        if holder is not None and ledger.get(holder) is hold:
            del ledger[holder]
        self._engine.drop_ledger_if_empty(self._family, self._key, self._mode.value)
        return hold

    def is_owned_by_current_task(self) -> bool:
        """The current task took the hold this object has."""
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return False
        return self._hold is not None and self._holder_task is task


@final
class ReadLock(_TaskOwnedLock):
    """The read half of a :class:`ReadWriteLock`: shared, reentrant per task.

    A task holding the write half may take the read half (downgrade); it is
    granted without letting a queued writer in between.
    """

    _family = Family.READ_WRITE
    _mode = Mode.READ
    _kind = "read lock"

    def _request(self, task: asyncio.Task[object]) -> Request:
        request = super()._request(task)
        writers = self._engine.ledgers.get((self._family, self._key, "write"))
        write = None if writers is None else writers.get(task)
        if write is None or write.lost:
            return request
        return dataclasses.replace(request, downgrade_of=write.grant)


@final
class WriteLock(_TaskOwnedLock):
    """The write half of a :class:`ReadWriteLock`: exclusive, reentrant per task.

    :raises DeadlockError: the current task holds the read half (no upgrade;
        it would wait for itself forever).
    """

    _family = Family.READ_WRITE
    _mode = Mode.WRITE
    _kind = "write lock"

    def _reenter(self, task: asyncio.Task[object]) -> bool:
        if super()._reenter(task):
            return True
        readers = self._engine.ledgers.get((self._family, self._key, "read"))
        if readers is not None and task in readers:
            raise DeadlockError(
                f"read/write lock {self._name!r}: the current task holds the read lock and "
                "cannot upgrade to the write lock (release the read lock first)"
            )
        return False


@final
class ReadWriteLock:
    """A read/write lock (InterProcessReadWriteLock / RReadWriteLock).

    >>> rw = backend.read_write_lock("config/pricing")  # doctest: +SKIP
    >>> async with rw.read:  # doctest: +SKIP
    ...     ...
    >>> async with rw.write:  # doctest: +SKIP
    ...     ...

    Readers share; a writer excludes readers and writers. Where the backend
    is fair, readers wait only behind earlier writers and writers are not
    starved. A writer may take the read half (downgrade); a reader taking
    the write half gets :class:`DeadlockError`. Read and write holds share
    one fencing sequence.
    """

    __slots__ = ("_name", "read", "write")

    def __init__(
        self, engine: Engine, backend: Backend, name: str, options: Mapping[str, object]
    ) -> None:
        self._name = name
        self.read = ReadLock(engine, backend, name, options)
        """The shared half."""
        self.write = WriteLock(engine, backend, name, options)
        """The exclusive half."""

    @property
    def name(self) -> str:
        """The name this lock was created with."""
        return self._name

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self._name!r} on {self.read.backend.url}>"
