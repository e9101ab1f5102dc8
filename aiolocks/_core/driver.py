"""The driver protocol: what a backend must implement, and nothing more.

Everything users see (reentrancy per task, fencing, ``async with``, timeouts,
cancellation safety, loss -> ``LockLostError``, orphan release, MultiLock,
LeaderLatch) is built once in :mod:`aiolocks._core` on top of this small
protocol. A driver has one job: take, release and inspect holds on its server.

Contract of :meth:`Driver.acquire`
----------------------------------
* It takes ``request.count`` holds of ``request.name`` in ``request.family``
  with ``request.mode``, waiting until ``deadline`` (``time.monotonic()``
  seconds; ``None`` = forever). It returns the list of :class:`Grant` (one per
  hold, ``len == count``) or ``None`` when the deadline passed first.
  ``deadline`` in the past means "try exactly once".
* Waiting must be event-driven (a watch, a pub/sub message, a local future),
  never a sleep-poll loop; a bounded wait on a lease TTL is fine.
* The core runs ``acquire`` in its own task, so the driver's ``except
  BaseException`` cleanup is not re-cancelled by anyio's level-triggered
  cancellation. When that task is cancelled, the driver must leave nothing
  behind (delete its node / field / queue entry) and re-raise
  ``CancelledError``. If the core receives grants from a task it had already
  asked to cancel, it releases them itself.
* A driver whose ``acquire`` isolates itself sets ``isolates_acquire =
  True``; the core then awaits it directly in the caller's task (one task
  less per acquire). Such a driver runs every step whose outcome matters
  (a command in flight, its cleanup) in tasks of its own, waits for the
  cleanup through repeated cancellations (``wait_finished``), and returns
  its grants with no await between winning them and returning.
* Mode rules: ``EXCLUSIVE`` (one holder), ``LEASE`` (at most
  ``request.max_leases`` holders; the semaphore), ``READ`` (shared, waits only
  behind earlier writers when the backend is fair), ``WRITE`` (exclusive
  against readers and writers). ``request.downgrade_of`` is set when the
  calling task holds the WRITE grant of the same name and asks for READ: the
  driver must grant it without letting a queued writer in between
  (CURATOR-621).
* Fencing: ``Grant.token`` strictly increases across successive holds of one
  name (read and write halves share a sequence; leases get distinct tokens).
* Loss: when a hold is lost (session expired, lease not renewed, key deleted
  behind our back), the driver calls :meth:`Grant.mark_lost`. The core then
  cancels the body that uses it and raises ``LockLostError``.
* Errors: server unreachable -> :class:`BackendUnavailableError`; driver
  exceptions are mapped in one place with ``raise ... from exc``.

Contract of :meth:`Driver.release`
----------------------------------
Idempotent on the server (a node/field already gone is success). Called by
the core in a tracked task of its own that the caller's cancellation never
reaches (only ``Backend.close()`` cancels it), so a driver need not shield
its release commands again.

A driver that sets ``isolates_release = True`` is awaited directly in the
caller's task instead (one task less per release). It must then finish its
work on the server before returning or raising, even when the caller is
cancelled once or repeatedly: a cancelled command is sent again (release is
idempotent) from a task of the driver's that it waits for with
``wait_finished``, and the ``CancelledError`` is re-raised afterwards.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, final

if TYPE_CHECKING:
    from .participants import Participant

__all__ = [
    "Capabilities",
    "Driver",
    "Family",
    "Grant",
    "Mode",
    "Request",
]


class Family(enum.Enum):
    """Which primitive a request belongs to; each family is its own name space.

    ``mutex("a")`` and ``semaphore("a", 3)`` do not contend: a driver maps each
    family to its own node path / key.
    """

    MUTEX = "mutex"
    SEMAPHORE_MUTEX = "semaphore-mutex"
    SEMAPHORE = "semaphore"
    READ_WRITE = "rwlock"
    LEADER = "leader"

    # Members are singletons compared by identity: the C-level identity hash
    # is consistent and much cheaper than Enum's hash(name) (ledger keys).
    __hash__ = object.__hash__


class Mode(enum.Enum):
    """What kind of hold is asked for."""

    EXCLUSIVE = "exclusive"
    LEASE = "lease"
    READ = "read"
    WRITE = "write"

    # Members are singletons compared by identity: the C-level identity hash
    # is consistent and much cheaper than Enum's hash(name) (ledger keys).
    __hash__ = object.__hash__


@final
@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can promise; conformance tests skip on these, never on names."""

    #: waiters get the lock in arrival order (ZooKeeper, memory, Redis ``fair=True``)
    fair: bool = True
    #: ``participants()`` lists waiters too, not just holders
    queue_visible: bool = True
    #: a hold can be lost while held (sessions, leases); False only for memory
    can_lose: bool = True


@dataclass(frozen=True, slots=True)
class Request:
    """One call to :meth:`Driver.acquire`."""

    name: str
    """Canonical lock name (validated, no leading ``/``)."""
    family: Family
    mode: Mode
    participant: str
    """Who asks (leader latch participant id, or ``<client-id>/<task>``); stored as node data."""
    max_leases: int = 1
    count: int = 1
    downgrade_of: Grant | None = None
    owner: asyncio.Task[object] | None = None
    """The task the hold belongs to (task-bound families), else ``None``."""
    options: Mapping[str, object] = field(default_factory=dict)
    """Per-lock driver options (``lease_time``, ``watchdog``, ``fair``), already validated."""


class Grant:
    """One hold as a driver sees it: a fencing token, a driver handle, a loss flag.

    The driver creates it; the core listens for loss.
    """

    __slots__ = (
        "_listeners",
        "event_sink",
        "handle",
        "lost",
        "lost_reason",
        "request",
        "token",
        "valid_until",
    )

    def __init__(self, request: Request, token: int, handle: object = None) -> None:
        self.request = request
        self.token = token
        self.handle = handle
        self.lost = False
        self.lost_reason: str | None = None
        self._listeners: list[Callable[[Grant], None]] = []
        #: set by the core; drivers call :meth:`note_renewed` instead
        self.event_sink: Callable[[str, Grant], None] | None = None
        #: ``time.monotonic()`` after which the server may have let the hold go
        #: (lease end, session timeout) unless the driver moved it on; the
        #: driver keeps it current. ``None``: no such bound.
        self.valid_until: float | None = None

    def verify(self) -> bool:
        """True while the hold may still be trusted; marks it lost once ``valid_until`` passed.

        The watchdog or session monitor runs in the event loop: if the loop
        was blocked past the lease or session timeout, it had no chance to
        notice. The core calls this where it matters (when an ``async with``
        body ends, ``is_lost``), so such a hold is reported lost instead of
        passing silently.
        """
        if self.lost:
            return False
        until = self.valid_until
        if until is not None and time.monotonic() > until:
            late = time.monotonic() - until
            self.mark_lost(
                f"its lease/session ran out {late:.3f} s ago without being renewed "
                "(was the event loop blocked?)"
            )
            return False
        return True

    def note_renewed(self) -> None:
        """Tell the core a lease renewal succeeded (for event hooks; cheap when unused)."""
        sink = self.event_sink
        if sink is not None:
            sink("renewed", self)

    def mark_lost(self, reason: str) -> None:
        """Record that the server no longer backs this hold; tell the core once."""
        if self.lost:
            return
        self.lost = True
        self.lost_reason = reason
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(self)

    def add_loss_listener(self, listener: Callable[[Grant], None]) -> None:
        """Call ``listener(grant)`` when the hold is lost (at once if it already is)."""
        if self.lost:
            listener(self)
        else:
            self._listeners.append(listener)

    def __repr__(self) -> str:
        state = f" lost={self.lost_reason!r}" if self.lost else ""
        return (
            f"<Grant {self.request.family.value}:{self.request.name} "
            f"{self.request.mode.value} token={self.token}{state}>"
        )


class Driver(Protocol):
    """What a backend implements. See the module docstring for the contract."""

    capabilities: Capabilities

    #: ``acquire`` needs no task of the core's around it (see the module docstring)
    isolates_acquire: bool

    #: ``release`` needs no task of the core's around it (see the module docstring)
    isolates_release: bool

    def describe(self) -> str:
        """A stable text naming the server(s), e.g. ``zk://h1:2181/chroot``; sorts MultiLocks."""
        ...

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        """Validate the per-lock keyword options (``fair``, ``lease_time``, ``watchdog``...).

        Called when a lock object is built, before any I/O; raise ``ValueError``
        naming an unknown or bad option. The result is passed back as
        ``Request.options``.
        """
        ...

    async def open(self) -> None:
        """Connect; raise BackendUnavailableError within the connect timeout."""
        ...

    async def acquire(self, request: Request, deadline: float | None) -> list[Grant] | None:
        """Take ``request.count`` holds, or return ``None`` once ``deadline`` has passed."""
        ...

    async def release(self, grant: Grant) -> None:
        """Give one hold back; idempotent; a lost grant releases without error."""
        ...

    async def participants(self, name: str, family: Family) -> list[Participant]:
        """Holders first, then waiters in queue order where the backend queues."""
        ...

    async def close(self) -> None:
        """Stop background work and disconnect (not the client the user gave us)."""
        ...
