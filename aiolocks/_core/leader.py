"""LeaderLatch (Curator's LeaderLatch), built once on any driver.

A started latch is a participant that queues for an exclusive hold of
``Family.LEADER``: a ZooKeeper ephemeral-sequential node, a Redis leased key
kept alive by the watchdog, a memory queue entry. The head of the queue is
the leader. A background task owned by the backend runs the loop
"acquire -> lead until the hold is lost or the latch is closed -> release
-> queue again", so a leader that loses its session or lease steps down and
the next participant takes over; a newcomer never pre-empts a live leader.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, final

from .driver import Family, Grant, Mode, Request
from .errors import BackendUnavailableError
from .hold import Hold
from .names import has_control_character
from .participants import Participant
from .tasks import wait_finished
from .timeouts import check_timeout

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["LeaderLatch"]

logger = logging.getLogger("aiolocks")


@final
class LeaderLatch:
    """Leader election among the started latches of one name.

    >>> latch = backend.leader_latch("leaders/cron", participant_id="host-a")  # doctest: +SKIP
    >>> async with latch:  # start() ... close()  # doctest: +SKIP
    ...     if await latch.wait_for_leadership(timeout=30):
    ...         ...

    Exactly one started latch per name has leadership at a time. When the
    leader closes or loses its session/lease, the next one takes over.
    ``has_leadership`` turns false as soon as a loss is detected (a warning
    is logged); the latch then queues again by itself.

    :raises RuntimeError: ``start()`` on a latch that was already started.
    """

    def __init__(
        self,
        engine: Engine,
        name: str,
        participant_id: str | None,
        options: Mapping[str, object],
    ) -> None:
        if participant_id is None:
            participant_id = uuid.uuid4().hex
        elif (
            not isinstance(participant_id, str)
            or not participant_id
            or len(participant_id.encode("utf-8", "surrogatepass")) > 1024
            or has_control_character(participant_id)
        ):
            raise ValueError(
                f"leader latch {name!r}: participant_id must be a non-empty str of at most "
                f"1024 bytes without control characters, got {participant_id!r}"
            )
        self._name = name
        self._key = engine.validate_name(name)
        self._engine = engine
        self._participant_id = participant_id
        self._options = engine.lock_options(Family.LEADER, options)
        self._hold: Hold | None = None
        self._runner: asyncio.Task[None] | None = None
        self._leading = asyncio.Event()
        self._state = "latent"  # latent -> started -> closed

    @property
    def name(self) -> str:
        """The name this latch was created with."""
        return self._name

    @property
    def participant_id(self) -> str:
        """This participant's id (a uuid unless given)."""
        return self._participant_id

    @property
    def has_leadership(self) -> bool:
        """This latch leads now."""
        hold = self._hold
        return hold is not None and hold.grant.verify()

    @property
    def fencing_token(self) -> int | None:
        """Token of the current leadership term; ``None`` when not leading."""
        hold = self._hold
        return None if hold is None or hold.lost else hold.token

    @property
    def is_started(self) -> bool:
        """``start()`` was called and ``close()`` was not."""
        return self._state == "started"

    def __repr__(self) -> str:
        role = "leader" if self.has_leadership else self._state
        return f"<LeaderLatch {self._name!r} id={self._participant_id!r} {role}>"

    async def start(self) -> None:
        """Join the election; returns at once (leadership comes later)."""
        if self._state != "latent":
            raise RuntimeError(f"leader latch {self._name!r} was already {self._state}")
        self._engine.check_open()
        await self._engine.open()
        self._state = "started"
        self._engine.latches.add(self)
        self._runner = self._engine.spawn(
            self._run(), name=f"aiolocks-leader:{self._key}:{self._participant_id}"
        )

    async def close(self) -> None:
        """Leave the election, giving up leadership; idempotent; completes even if cancelled."""
        if self._state == "closed":
            return
        self._state = "closed"
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            cancelled = await wait_finished(runner)
            if cancelled is not None:
                raise cancelled

    def stop_on_close(self) -> None:
        """The backend is closing: stop leading without awaiting."""
        self._state = "closed"
        if self._runner is not None:
            self._runner.cancel()
            self._runner = None

    async def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Wait until this latch leads; ``False`` when ``timeout`` passed first.

        :raises RuntimeError: the latch is not started.
        """
        seconds = check_timeout(timeout)
        if self._state != "started":
            raise RuntimeError(f"leader latch {self._name!r} is {self._state}, not started")
        try:
            async with asyncio.timeout(seconds):
                while not self._leads():
                    await self._leading.wait()
                    if not self._leads():
                        self._leading.clear()
        except TimeoutError:
            return self._leads()
        return True

    def _leads(self) -> bool:
        hold = self._hold
        return hold is not None and not hold.lost

    async def leader(self) -> Participant | None:
        """The current leader, or ``None`` when nobody has started."""
        for participant in await self.participants():
            if participant.is_holder:
                return participant
        return None

    async def participants(self) -> list[Participant]:
        """Every started latch of this name, the leader first."""
        return await self._engine.participants(Family.LEADER, self._key)

    async def __aenter__(self) -> LeaderLatch:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _run(self) -> None:
        engine = self._engine
        request = Request(
            name=self._key,
            family=Family.LEADER,
            mode=Mode.EXCLUSIVE,
            participant=self._participant_id,
            options=self._options,
        )
        while True:
            try:
                grants = await engine.acquire(request, None)
            except BackendUnavailableError as exc:
                if engine.closed:
                    return
                logger.warning("leader latch %r: cannot reach %s: %s", self._name, engine.url, exc)
                await asyncio.sleep(1.0)
                continue
            if not grants:
                continue
            # Leadership is a hold like any other: "lost", "renewed" and
            # "released" events, and close() releases it.
            hold = Hold(engine, grants[0], kind="leader latch", owner=None)
            lost = asyncio.Event()
            hold.grant.add_loss_listener(_setter(lost))
            self._hold = hold
            self._leading.set()
            try:
                await lost.wait()
                logger.warning(
                    "leader latch %r (%s) lost leadership: %s",
                    self._name,
                    self._participant_id,
                    hold.grant.lost_reason,
                )
            finally:
                self._hold = None
                self._leading.clear()
                try:
                    await engine.release(hold)
                except Exception as exc:
                    logger.warning("leader latch %r: releasing failed: %s", self._name, exc)


def _setter(event: asyncio.Event) -> Callable[[Grant], None]:
    def set_event(_: Grant) -> None:
        event.set()

    return set_event
