"""The driver contract: what a backend implements, and nothing more.

Everything users see (reentrancy per task, fencing, ``async with``, timeouts,
cancellation safety, loss -> ``LockLostError``, orphan release, MultiLock,
LeaderLatch, events) is built once in :mod:`aiolocks._core` on top of this
contract. The core's :class:`~aiolocks._core.engine.Engine` owns every
acquire attempt from start to end; a driver only talks to its server. A
driver contains no cancellation policy: it never catches ``CancelledError``,
never spawns a task to finish a cleanup, never shields. If it did, two
regimes would fight over the same cancellation.

The attempt lifecycle
---------------------
One ``acquire`` of the core is one :class:`Attempt`. The engine drives it::

    attempt = driver.begin(request)              # synchronous, no I/O
    try:
        while True:
            grants = await driver.try_once(attempt)
            if grants is not None:
                return grants                    # (after driver.finish)
            if deadline passed:
                await driver.abandon(attempt)    # inline
                return None
            await driver.wait_for_change(attempt, seconds_left_or_None)
    except BaseException:
        # cancelled, or a step failed: abandon runs to completion in the
        # engine's owned task set, through any number of re-cancellations
        # (anyio re-delivers its cancellation at every await), then the
        # exception propagates.
    finally:
        driver.finish(attempt)                   # synchronous, exactly once

``begin(request) -> Attempt``
    Synchronous, no I/O, cannot fail on a valid request. Mints every id the
    attempt may write on the server (node name suffix, hash field, row key)
    *before* the first command is sent, and stores them in the attempt
    (subclass :class:`Attempt`, with ``__slots__``). Whatever happens to a
    reply later, those ids identify what this attempt may own (Curator's
    protected mode). The engine then sets ``attempt.deadline`` (monotonic
    seconds, or ``None``), which a driver may use to bound its requests.

``await try_once(attempt) -> list[Grant] | None``
    One try, without waiting for other holders: create / compare / script.
    Returns ``request.count`` grants when won, ``None`` when not now. It may
    leave state on the server that belongs to the attempt (a queue entry, a
    sequential node) and it keeps its record in the attempt for ``abandon``.
    There must be no await between the server saying "yours" and the
    return: the engine records the grants with no await either, so a
    cancellation can never fall between "won" and "owned". Before sending a
    command that may win, note in the attempt that a command is unanswered;
    clear the note when its answer arrives (``abandon`` uses it, see below).
    A driver may retry a command through a short outage (see
    :class:`aiolocks._core.backoff.Backoff`); after that it raises
    :class:`BackendUnavailableError`. Only errors that mean "the server said
    no for good" become other :class:`LockError` subclasses.

``await wait_for_change(attempt, bound)``
    Return when a new ``try_once`` may succeed (the predecessor node went,
    an unlock was published, a local future was set), or after ``bound``
    seconds (``None``: no bound). Returning early for no reason is allowed
    (the engine just tries again), waiting past ``bound`` is not. Waiting is
    event-driven, never a sleep-poll loop; a driver may shorten the wait to
    a lease TTL it learnt from the last try (expiry publishes nothing). A
    driver that must subscribe before it may trust a "no" (Redis pub/sub:
    an unlock published between the try and the subscription would be
    lost) subscribes in its first call and returns at once, so the engine
    tries again with the subscription in place.

``await abandon(attempt)``
    Give back everything this attempt may own on the server: its queue
    entry or node, and any grant a command of the attempt won while the
    engine was no longer waiting for its answer (identify it by the ids
    minted in ``begin``). Idempotent: the engine may call it after a
    timeout, and again after a cancellation that hit the first call. When a
    command is still unanswered, its request may reach the server after
    the cleanup (another connection): the driver must make that late
    request lose (Redis: a short tombstone for the ids, honoured by the
    acquire script; ZooKeeper: delete by the minted name once the create is
    known). This is ordering on the wire, which only the driver knows; *when*
    to clean up and finishing it through cancellation is the engine's job.
    May retry through a short outage; gives up (with a warning) once what it
    leaves would lapse by itself (a lease, a session).

``finish(attempt)``
    Synchronous, no I/O, called exactly once when the attempt ends, whatever
    the outcome (after ``abandon`` where that ran). Drop local resources:
    subscriptions, watches, futures.

``await release(grant) -> bool``
    Give one hold back. Stop renewing it (watchdog) before the first await.
    Returns ``True`` when the hold was ours until this release, ``False``
    when the server no longer had it (lapsed, deleted behind our back,
    failover to a replica that never saw it): the engine then marks the
    grant lost, which reports the loss to the body that used it. Idempotent:
    a second call for the same grant sends the command again and must be
    harmless (compare-and-delete of our own id). When the caller is
    cancelled during ``release``, the engine sends it again from its owned
    task set, waits for that to finish, and ignores its answer (the first
    send may have done the work).

The rest
--------
* ``capabilities``: what the backend promises (:class:`Capabilities`); the
  conformance suite skips tests by these, never by backend name.
* ``describe()``: stable text naming the server(s) without credentials.
* ``lock_options(family, options)``: validate per-lock keyword options
  before any I/O; ``ValueError`` naming the option. The result comes back
  as ``Request.options``.
* ``await open(tasks)`` / ``await close()``: connect within the connect
  timeout (else :class:`BackendUnavailableError`) / disconnect (not a client
  the user gave us). ``tasks`` is the engine's one owned task set: a driver
  that needs background work (a lease renewal loop) spawns it there and
  keeps no task set of its own. ``close()`` runs after the engine released
  every hold and finished its owned tasks.
* ``await participants(name, family)``: holders first, then waiters in queue
  order where the backend queues.
* Mode rules: ``EXCLUSIVE`` (one holder), ``LEASE`` (at most
  ``request.max_leases`` holders; the semaphore), ``READ`` (shared; waits
  only behind earlier writers when the backend is fair), ``WRITE``
  (exclusive against readers and writers). ``request.downgrade_of`` is set
  when the calling task holds the WRITE grant of the same name and asks for
  READ: grant it without letting a queued writer in between.
* Fencing: ``Grant.token`` strictly increases across successive holds of
  one name (read and write halves share a sequence; leases get distinct
  tokens).
* Loss while held (session expired, lease not renewed, key deleted behind
  our back): the driver calls :meth:`Grant.mark_lost`; the engine cancels
  the bodies that use it and they raise ``LockLostError``. A driver keeps
  ``Grant.valid_until`` current where the server may let a hold go on a
  timer, and calls :meth:`Grant.note_renewed` after each renewal.
* Errors: server unreachable -> :class:`BackendUnavailableError`; map
  client exceptions in one place with ``raise ... from exc``.

Optional parts
--------------
A driver may offer more than the contract above. Each optional part is a
small :func:`~typing.runtime_checkable` protocol of this module; the core
asks ``isinstance(driver, SupportsX)`` and a driver opts in by having the
method, with no registration and no base class:

* :class:`SupportsCheckName` -- ``check_name(name)``: refuse, before any
  I/O, a canonical lock name the server cannot hold as it is
  (``InvalidLockNameError``); the core calls it wherever it validates a
  name.
* :class:`SupportsAdmin` -- ``admin()``: an
  :class:`~aiolocks._core.admin.AdminDriver` (list the locks in use,
  force-release one) for ``backend.list_locks()``/``force_release()`` and
  ``aiolocks list``/``break``. Without it those raise ``NotImplementedError``.
* :class:`SupportsDiagnose` -- ``await diagnose()``: the
  :class:`~aiolocks._core.doctor.Diagnosis` of the server's settings for
  ``backend.doctor()``. Without it ``doctor()`` runs only its self-test.

How to write a new driver (etcd, PostgreSQL, ...): subclass
:class:`Attempt` for the ids and server state of one try; implement the
methods above with plain awaits of your client; run
``tests/conformance`` against it (add a backend fixture there). Nothing
else in the core changes.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, final, runtime_checkable

from .lossflag import LossFlag

if TYPE_CHECKING:
    from .admin import AdminDriver
    from .doctor import Diagnosis
    from .participants import Participant
    from .tasks import TaskSet

__all__ = [
    "Attempt",
    "Capabilities",
    "Driver",
    "Family",
    "Grant",
    "Mode",
    "Request",
    "SupportsAdmin",
    "SupportsCheckName",
    "SupportsDiagnose",
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


#: every primitive factory of ``Backend``
ALL_PRIMITIVES: frozenset[str] = frozenset(
    {"mutex", "semaphore_mutex", "semaphore", "read_write_lock", "leader_latch"}
)


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
    #: the lock primitives the backend offers (factory names of ``Backend``)
    primitives: frozenset[str] = ALL_PRIMITIVES


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


class Grant(LossFlag):
    """One hold as a driver sees it: a fencing token, a driver handle, a loss flag.

    The driver creates it and calls :meth:`~.lossflag.LossFlag.mark_lost`;
    the core listens for loss (:meth:`~.lossflag.LossFlag.add_loss_listener`).
    """

    __slots__ = ("degraded", "event_sink", "handle", "request", "token", "valid_until")

    def __init__(self, request: Request, token: int, handle: object = None) -> None:
        super().__init__()
        self.request = request
        self.token = token
        self.handle = handle
        #: set by the core; drivers call :meth:`note_renewed` instead
        self.event_sink: Callable[[str, Grant], None] | None = None
        #: ``time.monotonic()`` after which the server may have let the hold go
        #: (lease end, session timeout) unless the driver moved it on; the
        #: driver keeps it current. ``None``: no such bound.
        self.valid_until: float | None = None
        #: set by the core: taken from the process-local fallback store
        #: (``on_unavailable="local"``), not from the server
        self.degraded = False

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

    def __repr__(self) -> str:
        state = f" lost={self.lost_reason!r}" if self.lost else ""
        return (
            f"<Grant {self.request.family.value}:{self.request.name} "
            f"{self.request.mode.value} token={self.token}{state}>"
        )


class Attempt:
    """One acquire attempt as a driver sees it; drivers subclass it for their state.

    The engine creates nothing here: :meth:`Driver.begin` returns an instance
    (usually of a driver's subclass with ``__slots__``) and the engine hands
    it back to every later step of the same attempt.
    """

    __slots__ = ("deadline", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        #: set by the engine right after ``begin``: ``time.monotonic()`` seconds
        #: by which the caller gives up (``None``: never); bound requests by it
        self.deadline: float | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.request.family.value}:{self.request.name}>"


class Driver(Protocol):
    """What a backend implements. See the module docstring for the contract."""

    capabilities: Capabilities

    def describe(self) -> str:
        """A stable text naming the server(s), e.g. ``zk://h1:2181/chroot``; sorts MultiLocks."""
        ...

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        """Validate the per-lock keyword options before any I/O; ``ValueError`` names a bad one."""
        ...

    async def open(self, tasks: TaskSet) -> None:
        """Connect; raise BackendUnavailableError within the connect timeout.

        ``tasks`` is the engine's owned task set: start background work
        (renewal loops) there; the engine finishes it when the backend closes.
        """
        ...

    def begin(self, request: Request) -> Attempt:
        """Start an attempt: mint its ids; synchronous, no I/O."""
        ...

    async def try_once(self, attempt: Attempt) -> list[Grant] | None:
        """One try without waiting: ``request.count`` grants, or ``None`` when not now."""
        ...

    async def wait_for_change(self, attempt: Attempt, bound: float | None) -> None:
        """Return when a new try may succeed, or after ``bound`` seconds at the latest."""
        ...

    async def abandon(self, attempt: Attempt) -> None:
        """Give back all the attempt may own on the server (queue entry, late grants)."""
        ...

    def finish(self, attempt: Attempt) -> None:
        """The attempt ended: drop local resources (subscriptions, futures); no I/O."""
        ...

    async def release(self, grant: Grant) -> bool:
        """Give one hold back; ``False`` when the server no longer had it; idempotent."""
        ...

    async def participants(self, name: str, family: Family) -> list[Participant]:
        """Holders first, then waiters in queue order where the backend queues."""
        ...

    async def close(self) -> None:
        """Stop background work and disconnect (not the client the user gave us)."""
        ...


@runtime_checkable
class SupportsCheckName(Protocol):
    """Optional part of a driver: it refuses some valid names before any I/O."""

    def check_name(self, name: str) -> None:
        """Raise ``InvalidLockNameError`` for a canonical name the server cannot hold."""
        ...


@runtime_checkable
class SupportsAdmin(Protocol):
    """Optional part of a driver: listing and force-release of the locks in use."""

    def admin(self) -> AdminDriver:
        """The administrative operations over this driver's server."""
        ...


@runtime_checkable
class SupportsDiagnose(Protocol):
    """Optional part of a driver: findings about its server's settings for ``doctor()``."""

    async def diagnose(self) -> Diagnosis:
        """What this driver can see of its server that may break lock guarantees."""
        ...
