"""Make a held lock lost on purpose, to test what your code does then.

A real loss (a ZooKeeper session that expires, a Redis lease that lapses, a
key deleted by an operator) is hard to arrange in a unit test. :func:`lose`
gives the same outcome on every backend, ``memory://`` included: the hold is
given back on the server (another process may take the lock at once), and
this process learns that it was lost exactly as it would from the backend,
so a running ``async with`` body is cancelled and ends in
:class:`aiolocks.LockLostError`, ``is_lost`` turns true, and an explicit
``release()`` raises :class:`aiolocks.LockLostError`.
"""

from __future__ import annotations

from aiolocks._core.errors import LockNotOwnedError
from aiolocks._core.hold import Hold
from aiolocks._core.locks import Lock
from aiolocks._core.multilock import MultiLock
from aiolocks._core.semaphore import Lease

__all__ = ["lose"]

DEFAULT_REASON = "made lost on purpose by aiolocks.testing.lose()"


async def lose(held: Lock | Lease | MultiLock, reason: str = DEFAULT_REASON) -> None:
    """Make the holds of ``held`` lost, as if the backend had lost them.

    ``held`` is a lock (``mutex``, ``semaphore_mutex``, ``rw.read`` or
    ``rw.write``: every hold this process has of that name on that lock's
    backend, whichever task took it), a semaphore :class:`~aiolocks.Lease`,
    or a :class:`~aiolocks.MultiLock` (each held component).

    Each hold is first released on the server, then marked lost with
    ``reason``. Called from inside the ``async with`` body, the body is
    cancelled at its next ``await``; called from another task, the body's
    task is cancelled. Either way the block raises ``LockLostError``.

    >>> async with lock:  # doctest: +SKIP
    ...     await aiolocks.testing.lose(lock)
    ...     await asyncio.sleep(1)  # never returns: the body is cancelled

    :raises LockNotOwnedError: nothing of ``held`` is held in this process.
    :raises TypeError: ``held`` is not a lock, lease or MultiLock.
    """
    holds = list({id(hold): hold for hold in _holds_of(held)}.values())
    if not holds:
        raise LockNotOwnedError(f"lose(): {held!r} is not held in this process; nothing to lose")
    live = [hold for hold in holds if not (hold.lost or hold.released)]
    for hold in live:
        await hold.engine.release_grant(hold.grant)
    # No await from here on: marking a hold lost cancels the bodies running
    # under it, possibly this very task.
    for hold in live:
        hold.grant.mark_lost(reason)


def _holds_of(held: object) -> list[Hold]:
    if isinstance(held, Lease):
        return [held._hold]
    if isinstance(held, MultiLock):
        return [hold for lock in held.locks for hold in _holds_of(lock)]
    if isinstance(held, Lock):
        key = (held._family, held._key, held._mode.value)
        ledger = held.backend._ledgers.get(key)
        return list(ledger.values()) if ledger else []
    raise TypeError(
        "lose() takes a lock (mutex, semaphore_mutex, read or write half), a semaphore "
        f"Lease or a MultiLock, got {type(held).__name__}"
    )
