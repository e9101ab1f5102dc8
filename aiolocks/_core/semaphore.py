"""Semaphore and Lease (Curator's InterProcessSemaphoreV2, Redisson's permit semaphore).

Leases are not tied to a task: any task may release a lease, and a lease is
not released when the task that acquired it ends. Each lease has its own
fencing token. ``acquire_many(n)`` is all or nothing: the driver returns ``n``
grants or none, so a waiter never sits on part of what it needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, final

from . import permits
from .driver import Family, Mode, Request
from .errors import LockLostError, LockTimeoutError
from .hold import Hold
from .locks import current_task, enter_hold_body, exit_hold_body
from .participants import Participant
from .timeouts import LEASE_TIME_RANGE, check_seconds, check_timeout, deadline_from

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Lease", "LeaseContext", "Semaphore"]


@final
class Lease:
    """One lease of a :class:`Semaphore`.

    >>> lease = await sem.acquire(timeout=2)  # doctest: +SKIP
    >>> async with lease:  # releases on exit  # doctest: +SKIP
    ...     ...

    Not tied to a task; ``release()`` is idempotent. If the lease is lost
    (session expired, lease lapsed), ``is_lost`` turns true (and stays true),
    a running ``async with`` body is cancelled and raises
    :class:`LockLostError`, and an explicit ``release()`` cleans up and then
    raises :class:`LockLostError`.
    """

    __slots__ = ("_expiry", "_hold", "_semaphore")

    def __init__(self, semaphore: Semaphore, hold: Hold, lease_time: float | None) -> None:
        self._semaphore = semaphore
        self._hold = hold
        self._expiry = None if lease_time is None else permits.expire_after(hold, lease_time)
        permits.register(hold)

    @property
    def id(self) -> str:
        """This lease's id (its fencing token as text): ``sem.release_by_id(id)`` anywhere."""
        return str(self._hold.token)

    @property
    def semaphore(self) -> Semaphore:
        """The semaphore this lease belongs to."""
        return self._semaphore

    @property
    def fencing_token(self) -> int:
        """This lease's fencing token (distinct and increasing across leases of one name)."""
        return self._hold.token

    @property
    def is_lost(self) -> bool:
        """The server no longer backs this lease."""
        return not self._hold.grant.verify()

    @property
    def is_degraded(self) -> bool:
        """This lease is process-local: the server was unreachable (``on_unavailable="local"``).

        It counts only against other degraded leases of this process, and its
        fencing token comes from the local store (not comparable with the
        server's). It stays local until released.
        """
        return self._hold.degraded

    @property
    def is_released(self) -> bool:
        """``release()`` was called."""
        return self._hold.released

    async def release(self) -> None:
        """Give the lease back; a second call does nothing; completes even if cancelled.

        :raises LockLostError: the lease was lost while it was held (raised by
            the call that releases it, after the cleanup).
        """
        hold = self._hold
        if await self._release_noting_loss():
            raise LockLostError(
                f"semaphore lease of {hold.name!r} was lost while it was held "
                f"({hold.grant.lost_reason}; fencing token {hold.token}); it is released now"
            )

    async def _release_noting_loss(self) -> bool:
        """``release()`` without raising on loss: whether this call released a lost lease."""
        hold = self._hold
        if hold.released:
            return False
        if self._expiry is not None:
            self._expiry.cancel()
        permits.forget(hold)
        hold.grant.verify()  # a lease that ran out while the loop was busy counts as lost
        await self._semaphore._engine.release(hold)
        return hold.lost

    async def __aenter__(self) -> Lease:
        await enter_hold_body(self._hold, self._release_noting_loss)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await exit_hold_body(self._hold, exc, self._release_noting_loss)

    def __repr__(self) -> str:
        state = "lost" if self.is_lost else ("released" if self.is_released else "held")
        return f"<Lease of {self._semaphore.name!r} token={self.fencing_token} {state}>"


@final
class LeaseContext:
    """``async with sem.lease(timeout=2) as lease``: one lease for the body.

    :raises LockTimeoutError: no lease within ``timeout``.
    """

    __slots__ = ("_lease", "_lease_time", "_semaphore", "_timeout")

    def __init__(
        self, semaphore: Semaphore, timeout: float | None, lease_time: float | None = None
    ) -> None:
        self._semaphore = semaphore
        self._timeout = timeout
        self._lease_time = lease_time
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        lease = await self._semaphore.acquire(self._timeout, lease_time=self._lease_time)
        if lease is None:
            raise LockTimeoutError(
                f"semaphore {self._semaphore.name!r} gave no lease within {self._timeout} s"
            )
        self._lease = lease
        return await lease.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.__aexit__(exc_type, exc, tb)


@final
class Semaphore:
    """A distributed counting semaphore of ``max_leases`` leases.

    >>> sem = backend.semaphore("limits/downstream-api", max_leases=5)  # doctest: +SKIP
    >>> async with sem as lease:  # doctest: +SKIP
    ...     ...

    At no moment do more than ``max_leases`` leases exist across all
    processes. Fair (FIFO) where the backend queues. Leases are not tied to
    a task.

    :raises ValueError: ``max_leases`` < 1, or ``acquire_many(n)`` with
        ``n < 1`` or ``n > max_leases``.
    """

    __slots__ = ("_engine", "_entered", "_key", "_max_leases", "_name", "_options")

    def __init__(
        self, engine: Engine, name: str, max_leases: int, options: Mapping[str, object]
    ) -> None:
        if isinstance(max_leases, bool) or not isinstance(max_leases, int):
            raise TypeError(
                f"semaphore {name!r}: max_leases must be an int, got {type(max_leases).__name__}"
            )
        if max_leases < 1:
            raise ValueError(f"semaphore {name!r}: max_leases must be >= 1, got {max_leases}")
        self._name = name
        self._key = engine.validate_name(name)
        self._engine = engine
        self._max_leases = max_leases
        self._options = engine.lock_options(Family.SEMAPHORE, options)
        self._entered: dict[asyncio.Task[object], list[LeaseContext]] = {}

    @property
    def name(self) -> str:
        """The name this semaphore was created with."""
        return self._name

    @property
    def max_leases(self) -> int:
        """How many leases may exist at once."""
        return self._max_leases

    def __repr__(self) -> str:
        return f"<Semaphore {self._name!r} max_leases={self._max_leases} on {self._engine.url}>"

    async def acquire(
        self, timeout: float | None = None, *, lease_time: float | None = None
    ) -> Lease | None:
        """One lease, or ``None`` when ``timeout`` passed first (``0`` tries once).

        ``lease_time``: seconds after which the lease ends by itself (reported
        lost to its holder and given back), Redisson's expirable permit.
        """
        leases = await self.acquire_many(1, timeout, lease_time=lease_time)
        return None if leases is None else leases[0]

    async def acquire_many(
        self, n: int, timeout: float | None = None, *, lease_time: float | None = None
    ) -> list[Lease] | None:
        """``n`` leases at once, or ``None`` (and none held) when ``timeout`` passed first.

        :raises ValueError: ``n < 1`` or ``n > max_leases`` (it could never succeed),
            or a ``lease_time`` out of range.
        """
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"semaphore {self._name!r}: n must be an int, got {type(n).__name__}")
        if n < 1 or n > self._max_leases:
            raise ValueError(
                f"semaphore {self._name!r}: cannot acquire {n} leases; "
                f"n must be between 1 and max_leases={self._max_leases}"
            )
        seconds = check_timeout(timeout)
        if lease_time is not None:
            lease_time = check_seconds(lease_time, "lease_time", LEASE_TIME_RANGE)
        task = current_task("Semaphore.acquire()")
        self._engine.check_open()
        request = Request(
            name=self._key,
            family=Family.SEMAPHORE,
            mode=Mode.LEASE,
            participant=self._engine.participant_id(task),
            max_leases=self._max_leases,
            count=n,
            owner=None,
            options=self._options,
        )
        grants = await self._engine.acquire(request, deadline_from(seconds))
        if not grants:
            return None
        return [
            Lease(self, Hold(self._engine, grant, kind="semaphore lease", owner=None), lease_time)
            for grant in grants
        ]

    def lease(
        self, timeout: float | None = None, *, lease_time: float | None = None
    ) -> LeaseContext:
        """``async with sem.lease(timeout=2) as lease:``; :class:`LockTimeoutError` on timeout."""
        if lease_time is not None:
            lease_time = check_seconds(lease_time, "lease_time", LEASE_TIME_RANGE)
        return LeaseContext(self, check_timeout(timeout), lease_time)

    async def release_by_id(self, lease_id: str, timeout: float = 30.0) -> bool:
        """Release the lease ``lease_id`` (``lease.id``), held by this or any other process.

        The holder's lease ends as if lost (its ``async with`` body gets
        :class:`LockLostError`) and is given back. ``True`` when it was held;
        ``False`` when no lease with that id is held (checked on the server).

        :raises LockTimeoutError: the holder did not give it back within
            ``timeout`` seconds.
        :raises ValueError: ``lease_id`` is not a lease id.
        :raises NotImplementedError: the backend has no record store (Redlock).
        """
        if not isinstance(lease_id, str) or not lease_id.isascii() or not lease_id.isdigit():
            raise ValueError(
                f"semaphore {self._name!r}: {lease_id!r} is not a lease id (lease.id: digits)"
            )
        seconds = check_seconds(timeout, "release_by_id timeout", (0.0, 3600.0))
        await self._engine.open()
        self._engine.check_open()
        return await permits.release_by_id(self._engine, self._key, lease_id, seconds)

    async def __aenter__(self) -> Lease:
        task = current_task("async with semaphore")
        context = LeaseContext(self, None)
        lease = await context.__aenter__()
        self._entered.setdefault(task, []).append(context)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = current_task("async with semaphore")
        stack = self._entered[task]
        context = stack.pop()
        if not stack:
            del self._entered[task]
        await context.__aexit__(exc_type, exc, tb)

    async def participants(self) -> list[Participant]:
        """Lease holders first, then waiters where the backend queues."""
        return await self._engine.participants(Family.SEMAPHORE, self._key)
