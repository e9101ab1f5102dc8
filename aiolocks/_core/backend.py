"""The public backend: one driver, the shared per-task ledgers, owned tasks.

A :class:`Backend` is what ``aiolocks.connect()`` yields. It holds the policy
that every driver shares (httpx's split: the client holds the policy, a
transport has one job): lock objects and their reentrancy ledgers, the
acquire/release plumbing that survives cancellation, orphan release when a
task ends while holding, and ``close()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .driver import Capabilities, Driver, Family, Grant, Request
from .errors import BackendUnavailableError
from .events import EventHook, EventKind, LockEvent, lock_kind
from .names import validate_name
from .participants import Participant
from .tasks import TaskSet, wait_finished

if TYPE_CHECKING:
    from .doctor import DoctorReport
    from .hold import Hold
    from .leader import LeaderLatch
    from .locks import Mutex, ReadWriteLock, SemaphoreMutex
    from .semaphore import Semaphore

__all__ = ["Backend"]

logger = logging.getLogger("aiolocks")


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
        self._driver = driver
        self.client_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        """Identifies this backend instance in ``Participant.id`` values."""
        self._tasks = TaskSet()
        self._holds: set[Hold] = set()
        # (family, name, mode) -> {task: hold}: the per-task reentrancy ledgers
        self._ledgers: dict[tuple[Family, str, str], dict[asyncio.Task[object], Hold]] = {}
        self._latches: weakref.WeakSet[LeaderLatch] = weakref.WeakSet()
        self._hooks: list[EventHook] = []
        self._open_lock: asyncio.Lock | None = None
        self._opened = False
        self._closed = False

    # -- identity ---------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """What this backend promises (fairness, visible queues, whether holds can be lost)."""
        return self._driver.capabilities

    @property
    def url(self) -> str:
        """The server(s) this backend talks to, without credentials."""
        return self._driver.describe()

    @property
    def closed(self) -> bool:
        """``close()`` has been called."""
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._opened else "not opened")
        return f"<{type(self).__name__} {self.url} {state}>"

    # -- factories --------------------------------------------------------

    def mutex(self, name: str, **options: Any) -> Mutex:
        """A reentrant mutex owned by the current asyncio task (Curator InterProcessMutex)."""
        from .locks import Mutex

        return Mutex(self, name, options)

    def semaphore_mutex(self, name: str, **options: Any) -> SemaphoreMutex:
        """A non-reentrant mutex that any task may release (InterProcessSemaphoreMutex)."""
        from .locks import SemaphoreMutex

        return SemaphoreMutex(self, name, options)

    def semaphore(self, name: str, max_leases: int, **options: Any) -> Semaphore:
        """A counting semaphore of ``max_leases`` leases (InterProcessSemaphoreV2)."""
        from .semaphore import Semaphore

        return Semaphore(self, name, max_leases, options)

    def read_write_lock(self, name: str, **options: Any) -> ReadWriteLock:
        """A read/write lock with ``.read`` and ``.write`` halves (InterProcessReadWriteLock)."""
        from .locks import ReadWriteLock

        return ReadWriteLock(self, name, options)

    def leader_latch(
        self, name: str, participant_id: str | None = None, **options: Any
    ) -> LeaderLatch:
        """A leader latch: one started latch per name has leadership at a time."""
        from .leader import LeaderLatch

        return LeaderLatch(self, name, participant_id, options)

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
        self._hooks.append(hook)

    def remove_event_hook(self, hook: EventHook) -> None:
        """Stop calling ``hook``; a hook that is not registered is ignored."""
        with contextlib.suppress(ValueError):
            self._hooks.remove(hook)

    def _emit(
        self,
        kind: EventKind,
        request: Request,
        *,
        token: int | None = None,
        wait_time: float | None = None,
        hold_time: float | None = None,
        reason: str | None = None,
    ) -> None:
        event = LockEvent(
            kind=kind,
            lock_kind=lock_kind(request.family.value, request.mode.value),
            name=request.name,
            backend=self.url,
            fencing_token=token,
            wait_time=wait_time,
            hold_time=hold_time,
            reason=reason,
        )
        for hook in list(self._hooks):
            try:
                hook(event)
            except Exception:
                logger.exception("aiolocks event hook %r failed", hook)

    def _emit_hold(self, kind: EventKind, hold: Hold) -> None:
        if self._hooks:
            self._emit(
                kind,
                hold.grant.request,
                token=hold.token,
                hold_time=time.monotonic() - hold.acquired_at,
                reason=hold.grant.lost_reason if kind == "lost" else None,
            )

    def _grant_event(self, kind: str, grant: Grant) -> None:
        """Driver-side events (renewals) of a grant held through a Hold."""
        if self._hooks and kind == "renewed":
            self._emit("renewed", grant.request, token=grant.token)

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
        if self._opened:
            return
        self._check_open()
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if not self._opened:
                await self._driver.open()
                self._opened = True

    async def close(self) -> None:
        """Release every hold, stop background work and disconnect.

        Holds still in use are marked lost first, so their ``async with``
        bodies are cancelled and raise :class:`LockLostError`. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        cancelled: asyncio.CancelledError | None = None
        for latch in list(self._latches):
            latch._stop_on_close()
        for hold in list(self._holds):
            hold.grant.mark_lost("the backend was closed")
        releases = [
            self._tasks.spawn(self._driver_release(hold), name="aiolocks-close-release")
            for hold in list(self._holds)
        ]
        if releases:
            cancelled = await wait_finished(asyncio.gather(*releases, return_exceptions=True))
        try:
            await self._tasks.drain(cancel=True)
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
        if self._opened:
            closing = asyncio.ensure_future(self._driver.close())
            cancelled = await wait_finished(closing) or cancelled
            if not closing.cancelled() and closing.exception() is not None:
                logger.warning("closing %s failed", self.url, exc_info=closing.exception())
        if cancelled is not None:
            raise cancelled

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

    # -- plumbing used by the primitives ----------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailableError(f"backend {self.url} is closed")

    def _lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        return self._driver.lock_options(family, options)

    def _validate_name(self, name: object) -> str:
        return validate_name(name)

    def _participant_id(self, task: asyncio.Task[object] | None) -> str:
        if task is None:
            return self.client_id
        return f"{self.client_id}/{task.get_name()}"

    def _ledger(self, family: Family, name: str, mode: str) -> dict[asyncio.Task[object], Hold]:
        key = (family, name, mode)
        ledger = self._ledgers.get(key)
        if ledger is None:
            ledger = self._ledgers[key] = {}
        return ledger

    def _drop_ledger_if_empty(self, family: Family, name: str, mode: str) -> None:
        key = (family, name, mode)
        if not self._ledgers.get(key, True):
            del self._ledgers[key]

    def _register_hold(self, hold: Hold) -> None:
        self._holds.add(hold)

    def _notify_lost(self, hold: Hold) -> None:
        """A hold was lost (the hold already logged it)."""
        self._emit_hold("lost", hold)

    async def _acquire(self, request: Request, deadline: float | None) -> list[Grant] | None:
        """Run ``driver.acquire`` in its own task; give back grants won after a cancel."""
        if not self._opened:
            await self.open()
        self._check_open()
        started = time.monotonic()
        if self._driver.isolates_acquire:
            return await self._acquire_direct(request, deadline, started)
        attempt = self._tasks.spawn(
            self._driver.acquire(request, deadline),
            name=f"aiolocks-acquire:{request.family.value}:{request.name}",
            log_errors=False,
        )
        cancelled = await wait_finished(attempt, cancel_inner=True)
        if cancelled is None:
            grants = attempt.result()
            self._emit_outcome(request, grants, started)
            return grants
        if self._hooks:
            self._emit("cancelled", request, wait_time=time.monotonic() - started)
        # The caller was cancelled. The attempt was cancelled too and cleaned
        # up after itself, unless it had already won: then give it back here,
        # so that nothing stays held by a caller that is gone.
        if not attempt.cancelled() and attempt.exception() is None:
            grants = attempt.result()
            if grants:
                releases = asyncio.gather(
                    *(
                        self._tasks.spawn(
                            self._release_grant(grant), name="aiolocks-release-unwanted"
                        )
                        for grant in grants
                    ),
                    return_exceptions=True,
                )
                await wait_finished(releases)
        raise cancelled

    async def _acquire_direct(
        self, request: Request, deadline: float | None, started: float
    ) -> list[Grant] | None:
        """``driver.acquire`` in the caller's task (the driver isolates its own steps)."""
        try:
            grants = await self._driver.acquire(request, deadline)
        except asyncio.CancelledError:
            if self._hooks:
                self._emit("cancelled", request, wait_time=time.monotonic() - started)
            raise
        self._emit_outcome(request, grants, started)
        return grants

    def _emit_outcome(self, request: Request, grants: list[Grant] | None, started: float) -> None:
        """``acquired`` (one per grant) or ``timeout`` events, if anybody listens."""
        if not self._hooks:
            return
        waited = time.monotonic() - started
        if grants:
            for grant in grants:
                self._emit("acquired", request, token=grant.token, wait_time=waited)
        else:
            self._emit("timeout", request, wait_time=waited)

    async def _release_grant(self, grant: Grant) -> None:
        await self._driver.release(grant)

    async def _driver_release(self, hold: Hold) -> None:
        if hold.released:
            return
        hold.released = True
        self._holds.discard(hold)
        await self._driver.release(hold.grant)
        self._emit_hold("released", hold)

    async def _release(self, hold: Hold) -> None:
        """Release ``hold`` on the server in an owned task; completes even if cancelled."""
        if hold.released:
            return
        if self._driver.isolates_release:
            # The driver finishes its release through cancellations itself.
            try:
                await self._driver_release(hold)
            except Exception:
                if not hold.lost:
                    raise
            return
        task = self._tasks.spawn(
            self._driver_release(hold), name=f"aiolocks-release:{hold.name}", log_errors=False
        )
        cancelled = await wait_finished(task)
        if not task.cancelled():
            exc = task.exception()
            if exc is not None and not hold.lost:
                if cancelled is None:
                    raise exc
                logger.warning("releasing %r failed", hold.name, exc_info=exc)
        if cancelled is not None:
            raise cancelled

    def _release_orphan(self, hold: Hold) -> None:
        """Release, in the background, a hold whose owner task ended while holding."""
        if hold.released or self._closed:
            return
        logger.warning(
            "task %r ended while holding %s %r (fencing token %d); releasing it",
            hold.owner.get_name() if hold.owner is not None else None,
            hold.kind,
            hold.name,
            hold.token,
            extra={
                "aiolocks_event": "orphaned",
                "aiolocks_lock": hold.name,
                "aiolocks_kind": hold.kind,
                "aiolocks_token": hold.token,
            },
        )
        self._emit_hold("orphaned", hold)
        self._tasks.spawn(self._driver_release(hold), name=f"aiolocks-orphan:{hold.name}")

    async def _participants(self, family: Family, name: str) -> list[Participant]:
        await self.open()
        self._check_open()
        return await self._driver.participants(name, family)
