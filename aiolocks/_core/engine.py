"""The engine: one driver, the shared per-task ledgers, and every owned task.

The public :class:`~aiolocks._core.backend.Backend` is a façade over one
:class:`Engine`; the primitives (locks, semaphore, leader latch) talk to the
engine through its public methods. The engine owns:

* the attempt lifecycle of every acquire (see :mod:`aiolocks._core.driver`):
  the driver's steps run inline in the caller's task on the fast path, and
  when the caller is cancelled (once, or again and again under anyio) the
  driver's ``abandon`` runs to completion in the engine's owned task set;
* releases, which complete even when the caller is cancelled (sent again
  from an owned task), and the loss a ``False`` release reports;
* holds, reentrancy ledgers, orphan release when a task ends while holding;
* event hooks;
* the opt-in fallback to a process-local lock when the server cannot be
  reached (``on_unavailable="local"``, see :meth:`Engine._acquire_degraded`);
* ``close()``, which finishes every owned task.

There is exactly one :class:`~aiolocks._core.tasks.TaskSet` per backend, here.
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
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .driver import (
    Attempt,
    Capabilities,
    Driver,
    Family,
    Grant,
    Mode,
    Request,
    SupportsCheckName,
)
from .errors import BackendUnavailableError
from .events import EventHook, EventKind, LockEvent, lock_kind
from .localstore import LocalDriver
from .names import validate_name
from .participants import Participant
from .tasks import TaskSet, cancelled_again, running_task, wait_finished

if TYPE_CHECKING:
    from .hold import Hold
    from .leader import LeaderLatch

__all__ = ["ON_UNAVAILABLE", "Engine"]

#: the values of ``connect(url, on_unavailable=...)``
ON_UNAVAILABLE = ("raise", "local")

T = TypeVar("T")

logger = logging.getLogger("aiolocks")

#: How long an acquire that failed with an error waits for its attempt's
#: clean-up before the error reaches the caller (the rest runs in the
#: background; see ``Engine._attempt``).
ERROR_CLEANUP_WAIT = 1.0


def _log_abandon_failure(task: asyncio.Future[Any], name: str) -> None:
    """Warn when an attempt's clean-up (``driver.abandon``) failed."""
    if not task.cancelled() and task.exception() is not None:
        logger.warning(
            "giving up an acquire of %r left something behind", name, exc_info=task.exception()
        )


Ledger = dict[asyncio.Task[object], "Hold"]


class Engine:
    """Runs one driver for one backend: attempts, releases, holds, ledgers, owned tasks."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        #: the driver's own name check, found once (a protocol check is slow)
        self._check_name = driver.check_name if isinstance(driver, SupportsCheckName) else None
        self.client_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.tasks = TaskSet()
        self.holds: set[Hold] = set()
        #: (family, name, mode) -> {task: hold}: the per-task reentrancy ledgers
        self.ledgers: dict[tuple[Family, str, str], Ledger] = {}
        self.latches: weakref.WeakSet[LeaderLatch] = weakref.WeakSet()
        self.hooks: list[EventHook] = []
        #: ``grant_event`` bound once (every hold's grant gets it as its event sink)
        self.grant_event_sink = self.grant_event
        self._open_lock: asyncio.Lock | None = None
        self.opened = False
        self.closed = False
        #: "raise" (the default) or "local": see :meth:`set_on_unavailable`
        self.on_unavailable = "raise"
        self._fallback: Driver | None = None
        self._degraded_live = 0
        self._release_waiters: list[asyncio.Future[None]] = []
        #: how many releases are being sent: close() waits until none is,
        #: before closing the driver, whose connections a late release would
        #: otherwise reopen and leave open. A counter, not a future per
        #: release: the future (``_releases_idle``) is made only while
        #: close() waits.
        self._releasing = 0
        self._releases_idle: asyncio.Future[None] | None = None
        self._driver_closing = False

    # -- identity -----------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """What the driver promises."""
        return self.driver.capabilities

    @property
    def url(self) -> str:
        """The server(s), without credentials."""
        return self.driver.describe()

    def check_open(self) -> None:
        """Raise :class:`BackendUnavailableError` once the backend is closed."""
        if self.closed:
            raise BackendUnavailableError(f"backend {self.url} is closed")

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        """The driver's validation of per-lock options (before any I/O)."""
        return self.driver.lock_options(family, options)

    def validate_name(self, name: object) -> str:
        """The canonical lock name, or :class:`InvalidLockNameError`.

        A driver may refuse more names (:class:`SupportsCheckName`): the ones
        its server cannot hold as they are.
        """
        canonical = validate_name(name)
        if self._check_name is not None:
            self._check_name(canonical)
        return canonical

    def participant_id(self, task: asyncio.Task[object] | None) -> str:
        """``<client-id>/<task name>``, or the client id alone for object-owned holds."""
        if task is None:
            return self.client_id
        return f"{self.client_id}/{task.get_name()}"

    # -- ledgers and holds ----------------------------------------------------

    def ledger(self, family: Family, name: str, mode: str) -> Ledger:
        """The ``task -> hold`` ledger of one (family, name, mode), created on demand."""
        key = (family, name, mode)
        ledger = self.ledgers.get(key)
        if ledger is None:
            ledger = self.ledgers[key] = {}
        return ledger

    def drop_ledger_if_empty(self, family: Family, name: str, mode: str) -> None:
        """Forget an empty ledger (keeps the dict small)."""
        key = (family, name, mode)
        if not self.ledgers.get(key, True):
            del self.ledgers[key]

    def is_held_here(self, family: Family, name: str, mode: str) -> bool:
        """Some task of this backend holds (family, name, mode)."""
        return bool(self.ledgers.get((family, name, mode)))

    def register_hold(self, hold: Hold) -> None:
        """Track a new hold (``close()`` releases what is left)."""
        self.holds.add(hold)

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Start a task owned by this backend (finished by ``close()``)."""
        return self.tasks.spawn(coro, name=name)

    # -- events -------------------------------------------------------------

    def emit(
        self,
        kind: EventKind,
        request: Request,
        *,
        token: int | None = None,
        wait_time: float | None = None,
        hold_time: float | None = None,
        reason: str | None = None,
        degraded: bool = False,
    ) -> None:
        """Build one :class:`LockEvent` and pass it to every hook (errors are logged)."""
        event = LockEvent(
            kind=kind,
            lock_kind=lock_kind(request.family.value, request.mode.value),
            name=request.name,
            backend=self.url,
            fencing_token=token,
            wait_time=wait_time,
            hold_time=hold_time,
            reason=reason,
            degraded=degraded,
        )
        for hook in list(self.hooks):
            try:
                hook(event)
            except Exception:
                logger.exception("aiolocks event hook %r failed", hook)

    def emit_hold(self, kind: EventKind, hold: Hold) -> None:
        """An event about a hold (released, lost, orphaned), if anybody listens."""
        if self.hooks:
            self.emit(
                kind,
                hold.grant.request,
                token=hold.token,
                hold_time=time.monotonic() - hold.acquired_at,
                reason=hold.grant.lost_reason if kind == "lost" else None,
                degraded=hold.grant.degraded,
            )

    def grant_event(self, kind: str, grant: Grant) -> None:
        """Driver-side events (renewals) of a grant held through a Hold."""
        if self.hooks and kind == "renewed":
            self.emit("renewed", grant.request, token=grant.token)

    def _emit_outcome(self, request: Request, grants: list[Grant] | None, started: float) -> None:
        if not self.hooks:
            return
        waited = time.monotonic() - started
        if grants:
            for grant in grants:
                self.emit(
                    "acquired",
                    request,
                    token=grant.token,
                    wait_time=waited,
                    degraded=grant.degraded,
                )
        else:
            self.emit("timeout", request, wait_time=waited)

    # -- lifecycle ------------------------------------------------------------

    async def open(self) -> None:
        """Connect the driver once."""
        if self.opened:
            return
        self.check_open()
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if not self.opened:
                await self.driver.open(self.tasks)
                self.opened = True

    async def close(self) -> None:
        """Mark live holds lost, release them, finish owned tasks, close the driver."""
        if self.closed:
            return
        self.closed = True
        cancelled: asyncio.CancelledError | None = None
        for latch in list(self.latches):
            latch.stop_on_close()
        holds = list(self.holds)
        for hold in holds:
            hold.grant.mark_lost("the backend was closed")
        releases = [
            self.tasks.spawn(self._release_quietly(hold), name="aiolocks-close-release")
            for hold in holds
        ]
        if releases:
            cancelled = await wait_finished(asyncio.gather(*releases, return_exceptions=True))
        if self._releasing:  # releases of bodies that ended before ours began
            idle = self._releases_idle = asyncio.get_running_loop().create_future()
            cancelled = await wait_finished(idle) or cancelled
        try:
            await self.tasks.drain(cancel=True)
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
        self._driver_closing = True
        if self.opened:
            closing = asyncio.ensure_future(self.driver.close())
            cancelled = await wait_finished(closing) or cancelled
            if not closing.cancelled() and closing.exception() is not None:
                logger.warning("closing %s failed", self.url, exc_info=closing.exception())
        if self._fallback is not None:
            await self._fallback.close()
        if cancelled is not None:
            raise cancelled

    # -- acquire --------------------------------------------------------------

    def acquire(
        self, request: Request, deadline: float | None, task: asyncio.Task[Any] | None = None
    ) -> Coroutine[Any, Any, list[Grant] | None]:
        """Take ``request.count`` holds, or ``None`` once ``deadline`` passed (await the result).

        ``task`` is the calling task when the caller knows it already (saves
        a lookup on the fast path).

        Cancelling the caller at any await leaves nothing on the server: the
        driver's ``abandon`` runs to completion in an owned task before the
        ``CancelledError`` propagates.

        With ``on_unavailable="local"``, an acquire that fails with
        :class:`BackendUnavailableError` (before or while waiting) takes the
        same lock from the process-local fallback store instead; see
        :meth:`_acquire_degraded`.

        Not a coroutine function itself: on the fast path (open, nothing
        degraded) it hands back the attempt's coroutine, which is then the
        only frame of the engine between the caller and the driver.
        """
        if self._degraded_live or not self.opened or self.closed:
            return self._acquire_slow(request, deadline, task)
        return self._attempt(self.driver, request, deadline, time.monotonic(), task, top=True)

    async def _acquire_slow(
        self, request: Request, deadline: float | None, task: asyncio.Task[Any] | None
    ) -> list[Grant] | None:
        """:meth:`acquire` when the driver is not open yet or degraded holds are live."""
        started = time.monotonic()
        try:
            # The server may be back while tasks of this process still hold
            # degraded: a new hold from the server waits for them, or two
            # tasks of this process would overlap.
            if self._degraded_live and not await self._wait_no_conflict(
                request, deadline, degraded=True
            ):
                self._emit_outcome(request, None, started)
                return None
            if not self.opened:
                await self.open()
            self.check_open()
        except BackendUnavailableError as exc:
            if not self._degrades(request, exc):
                raise
            return await self._acquire_degraded(request, deadline, started, exc)
        return await self._attempt(self.driver, request, deadline, started, task, top=True)

    async def _attempt(
        self,
        driver: Driver,
        request: Request,
        deadline: float | None,
        started: float,
        task: asyncio.Task[Any] | None = None,
        *,
        top: bool = False,
    ) -> list[Grant] | None:
        """One attempt on ``driver`` through to grants, ``None`` at the deadline, or an error.

        ``top``: the attempt on the server that :meth:`acquire` runs; it
        reports the outcome to the hooks and, when the server is unreachable
        and the backend degrades, goes on to :meth:`_acquire_degraded`.
        """
        attempt = driver.begin(request)
        attempt.deadline = deadline
        if task is None:
            task = running_task()
        finish_here = True
        # A client library may swallow a cancellation that arrives during a
        # try or a wait (seen with redis-py's cluster client): the error is
        # gone but the task is still cancelling. Honour it, or the caller
        # would go on waiting for a lock it gave up. (Granted: the caller has
        # the lock, as if the cancel had come a moment later.)
        cancels = task.cancelling() if task is not None else 0
        try:
            while True:
                grants = await driver.try_once(attempt)
                if grants is not None:
                    break
                if task is not None and task.cancelling() > cancels:
                    await cancelled_again()
                bound = None
                if deadline is not None:
                    bound = deadline - time.monotonic()
                    if bound <= 0:
                        await driver.abandon(attempt)
                        break
                await driver.wait_for_change(attempt, bound)
                if task is not None and task.cancelling() > cancels:
                    await cancelled_again()
        except BaseException as exc:
            if self._degrades(request, exc):
                finish_here = False
                self._abandon_later(driver, attempt, request)
                if top and isinstance(exc, BackendUnavailableError):
                    return await self._acquire_degraded(request, deadline, started, exc)
                raise
            cancelled = await self._abandon_after_error(driver, attempt, request, started, exc)
            if cancelled is not None and not isinstance(exc, asyncio.CancelledError):
                raise cancelled from exc
            raise
        finally:
            if finish_here:
                driver.finish(attempt)
        if top and self.hooks:
            self._emit_outcome(request, grants, started)
        return grants

    def _abandon_later(self, driver: Driver, attempt: Attempt, request: Request) -> None:
        """The caller degrades to the local fallback at once: give back in an owned task.

        Giving back what the attempt may own on the server is retried until
        its lease would lapse; the caller does not wait for that.
        """
        self.tasks.spawn(
            self._abandon_in_background(driver, attempt),
            name=f"aiolocks-abandon:{request.family.value}:{request.name}",
            log_errors=False,
        )

    async def _abandon_after_error(
        self,
        driver: Driver,
        attempt: Attempt,
        request: Request,
        started: float,
        exc: BaseException,
    ) -> asyncio.CancelledError | None:
        """Give back what a failed or cancelled attempt may own, then report it to the hooks.

        An error reaches the caller after at most ``ERROR_CLEANUP_WAIT`` of
        clean-up: with the server down, the clean-up retries until the
        attempt's lease would have lapsed, and goes on in its owned task
        (cancelled at close). A cancellation waits for it to finish. Returns
        the cancellation that hit the clean-up, if any (see :meth:`_abandon`).
        """
        bound = ERROR_CLEANUP_WAIT if isinstance(exc, Exception) else None
        cancelled = await self._abandon(driver, attempt, bound)
        if self.hooks:
            if isinstance(exc, asyncio.CancelledError):
                self.emit("cancelled", request, wait_time=time.monotonic() - started)
            elif isinstance(exc, Exception):
                # ``failed``: the acquire raised; the error's class is the reason
                self.emit(
                    "failed",
                    request,
                    wait_time=time.monotonic() - started,
                    reason=type(exc).__name__,
                )
        return cancelled

    async def _abandon_in_background(self, driver: Driver, attempt: Attempt) -> None:
        try:
            await driver.abandon(attempt)
        except Exception:
            logger.warning(
                "giving up an acquire of %r left something behind",
                attempt.request.name,
                exc_info=True,
            )
        finally:
            driver.finish(attempt)

    # -- degradation (on_unavailable="local") ---------------------------------

    def set_on_unavailable(self, value: object) -> None:
        """Choose what an acquire does when the server cannot be reached (before any I/O).

        :raises ValueError: ``value`` is not ``"raise"`` or ``"local"``.
        """
        if value not in ON_UNAVAILABLE:
            raise ValueError(
                f"on_unavailable must be one of {', '.join(map(repr, ON_UNAVAILABLE))}, "
                f"got {value!r}"
            )
        self.on_unavailable = str(value)

    def _degrades(self, request: Request, exc: BaseException) -> bool:
        """``exc`` ends this acquire on the server but sends it to the local fallback."""
        return (
            isinstance(exc, BackendUnavailableError)
            and self.on_unavailable == "local"
            and not self.closed
            and request.family is not Family.LEADER
            and request.downgrade_of is None
        )

    async def _acquire_degraded(
        self,
        request: Request,
        deadline: float | None,
        started: float,
        cause: BackendUnavailableError,
    ) -> list[Grant] | None:
        """Take the lock from the process-local fallback store (the server is unreachable).

        The local lock has the same family, name, mode and ``max_leases``; it
        coordinates only the tasks of this process (every backend of this
        process on the same URL shares one fallback store). It first waits
        for conflicting holds that tasks of this process took from the server
        before the outage, so that two tasks of this process never overlap.
        """
        fallback = self._fallback_driver()
        logger.warning(
            "%s %r: %s is unavailable (%s); taking a process-local lock instead "
            "(on_unavailable='local'): it excludes only the tasks of this process",
            lock_kind(request.family.value, request.mode.value),
            request.name,
            self.url,
            cause,
            extra={
                "aiolocks_event": "degraded",
                "aiolocks_lock": request.name,
                "aiolocks_reason": str(cause),
            },
        )
        if not await self._wait_no_conflict(request, deadline, degraded=False):
            self._emit_outcome(request, None, started)
            return None
        grants = await self._attempt(fallback, request, deadline, started)
        if grants:
            for grant in grants:
                grant.degraded = True
            self._degraded_live += len(grants)
            if self.hooks:
                for grant in grants:
                    self.emit(
                        "degraded",
                        request,
                        token=grant.token,
                        wait_time=time.monotonic() - started,
                        reason=type(cause).__name__,
                        degraded=True,
                    )
        self._emit_outcome(request, grants, started)
        return grants

    def _fallback_driver(self) -> Driver:
        """The process-local store degraded holds come from, shared per backend URL."""
        if self._fallback is None:
            self._fallback = LocalDriver(f"\x00degraded:{self.url}")
        return self._fallback

    def _driver_for(self, grant: Grant) -> Driver:
        if grant.degraded and self._fallback is not None:
            return self._fallback
        return self.driver

    def _conflicts(self, request: Request, *, degraded: bool) -> bool:
        """A live hold of this engine (degraded or from the server) excludes ``request``."""
        if request.family in (Family.SEMAPHORE, Family.LEADER):
            return False
        for hold in self.holds:
            grant = hold.grant
            other = grant.request
            if (
                grant.degraded is not degraded
                or hold.released
                or other.name != request.name
                or other.family is not request.family
            ):
                continue
            if request.owner is not None and hold.owner is request.owner:
                continue  # the caller's own hold (read under its write, ...)
            if other.mode is Mode.READ and request.mode is Mode.READ:
                continue
            return True
        return False

    async def _wait_no_conflict(
        self, request: Request, deadline: float | None, *, degraded: bool
    ) -> bool:
        """Wait until :meth:`_conflicts` is false; ``False`` if ``deadline`` passed first."""
        loop = asyncio.get_running_loop()
        while self._conflicts(request, degraded=degraded):
            bound = None
            if deadline is not None:
                bound = deadline - time.monotonic()
                if bound <= 0:
                    return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._release_waiters.append(waiter)
            try:
                await asyncio.wait([waiter], timeout=bound)
            finally:
                with contextlib.suppress(ValueError):
                    self._release_waiters.remove(waiter)
        return True

    def _hold_ended(self, hold: Hold) -> None:
        """Bookkeeping when a hold is released: degraded count, wake conflict waiters."""
        if hold.grant.degraded:
            self._degraded_live -= 1
        waiters, self._release_waiters = self._release_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _abandon(
        self, driver: Driver, attempt: Attempt, bound: float | None = None
    ) -> asyncio.CancelledError | None:
        """Run ``driver.abandon`` in an owned task, through cancellations.

        Waits for it to finish, or for ``bound`` seconds when given (the task
        goes on in the owned task set; a failure is logged when it ends).
        """
        task = self.tasks.spawn(
            driver.abandon(attempt),
            name=f"aiolocks-abandon:{attempt.request.family.value}:{attempt.request.name}",
            log_errors=False,
        )
        name = attempt.request.name
        cancelled = await wait_finished(task, timeout=bound)
        if task.done():
            _log_abandon_failure(task, name)
        else:
            task.add_done_callback(lambda done: _log_abandon_failure(done, name))
        return cancelled

    # -- release --------------------------------------------------------------

    async def release(self, hold: Hold) -> None:
        """Release ``hold`` on the server; completes even if the caller is cancelled.

        A release the server answers "not ours any more" marks the hold lost.
        Errors are raised unless the hold is already lost.
        """
        if hold.released:
            return
        hold.released = True
        self.holds.discard(hold)
        grant = hold.grant
        if grant.degraded or self._release_waiters:
            self._hold_ended(hold)
        if self._driver_closing and grant.lost:
            # Closing lost it; its session or lease ends with the driver.
            self.emit_hold("released", hold)
            return
        driver = self._fallback if grant.degraded and self._fallback is not None else self.driver
        self._releasing += 1
        try:
            ok = await driver.release(grant)
        except asyncio.CancelledError:
            # The command may or may not have run; release is idempotent, so
            # send it again where no cancellation reaches, wait for it, and
            # ignore its answer (the first send may have done the work).
            resend = self.tasks.spawn(
                self._release_again(grant), name=f"aiolocks-release:{hold.name}", log_errors=False
            )
            await wait_finished(resend)
            if not resend.cancelled() and resend.exception() is not None and not hold.lost:
                logger.warning("releasing %r failed", hold.name, exc_info=resend.exception())
            self.emit_hold("released", hold)
            raise
        except Exception:
            self.emit_hold("released", hold)
            if not hold.lost:
                raise
            return
        finally:
            self._releasing -= 1
            idle = self._releases_idle
            if idle is not None and not self._releasing:
                self._releases_idle = None
                if not idle.done():
                    idle.set_result(None)
        if ok is False:
            grant.mark_lost("it was already gone on the server when it was released")
        if self.hooks:
            self.emit_hold("released", hold)

    async def _release_again(self, grant: Grant) -> None:
        await self._driver_for(grant).release(grant)

    async def release_grant(self, grant: Grant) -> bool:
        """Release ``grant`` on the server only (no hold bookkeeping, no events).

        For test helpers that take a hold away behind the body's back
        (``aiolocks.testing.lose``); the hold's own release later finds
        nothing and is idempotent.
        """
        return await self._driver_for(grant).release(grant)

    async def _release_quietly(self, hold: Hold) -> None:
        try:
            await self.release(hold)
        except Exception:
            logger.warning("releasing %r failed", hold.name, exc_info=True)

    def release_orphan(self, hold: Hold) -> None:
        """Release, in an owned task, a hold whose owner task ended while holding."""
        if hold.released or self.closed:
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
        self.emit_hold("orphaned", hold)
        self.tasks.spawn(self._release_quietly(hold), name=f"aiolocks-orphan:{hold.name}")

    # -- inspection -----------------------------------------------------------

    async def participants(self, family: Family, name: str) -> list[Participant]:
        """Holders first, then waiters, as the driver reports them."""
        await self.open()
        self.check_open()
        return await self.driver.participants(name, family)

    def remove_hook(self, hook: EventHook) -> None:
        """Stop calling ``hook``; unknown hooks are ignored."""
        with contextlib.suppress(ValueError):
            self.hooks.remove(hook)
