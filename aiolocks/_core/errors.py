"""The aiolocks exception tree.

::

    LockError (Exception)
     +-- LockNotOwnedError (also RuntimeError)   release by a task that does not hold it
     +-- LockLostError                           the hold was lost (session expired,
                                                 lease lapsed, key taken)
     +-- LockTimeoutError (also TimeoutError)    hold()/lease() did not acquire in time
     +-- DeadlockError (also RuntimeError)       the call could only ever wait for itself
     +-- InvalidLockNameError (also ValueError)  a name that no backend accepts
     +-- BackendUnavailableError (also ConnectionError)
                                                 the server cannot be reached in time
     +-- AccessDeniedError (also PermissionError)
                                                 the server refused the credentials, a
                                                 permission or the TLS handshake
     +-- BrokenBarrierError (also asyncio.BrokenBarrierError)
                                                 a party of a barrier left, its session
                                                 ended or its wait timed out

Driver errors (``aiozk.exc.*``, ``redis.exceptions.*``) are mapped to these in
one place per driver, always with ``raise ... from exc``. Cancellation is never
wrapped or swallowed.
"""

from __future__ import annotations

import asyncio

__all__ = [
    "AccessDeniedError",
    "BackendUnavailableError",
    "BrokenBarrierError",
    "DeadlockError",
    "InvalidLockNameError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
]


class LockError(Exception):
    """Base class of every aiolocks error."""


class LockNotOwnedError(LockError, RuntimeError):
    """``release()`` was called by a task that does not hold the lock.

    Curator's ``IllegalMonitorStateException``, Redisson's
    ``IllegalMonitorStateException`` on unlock by a non-owner.
    """


class LockLostError(LockError):
    """A hold was lost while it was in use.

    Raised out of ``async with lock:`` when the ZooKeeper session expired, the
    Redis lease was not renewed in time, the key was deleted or taken behind
    the library's back, or the backend was closed. The body of the ``async
    with`` block was cancelled when the loss was detected.
    """


class LockTimeoutError(LockError, TimeoutError):
    """The lock was not acquired within the timeout given to ``hold()``/``lease()``."""


class DeadlockError(LockError, RuntimeError):
    """The call could only wait for the calling task itself.

    Raised at once, instead of hanging: a second ``acquire`` of a
    ``SemaphoreMutex`` by the task that holds it, or ``.write`` taken by a task
    that holds ``.read`` of the same read/write lock.
    """


class InvalidLockNameError(LockError, ValueError):
    """A lock name that is empty, malformed, too long or contains control characters."""


class BackendUnavailableError(LockError, ConnectionError):
    """The lock server cannot be reached within the connect timeout or retry policy."""


class AccessDeniedError(LockError, PermissionError):
    """The server refused the credentials, a permission, or the TLS handshake.

    A wrong or rotated password, an ACL user without the right to a command
    or key (Redis ``NOPERM``), a PostgreSQL role that may not log in, a server
    certificate that is not trusted or does not match the host name. It is
    not an outage: never a :class:`BackendUnavailableError`, never retried,
    and an acquire never falls back to a local lock on it
    (``on_unavailable="local"``). The command line exits 77 on it.
    """


class BrokenBarrierError(LockError, asyncio.BrokenBarrierError):
    """A distributed barrier broke before every party arrived.

    Raised by ``await barrier.wait()`` when a party's wait timed out or was
    cancelled after it arrived, when a party's session ended (process killed,
    backend closed, session expired), or when the wait began on a broken
    barrier whose parties have not all left. Also an
    :class:`asyncio.BrokenBarrierError`, so code written for
    :class:`asyncio.Barrier` catches it.
    """
