"""MultiLock: all or nothing over several locks (InterProcessMultiLock / RedissonMultiLock).

The components are taken one after the other in the calling task, in a
canonical order (backend, then name, then mode), so two MultiLocks over the
same locks listed in opposite orders cannot deadlock each other. One
deadline covers the whole acquisition (not one timeout per lock, which
could add up to n times the timeout). On timeout, error or cancellation,
whatever was taken is released before the call returns or raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from types import TracebackType
from typing import final

from .errors import LockLostError, LockTimeoutError
from .locks import Lock, current_task
from .timeouts import check_timeout, deadline_from

__all__ = ["MultiLock", "MultiLockHoldContext"]


@final
class MultiLock:
    """Hold several locks at once, or none of them.

    >>> a, b = backend.mutex("accounts/a"), backend.mutex("accounts/b")  # doctest: +SKIP
    >>> both = aiolocks.MultiLock([a, b])  # doctest: +SKIP
    >>> async with both.hold(timeout=5):  # doctest: +SKIP
    ...     ...

    Components may live on different backends. Reentrancy is that of the
    components. ``release()`` releases every component even if one fails,
    then raises the first failure (:class:`LockLostError` for a component
    lost while held). If a component's hold is lost, the ``async with`` body
    is cancelled and raises :class:`LockLostError`.

    :raises ValueError: an empty list, or the same lock object twice.
    """

    __slots__ = ("_locks",)

    def __init__(self, locks: Iterable[Lock]) -> None:
        given = list(locks)
        if not given:
            raise ValueError("MultiLock needs at least one lock")
        for lock in given:
            if not isinstance(lock, Lock):
                raise TypeError(
                    f"MultiLock takes aiolocks locks (mutex, semaphore_mutex, read/write halves), "
                    f"got {type(lock).__name__}"
                )
        if len({id(lock) for lock in given}) != len(given):
            raise ValueError("MultiLock got the same lock object twice")
        self._locks = sorted(given, key=lambda lock: lock._sort_key())

    @property
    def locks(self) -> list[Lock]:
        """The components, in the order they are acquired."""
        return list(self._locks)

    def __repr__(self) -> str:
        return f"<MultiLock {[lock.name for lock in self._locks]!r}>"

    async def acquire(self, timeout: float | None = None) -> bool:
        """Acquire every component; ``False`` (holding none) when ``timeout`` passed first."""
        seconds = check_timeout(timeout)
        deadline = deadline_from(seconds)
        taken: list[Lock] = []
        try:
            for lock in self._locks:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not await lock.acquire(remaining):
                    await _release_all(taken)
                    return False
                taken.append(lock)
        except BaseException:
            # Cancellation or error midway: give back what we took; the
            # release completes even if we are cancelled again meanwhile.
            await _release_all(taken, quiet=True)
            raise
        return True

    async def release(self) -> None:
        """Release every component (even if one fails), then raise the first failure."""
        await _release_all(self._locks)

    def hold(self, timeout: float | None = None) -> MultiLockHoldContext:
        """``async with multi.hold(timeout=5):`` or :class:`LockTimeoutError`."""
        return MultiLockHoldContext(self, check_timeout(timeout))

    async def __aenter__(self) -> MultiLock:
        await MultiLockHoldContext(self, None).__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await MultiLockHoldContext(self, None).__aexit__(exc_type, exc, tb)

    @property
    def is_lost(self) -> bool:
        """A component's current hold was lost."""
        return any(lock.is_lost for lock in self._locks)

    @property
    def is_degraded(self) -> bool:
        """A component's current hold is process-local (``on_unavailable="local"``)."""
        return any(lock.is_degraded for lock in self._locks)

    def is_owned_by_current_task(self) -> bool:
        """The current task holds every component."""
        return all(lock.is_owned_by_current_task() for lock in self._locks)


@final
class MultiLockHoldContext:
    """``async with multi.hold(timeout)``: every component held for the body."""

    __slots__ = ("_multi", "_timeout")

    def __init__(self, multi: MultiLock, timeout: float | None) -> None:
        self._multi = multi
        self._timeout = timeout

    async def __aenter__(self) -> MultiLock:
        multi = self._multi
        if not await multi.acquire(self._timeout):
            names = ", ".join(repr(lock.name) for lock in multi._locks)
            raise LockTimeoutError(f"MultiLock [{names}] was not acquired within {self._timeout} s")
        task = current_task("async with")
        holds = [hold for lock in multi._locks if (hold := lock._current_hold()) is not None]
        lost = [hold for hold in holds if not hold.grant.verify()]
        if lost:
            # A component expired before the block could start: give all back.
            await _release_all(multi._locks, loss_is_error=False)
            raise LockLostError(
                f"MultiLock component {lost[0].name!r} was lost before the block could start "
                f"({lost[0].grant.lost_reason})"
            )
        for hold in holds:
            hold.enter_body(task)
        return multi

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = current_task("async with")
        outcomes: list[str] = []
        holds = [(lock, lock._current_hold()) for lock in self._multi._locks]
        # task.cancelling() when the block started. Components lost together
        # (one session expiry) each cancelled the task once; only once all
        # of them have withdrawn their request does cancelling() say whether
        # somebody else cancelled the task too.
        entered_at = [
            stack[-1]
            for _, hold in holds
            if hold is not None and (stack := hold._bodies.get(task))
        ]
        try:
            for _, hold in holds:
                if hold is not None:
                    outcomes.append(await hold.exit_body(task, exc))
        finally:
            await _release_all(self._multi._locks, loss_is_error=False)
        # Lost while the block ran, including holds found gone at release.
        lost_names = [
            f"{lock.name!r} ({hold.grant.lost_reason})"
            for lock, hold in holds
            if hold is not None and hold.lost
        ]
        if "cancelled" in outcomes and entered_at and task.cancelling() <= min(entered_at):
            outcomes = ["lost"]  # every cancellation was one of ours
        if "cancelled" in outcomes:
            if isinstance(exc, asyncio.CancelledError):
                return
            raise asyncio.CancelledError
        if lost_names:
            raise LockLostError(
                f"MultiLock lost {', '.join(lost_names)} while the block ran"
            ) from exc


async def _release_all(
    locks: Iterable[Lock], *, quiet: bool = False, loss_is_error: bool = True
) -> None:
    """Release each lock in reverse order; every one is attempted; first error raised.

    Runs in the calling task (a Mutex belongs to it). Each ``release()``
    finishes its server work even when cancelled and then re-raises, so a
    cancellation here is noted and the loop goes on with the next lock.
    ``loss_is_error=False``: a component lost while held is not an error
    (``async with`` reports the loss itself).
    """
    first: Exception | None = None
    cancelled: asyncio.CancelledError | None = None
    for lock in reversed(list(locks)):
        try:
            if loss_is_error:
                await lock.release()
            else:
                await lock._release_noting_loss()
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
        except Exception as exc:
            first = first or exc
    if cancelled is not None:
        raise cancelled
    if first is not None and not quiet:
        raise first
