"""Once-per-period jobs: ShedLock's ``lockAtMostFor``/``lockAtLeastFor``, never waiting.

``async with backend.once(name, at_most_for=S, at_least_for=S2) as ran:``
is for the job that every replica schedules (cron in every pod, an
APScheduler or arq schedule) and one of them should run per period.

The design
----------
One expiring record of the backend's record store, ``once/<name>/lock``,
is the lock. Its expiry is counted by the **server** from the moment the
server took the write (Redis ``PX``, an etcd lease, PostgreSQL ``now()``,
ZooKeeper's modification time), never by a client's clock:

1. Read the local monotonic clock (``started``), then ``create`` the record
   with ``ttl=at_most_for``. Another process has it: ``ran`` is ``False``,
   nothing was written, nothing waits.
2. While the body runs, a task owned by the backend rewrites the record
   every third of ``at_most_for`` with ``ttl=at_most_for`` (compare-and-set
   by version): a live process keeps its job however long it runs, and a
   crashed one frees it at most ``at_most_for`` after its last write. A
   renewal that has no answer shortly before the record can expire (a
   partition) is given up and counts as a loss, so the body is told before
   another process can take the job.
   ``hard_bound=True`` renews nothing: when ``at_most_for`` has passed the
   body is cancelled and the block raises :class:`LockLostError`.
3. On exit the record is rewritten with ``ttl = at_least_for - elapsed``,
   ``elapsed`` measured on the monotonic clock from ``started``; when
   nothing is left it is deleted.

Why the period is never cut short: the server took the create after
``started`` and takes the exit write after the client measured ``elapsed``,
so the record expires no earlier than ``at_least_for`` after ``started`` in
real time. The next process's ``create`` succeeds only after that. Only the
*rate* of the local monotonic clock enters (a few parts per million); the
offset between the machines' clocks enters nowhere, so replicas whose clocks
disagree by minutes still run the job once per period. The cost: the record
may outlive ``at_least_for`` by one network round trip.

Loss is never silent: when the record was taken or deleted behind our back,
a renewal could not reach the server before the hold ran out, or the backend
closed, the body is cancelled and the block raises :class:`LockLostError`
(the template is CPython's ``asyncio.timeout()``: our own cancellation is
withdrawn with ``task.uncancel()``, a cancellation somebody else asked for
wins).

Cancellation: the create and the exit write run in tasks owned by the
backend and are waited for to the end; a create cancelled in flight is
undone (deleted at its version) before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, final

from .clock import monotonic, wall
from .coordination import dumps, finish, store_of
from .errors import AccessDeniedError, BackendUnavailableError, LockLostError
from .tasks import wait_finished
from .timeouts import LEASE_TIME_RANGE, check_seconds

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Once", "check_periods"]

logger = logging.getLogger("aiolocks")

#: the shortest expiry written (Redis counts whole milliseconds); a shorter
#: rest of ``at_least_for`` is rounded up to it, never down to nothing
_SHORTEST_TTL = 0.01

#: a run is told it lost the job this share of ``at_most_for`` (at most
#: ``_EARLY_MAX`` seconds) before its record can expire on the server, so
#: the loss is known before another process can take the job
_EARLY = 0.02
_EARLY_MAX = 0.5


def check_periods(at_most_for: object, at_least_for: object) -> tuple[float, float]:
    """``(at_most_for, at_least_for)`` as seconds, or ``ValueError`` before any I/O.

    ``at_most_for`` is a lease time (10 ms to a day); ``at_least_for`` is 0
    or more and at most ``at_most_for``, as ShedLock requires of
    ``lockAtLeastFor`` and ``lockAtMostFor``.
    """
    most = check_seconds(at_most_for, "at_most_for", LEASE_TIME_RANGE)
    if at_least_for == 0 and not isinstance(at_least_for, bool):
        return most, 0.0
    least = check_seconds(at_least_for, "at_least_for", (0.0, LEASE_TIME_RANGE[1]))
    if least > most:
        raise ValueError(
            f"at_least_for={at_least_for!r} must not exceed at_most_for={at_most_for!r} "
            "(the job is held at most at_most_for after a crash, so at least cannot be more)"
        )
    return most, least


@dataclass(eq=False)
class _Run:
    """One run of the body: what the exit needs and what a loss cancels."""

    task: asyncio.Task[object]
    started: float
    version: int
    value: bytes
    baseline: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    keeper: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    lost: str | None = None
    loss_cancelled: bool = False
    exiting: bool = False


@final
class Once:
    """A job that at most one process runs per period, and that never waits.

    >>> job = backend.once("jobs/report", at_most_for=600, at_least_for=50)  # doctest: +SKIP
    >>> async with job as ran:  # doctest: +SKIP
    ...     if ran:
    ...         await build_report()

    ``ran`` is ``False`` when another process holds the job: the body runs
    anyway and should do nothing. After a run the job stays taken until
    ``at_least_for`` seconds after its start, by the server's clock, so
    replicas firing a few seconds apart (or with skewed clocks) run it once
    per period. A process that crashes mid-run frees the job
    ``at_most_for`` seconds after its last renewal; a live body is renewed
    as long as it runs unless ``hard_bound=True`` (then it is cancelled
    when ``at_most_for`` passes). See ``docs/jobs.md``.

    One object runs one block at a time (not reentrant); it can be reused.

    :raises LockLostError: out of the block, when the job's record was lost
        while the body ran (the body was cancelled), or ``hard_bound``
        passed.
    :raises BackendUnavailableError: the server cannot be reached to start.
    :raises NotImplementedError: (at construction) the backend has no
        record store.
    """

    __slots__ = ("_at_least_for", "_at_most_for", "_engine", "_hard", "_key", "_name", "_runs")

    def __init__(
        self,
        engine: Engine,
        name: str,
        at_most_for: float,
        at_least_for: float,
        hard_bound: bool,
    ) -> None:
        canonical = engine.validate_name(name)
        self._at_most_for, self._at_least_for = check_periods(at_most_for, at_least_for)
        if not isinstance(hard_bound, bool):
            raise TypeError(f"hard_bound must be a bool, got {hard_bound!r}")
        store_of(engine, f"once({name!r})")
        self._engine = engine
        self._name = name
        self._key = f"once/{canonical}/lock"
        self._hard = hard_bound
        #: the runs of this object's blocks, by the task running each block
        self._runs: dict[asyncio.Task[object], _Run] = {}

    @property
    def name(self) -> str:
        """The name this job was created with."""
        return self._name

    @property
    def at_most_for(self) -> float:
        """Seconds a crashed run keeps the job (and a ``hard_bound`` body may run)."""
        return self._at_most_for

    @property
    def at_least_for(self) -> float:
        """Seconds after its start that a run keeps the job, however short the body."""
        return self._at_least_for

    def __repr__(self) -> str:
        state = " running" if self._runs else ""
        return (
            f"<Once {self._name!r} at_most_for={self._at_most_for:g} "
            f"at_least_for={self._at_least_for:g}{state}>"
        )

    async def __aenter__(self) -> bool:
        engine = self._engine
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError(f"once {self._name!r} must be entered inside an asyncio task")
        if task in self._runs:
            raise RuntimeError(f"once {self._name!r}: this task already runs its block")
        engine.check_open()
        await engine.open()
        store = store_of(engine, "once")
        value = dumps(
            {
                "holder": engine.client_id,
                "started_at": wall(),
                "at_most_for": self._at_most_for,
                "at_least_for": self._at_least_for,
            }
        )
        started = monotonic()  # before the create is sent: the period is never cut short
        attempt, cancelled = await finish(
            engine,
            store.create(self._key, value, ttl=self._at_most_for),
            name=f"aiolocks-once-create:{self._key}",
        )
        if cancelled is not None:
            if not attempt.cancelled() and attempt.exception() is None:
                version = attempt.result()
                if version is not None:  # the server took it: give it back
                    await self._write_quietly(store.delete(self._key, version=version))
            raise cancelled
        version = attempt.result()
        if version is None:
            return False
        run = _Run(task, started, version, value, task.cancelling())
        self._runs[task] = run
        if self._hard:
            loop = asyncio.get_running_loop()
            left = self._at_most_for - (monotonic() - started)
            run.timer = loop.call_later(
                max(0.0, left), self._lose, run, f"at_most_for ({self._at_most_for:g} s) passed"
            )
        run.keeper = engine.spawn(self._keep(run), name=f"aiolocks-once-keep:{self._key}")
        return True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = asyncio.current_task()
        run = None if task is None else self._runs.pop(task, None)
        if run is None:
            return  # the job was not ours: nothing to give back
        run.exiting = True
        outcome = await self._settle(run, exc)
        cancelled = await self._stop_keeping(run)
        if self._hard and run.lost is None and monotonic() - run.started >= self._at_most_for:
            self._lose(run, f"the body outlived at_most_for ({self._at_most_for:g} s)")
        if run.lost is None:
            cancelled = await self._leave(run) or cancelled
        if outcome == "cancelled":
            if isinstance(exc, asyncio.CancelledError):
                return
            raise asyncio.CancelledError
        if cancelled is not None:
            raise cancelled
        if run.lost is not None:
            raise LockLostError(
                f"once {self._name!r} was lost while the block ran ({run.lost})"
            ) from exc

    async def _settle(self, run: _Run, exc: BaseException | None) -> str:
        """Withdraw our loss cancellation as ``asyncio.timeout()`` does: held, lost or cancelled."""
        if not run.loss_cancelled:
            return "held"
        task = run.task
        if task.uncancel() > run.baseline:
            return "cancelled"
        if not isinstance(exc, asyncio.CancelledError):
            # The body ended before our cancellation reached it: absorb it
            # here, rather than let it hit an unrelated await later.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                if task.cancelling() > run.baseline:
                    return "cancelled"
        return "lost"

    async def _stop_keeping(self, run: _Run) -> asyncio.CancelledError | None:
        """Stop renewals; a renewal in flight is let finish, so its new version is known."""
        if run.timer is not None:
            run.timer.cancel()
        run.stop.set()
        keeper = run.keeper
        if keeper is None:
            return None
        return await wait_finished(keeper)

    async def _leave(self, run: _Run) -> asyncio.CancelledError | None:
        """The exit write: keep the record until ``at_least_for`` after the start, or delete it."""
        store = store_of(self._engine, "once")
        rest = self._at_least_for - (monotonic() - run.started)
        if rest > 0:
            write = store.update(
                self._key, run.value, version=run.version, ttl=max(rest, _SHORTEST_TTL)
            )
        else:
            write = store.delete(self._key, version=run.version)
        attempt, cancelled = await finish(
            self._engine, write, name=f"aiolocks-once-exit:{self._key}"
        )
        if attempt.cancelled():
            return cancelled
        error = attempt.exception()
        if isinstance(error, BackendUnavailableError | AccessDeniedError):
            # The record keeps its last expiry, at least at_most_for after the
            # start (>= at_least_for): the period is longer, never shorter.
            logger.warning(
                "once %r: could not shorten the job's record on exit (it expires "
                "at_most_for after its last renewal): %s",
                self._name,
                error,
            )
        elif error is not None:
            raise error
        elif attempt.result() in (None, False):
            self._lose(run, "its record was gone or taken when the block ended")
        return cancelled

    async def _keep(self, run: _Run) -> None:
        """Rewrite the record every third of ``at_most_for`` while the body runs.

        With ``hard_bound`` nothing is renewed; the task only waits, so that
        the backend's ``close()`` (which cancels it) is a loss like any other.
        """
        try:
            if self._hard:
                await run.stop.wait()
            else:
                await self._renew(run)
        except asyncio.CancelledError:
            if not run.stop.is_set():  # not our exit: the backend is closing
                self._lose(run, "the backend was closed")
            raise
        except Exception as exc:  # a loss is never silent, whatever the store raised
            self._lose(run, f"renewing failed: {exc!r}")

    async def _renew(self, run: _Run) -> None:
        store = store_of(self._engine, "once")
        most = self._at_most_for
        valid_until = run.started + most
        while not run.stop.is_set():
            pause = min(most / 3, max(0.0, (valid_until - monotonic()) / 2))
            try:
                await asyncio.wait_for(run.stop.wait(), pause)
                return
            except TimeoutError:
                pass
            sent = monotonic()
            # The record may expire on the server at valid_until (counted from
            # before our last write was sent): a renewal without an answer by
            # then is given up, and the body told, before anybody else can
            # take the job. A partition must not leave us believing.
            deadline = valid_until - min(most * _EARLY, _EARLY_MAX)
            try:
                async with asyncio.timeout(max(0.0, deadline - sent)):
                    version = await store.update(
                        self._key, run.value, version=run.version, ttl=most
                    )
            except (BackendUnavailableError, AccessDeniedError, TimeoutError) as exc:
                if monotonic() >= deadline:
                    self._lose(run, f"it could not be renewed in time: {exc!r}")
                    return
                continue
            if version is None:
                self._lose(run, "its record expired or was deleted or taken behind our back")
                return
            run.version = version
            valid_until = sent + most

    def _lose(self, run: _Run, reason: str) -> None:
        """The job's record is no longer ours: cancel the body (once) and say why."""
        if run.lost is not None:
            return
        run.lost = reason
        logger.warning(
            "once %r lost its hold: %s",
            self._name,
            reason,
            extra={"aiolocks_event": "lost", "aiolocks_lock": self._name, "aiolocks_kind": "once"},
        )
        if not run.exiting and not run.task.done():
            run.loss_cancelled = True
            run.task.cancel(f"aiolocks: once {self._name!r} was lost")

    async def _write_quietly(self, write: Coroutine[Any, Any, object]) -> None:
        """Undo a write whose caller was cancelled; errors are logged (the ttl bounds it)."""
        attempt, _ = await finish(self._engine, write, name=f"aiolocks-once-undo:{self._key}")
        if not attempt.cancelled() and attempt.exception() is not None:
            logger.warning(
                "once %r: undoing a cancelled start failed: %s", self._name, attempt.exception()
            )
