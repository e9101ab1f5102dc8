"""The lease watchdog: timers per hold, renewals that come due together in one round trip.

Redisson's watchdog, with the holes its users fell into closed:

* A renewal that finds the hold gone (deleted, overwritten, taken, lapsed)
  marks the grant lost at once (``grant.mark_lost``), so the core cancels
  the ``async with`` body and raises ``LockLostError``. A renewal error is a
  loss signal, not a log line.
* Transient errors are retried quickly, but the hold is only trusted until
  ``valid_until`` = the time the last *successful* renewal (or the acquire)
  was *sent* + lease: past that, another client may hold the lock, so the
  hold is declared lost even if Redis never answered.
* ``release`` stops the hold's :class:`Renewal` synchronously before it
  sends the unlock; a renewal already on the wire cannot resurrect the lease
  because ``renew.lua`` only extends a field that still exists (Redisson
  #7272), and its answer is ignored once stopped.
* When the owner task has ended without releasing, renewing stops and the
  lease lapses (the core also releases such orphans at once).
* With ``watchdog=False`` nothing is renewed: the hold is marked lost when
  its lease runs out, because past that point it protects nothing.

Cost: a hold costs one timer, not a task; a hold shorter than a third of
its lease never renews and never creates a task. When timers fire, the due
holds join a batch that one task sends (a pipeline on one server): 10,000
held locks cost a few round trips per second, not 3,000 tasks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.errors import BackendUnavailableError
from ._access import SERVED_LATER

__all__ = ["TRANSIENT", "Renewal", "RenewResult", "Vouched", "Watchdog"]

TRANSIENT = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    BackendUnavailableError,
    *SERVED_LATER,
)

#: what renewing one hold gave: ``None`` renewed, a string the reason the hold
#: is gone, an exception (transient: retry soon; otherwise: lost)
RenewResult = str | BaseException | None

#: the most renewals sent in one round trip
MAX_BATCH = 512


class Vouched(Protocol):
    """What a renewal keeps alive: a lock's ``Grant``, or a record's lease
    (``_records.py``): how long it is vouched for, and its loss flag."""

    valid_until: float | None

    def mark_lost(self, reason: str) -> None:
        """The server no longer has it."""

    def note_renewed(self) -> None:
        """A renewal succeeded."""


class Renewal:
    """The watchdog's record of one hold: its timer and how long it is vouched for."""

    __slots__ = (
        "drift",
        "enabled",
        "grant",
        "interval",
        "lease",
        "owner",
        "payload",
        "stopped",
        "timer",
        "valid_until",
    )

    def __init__(
        self,
        grant: Vouched,
        payload: Any,
        *,
        lease: float,
        valid_until: float,
        enabled: bool,
        owner: asyncio.Task[object] | None,
        drift: float = 0.0,
    ) -> None:
        """``valid_until``: when the acquire stops vouching for the hold;
        ``drift`` is subtracted from every later one (Redlock's clock-drift
        allowance)."""
        self.grant = grant
        #: what the renew function needs (the driver's hold)
        self.payload = payload
        self.lease = lease
        self.interval = lease / 3
        self.valid_until = valid_until
        self.enabled = enabled
        self.owner = owner
        self.drift = drift
        self.stopped = False
        self.timer: asyncio.TimerHandle | None = None

    def stop(self) -> None:
        """Stop renewing, synchronously (before any unlock is sent)."""
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _lose(self, reason: str) -> None:
        self.stop()
        self.grant.mark_lost(reason)


class Watchdog:
    """Keeps the holds of one backend alive until they are stopped.

    :param renew_many: renews the given holds in one go and returns one
        :data:`RenewResult` per hold, in order; it raises a transient error
        when the server could not say anything at all
    :param spawn: starts an owned task (the driver's, awaited on close)
    """

    def __init__(
        self,
        renew_many: Callable[[Sequence[Renewal]], Awaitable[Sequence[RenewResult]]],
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
        *,
        name: str,
    ) -> None:
        self._renew_many = renew_many
        self._spawn = spawn
        self._name = name
        self._due: list[Renewal] = []
        self._sender: asyncio.Task[None] | None = None
        self._closed = False

    def watch(self, renewal: Renewal) -> Renewal:
        """Start keeping ``renewal.grant`` alive (until ``renewal.stop()``)."""
        if renewal.enabled:
            self._schedule(renewal, renewal.valid_until - renewal.lease + renewal.interval)
        else:
            self._schedule(renewal, renewal.valid_until)
        return renewal

    def close(self) -> None:
        """Schedule nothing more (the driver stops its holds); the sender is the driver's task."""
        self._closed = True
        for renewal in self._due:
            renewal.stop()
        self._due.clear()

    # -- timers ------------------------------------------------------------------

    def _schedule(self, renewal: Renewal, when: float) -> None:
        if renewal.stopped or self._closed:
            return
        # call_later, not call_at: the loop's clock need not be time.monotonic().
        delay = max(0.0, when - time.monotonic())
        renewal.timer = asyncio.get_running_loop().call_later(delay, self._fire, renewal)

    def _fire(self, renewal: Renewal) -> None:
        renewal.timer = None
        if renewal.stopped or self._closed:
            return
        if not renewal.enabled:
            renewal._lose(f"its lease of {renewal.lease:g} s ran out (watchdog=False)")
            return
        owner = renewal.owner
        if owner is not None and owner.done():
            # The owner ended without releasing: stop renewing so the lease
            # lapses even if nobody ever calls release.
            renewal.stop()
            return
        self._due.append(renewal)
        if self._sender is None or self._sender.done():
            self._sender = self._spawn(self._send_due(), self._name)

    # -- renewing ----------------------------------------------------------------

    async def _send_due(self) -> None:
        # Timers that fire in the same loop pass are all queued before this
        # task first runs; under load the batches grow by themselves.
        while self._due:
            due, self._due = self._due, []
            live = [r for r in due if not r.stopped]
            for start in range(0, len(live), MAX_BATCH):
                await self._renew(live[start : start + MAX_BATCH])

    def _retry_soon(self, renewal: Renewal) -> None:
        # valid_until still bounds how long the hold is trusted.
        self._schedule(renewal, time.monotonic() + min(renewal.interval / 4, 0.25))

    async def _renew(self, batch: list[Renewal]) -> None:
        sent = time.monotonic()
        live: list[Renewal] = []
        for renewal in batch:
            if renewal.stopped:
                continue
            if sent >= renewal.valid_until:
                renewal._lose(f"no successful renewal within its lease of {renewal.lease:g} s")
                continue
            live.append(renewal)
        if not live:
            return
        try:
            async with asyncio.timeout(min(r.valid_until for r in live) - sent):
                results = await self._renew_many(live)
        except TimeoutError:
            now = time.monotonic()
            for renewal in live:
                if renewal.stopped:
                    continue
                if now >= renewal.valid_until:
                    renewal._lose(
                        f"Redis did not confirm a renewal within its lease of {renewal.lease:g} s"
                    )
                else:
                    self._retry_soon(renewal)
            return
        except TRANSIENT:
            for renewal in live:
                self._retry_soon(renewal)
            return
        except RedisError as exc:
            # WRONGTYPE (key overwritten with another type) and the like.
            for renewal in live:
                if not renewal.stopped:
                    renewal._lose(f"renewal failed: {exc}")
            return
        for renewal, result in zip(live, results, strict=True):
            if renewal.stopped:
                continue  # released meanwhile: the answer means nothing now
            if result is None:
                renewal.valid_until = sent + renewal.lease - renewal.drift
                renewal.grant.valid_until = renewal.valid_until
                renewal.grant.note_renewed()
                self._schedule(renewal, sent + renewal.interval)
            elif isinstance(result, TRANSIENT):
                self._retry_soon(renewal)
            elif isinstance(result, BaseException):
                renewal._lose(f"renewal failed: {result}")
            else:
                renewal._lose(result)
