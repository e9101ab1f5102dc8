"""The public backend: a façade over one :class:`~aiolocks._core.engine.Engine`.

A :class:`Backend` is what ``aiolocks.connect()`` yields: the factory of every
lock primitive, event hooks, ``open()``/``close()``. The work (attempts,
releases, holds, ledgers, owned tasks) happens in the engine; a backend
class for a server builds its driver and passes it to ``Backend.__init__``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from .barrier import Barrier
from .countdown import CountDownLatch
from .driver import Capabilities, Driver, Family
from .engine import Engine, Ledger
from .events import EventHook
from .group import Group
from .hold import Hold
from .leader import LeaderLatch
from .locks import Mutex, ReadWriteLock, SemaphoreMutex
from .once import Once
from .semaphore import Semaphore
from .tasks import TaskSet

if TYPE_CHECKING:
    from .admin import LockInfo
    from .doctor import DoctorReport

__all__ = ["Backend"]


class Backend:
    """A connection to one lock service; the factory of every lock primitive.

    Build it with :func:`aiolocks.connect`, or with a backend class on a client
    you already have (``ZooKeeperBackend(client)``, ``RedisBackend(client)``).

    >>> async with aiolocks.connect("memory://") as backend:  # doctest: +SKIP
    ...     async with backend.mutex("locks/pay/order-1001"):
    ...         ...

    ``close()`` releases every hold; a hold whose ``async with`` body is still
    running is marked lost, so that body gets :class:`LockLostError`.
    """

    def __init__(self, driver: Driver) -> None:
        self._engine = Engine(driver)

    @classmethod
    def _around(cls, driver: Driver) -> Self:
        """An instance of this backend class around a ready driver (``from_url`` uses it).

        The one way to build a backend around a driver: a subclass whose
        public ``__init__`` takes a client builds its driver and calls
        ``super().__init__(driver)``; a URL builds the driver and calls this.
        """
        backend = cls.__new__(cls)
        Backend.__init__(backend, driver)
        return backend

    @property
    def client_id(self) -> str:
        """Identifies this backend instance in ``Participant.id`` values."""
        return self._engine.client_id

    # -- identity ---------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """What this backend promises (fairness, visible queues, whether holds can be lost)."""
        return self._engine.capabilities

    @property
    def url(self) -> str:
        """The server(s) this backend talks to, without credentials."""
        return self._engine.url

    @property
    def on_unavailable(self) -> str:
        """What an acquire does when the server is unreachable: ``"raise"`` or ``"local"``.

        ``"local"`` falls back to a process-local lock of the same name and
        kind (``lock.is_degraded``); see ``docs/degradation.md``.
        """
        return self._engine.on_unavailable

    @on_unavailable.setter
    def on_unavailable(self, value: str) -> None:
        self._engine.set_on_unavailable(value)

    @property
    def closed(self) -> bool:
        """``close()`` has been called."""
        return self._engine.closed

    def __repr__(self) -> str:
        engine = self._engine
        state = "closed" if engine.closed else ("open" if engine.opened else "not opened")
        return f"<{type(self).__name__} {self.url} {state}>"

    # -- factories --------------------------------------------------------

    def mutex(self, name: str, **options: Any) -> Mutex:
        """A reentrant mutex owned by the current asyncio task (Curator InterProcessMutex)."""
        return Mutex(self._engine, self, name, options)

    def semaphore_mutex(self, name: str, **options: Any) -> SemaphoreMutex:
        """A non-reentrant mutex that any task may release (InterProcessSemaphoreMutex)."""
        return SemaphoreMutex(self._engine, self, name, options)

    def semaphore(self, name: str, max_leases: int, **options: Any) -> Semaphore:
        """A counting semaphore of ``max_leases`` leases (InterProcessSemaphoreV2)."""
        return Semaphore(self._engine, name, max_leases, options)

    def read_write_lock(self, name: str, **options: Any) -> ReadWriteLock:
        """A read/write lock with ``.read`` and ``.write`` halves (InterProcessReadWriteLock)."""
        return ReadWriteLock(self._engine, self, name, options)

    def leader_latch(
        self, name: str, participant_id: str | None = None, value: object = None, **options: Any
    ) -> LeaderLatch:
        """A leader latch: one started latch per name has leadership at a time.

        ``value`` (JSON) is what this latch advertises while it leads (``observe()``).
        """
        return LeaderLatch(self._engine, name, participant_id, options, value)

    def group(self, name: str) -> Group:
        """A group of members tied to their sessions (tooz groups, Curator GroupMember).

        :raises NotImplementedError: this backend has no record store.
        """
        return Group(self._engine, name)

    # -- scheduled jobs, latches, barriers (over the record store) --------

    def once(
        self,
        name: str,
        *,
        at_most_for: float,
        at_least_for: float = 0.0,
        hard_bound: bool = False,
    ) -> Once:
        """A job run by at most one process per period, never waiting (ShedLock's lock).

        ``async with backend.once(name, at_most_for=600, at_least_for=50) as ran:``
        see :class:`aiolocks.Once` and ``docs/jobs.md``.
        """
        return Once(self._engine, name, at_most_for, at_least_for, hard_bound)

    def count_down_latch(self, name: str) -> CountDownLatch:
        """A count-down latch shared by every process (Redisson's RCountDownLatch)."""
        return CountDownLatch(self._engine, name)

    def barrier(self, name: str, parties: int) -> Barrier:
        """A barrier of ``parties`` parties across processes (``asyncio.Barrier``'s ``wait``)."""
        return Barrier(self._engine, name, parties)

    # -- event hooks ------------------------------------------------------

    def add_event_hook(self, hook: EventHook) -> None:
        """Call ``hook(event)`` for every :class:`LockEvent` of this backend.

        >>> backend.add_event_hook(lambda event: print(event.kind, event.name))  # doctest: +SKIP

        Hooks run in the event loop and must be quick; an exception in a hook
        is logged and ignored. With no hook registered no event is built.
        See ``aiolocks.prometheus.PrometheusHook`` for a ready-made one.
        """
        if not callable(hook):
            raise TypeError(f"event hook must be callable, got {type(hook).__name__}")
        self._engine.hooks.append(hook)

    def remove_event_hook(self, hook: EventHook) -> None:
        """Stop calling ``hook``; a hook that is not registered is ignored."""
        self._engine.remove_hook(hook)

    # -- operations -------------------------------------------------------

    async def doctor(self, *, self_test: bool = True) -> DoctorReport:
        """Check the lock service's settings and run a live self-test; never raises for findings.

        >>> report = await backend.doctor()  # doctest: +SKIP
        >>> report.ok, report.codes()  # doctest: +SKIP
        (False, ['redis-eviction-policy', 'redis-persistence'])

        Returns a :class:`aiolocks.DoctorReport`: configuration findings (each
        with a severity, what it breaks and the fix) and, with ``self_test``,
        the outcome of taking and releasing a scratch lock. An unreachable
        server is a critical finding, not an exception. ``aiolocks doctor URL``
        prints the same report; ``docs/operations.md`` explains each finding.
        """
        from .doctor import run_doctor

        return await run_doctor(self, self._driver, live=self_test)

    # -- lifecycle --------------------------------------------------------

    async def open(self) -> None:
        """Connect the driver; idempotent. ``connect()`` calls it for you."""
        await self._engine.open()

    async def close(self) -> None:
        """Release every hold, stop background work and disconnect.

        Holds still in use are marked lost first, so their ``async with``
        bodies are cancelled and raise :class:`LockLostError`. Idempotent.
        """
        await self._engine.close()

    async def __aenter__(self) -> Backend:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- read-only views for tests and diagnostics ------------------------

    @property
    def _driver(self) -> Any:
        return self._engine.driver

    @property
    def _holds(self) -> set[Hold]:
        return self._engine.holds

    @property
    def _tasks(self) -> TaskSet:
        return self._engine.tasks

    @property
    def _ledgers(self) -> Mapping[tuple[Family, str, str], Ledger]:
        return self._engine.ledgers


    # -- administration ---------------------------------------------------

    async def list_locks(self, prefix: str = "") -> list[LockInfo]:
        """Every lock whose name starts with ``prefix`` that has holders or waiters.

        >>> for info in await backend.list_locks("jobs/"):  # doctest: +SKIP
        ...     print(info.kind, info.name, len(info.participants))

        ``prefix`` is a plain string prefix of the canonical name. Meant for
        operators (``aiolocks list``): it scans the backend's lock space.
        """
        from .admin import list_locks

        return await list_locks(self, prefix)

    async def force_release(self, name: str, kind: str | None = None) -> int:
        """Remove every hold of ``name`` (of one ``kind``, or of every kind); the number removed.

        An administrative tool (Redisson's ``forceUnlock``, ``aiolocks break``)
        for a lock whose holder is stuck. The former holders see the loss as
        :class:`LockLostError`: on ``memory://`` at once, on Redis at once by
        the key's keyspace events (at the next lease renewal, within a third of
        ``lease_time``, where they are off or refused, and on Redlock), on
        ZooKeeper at once (a watch on the held node). ``kind``: ``"mutex"``, ``"semaphore-mutex"``,
        ``"semaphore"``, ``"rwlock"`` or ``"leader"``.
        """
        from .admin import force_release

        return await force_release(self, name, kind)
