"""One pub/sub connection per backend, fanning unlock messages out to waiters.

Redisson's idea, asyncio-shaped: a waiter that lost the first try asks the
hub for a subscription to its lock's channel, *waits until the server has
confirmed the SUBSCRIBE* (so an unlock published between its next try and
its wait cannot be missed), tries again, then waits on a :class:`Wake`
for a message or for the holder's remaining TTL, whichever comes first.

* Subscriptions are ref-counted per channel; the last waiter to leave sends
  UNSUBSCRIBE (always, on every exit path: Redisson #4064).
* SUBSCRIBE/UNSUBSCRIBE are sent by one commander task, fed by a queue, so a
  cancelled waiter never interrupts a command half-way; the reader task is
  the only one reading the connection.
* Pub/sub is an optimisation, never the only wake-up: a reconnect (messages
  may be lost) or a connection error wakes every waiter so it looks again,
  and every wait is bounded by the blocking hold's TTL anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import final

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.backoff import Backoff
from .._core.errors import BackendUnavailableError
from .._core.tasks import wait_done
from ._access import denied
from ._client import RedisPubSub

__all__ = ["WATCH_LINGER", "PubSubHub", "Wake"]

#: how long a watched channel stays subscribed after its last listener left (s)
WATCH_LINGER = 10.0

logger = logging.getLogger("aiolocks.redis")


@final
class Wake:
    """One waiter's doorbell: set by a message (or a reconnect), cleared before each try.

    An ``exclusive`` waiter (an unfair mutex: one release frees one slot) is
    rung one at a time per message, so N local waiters do not all retry on
    every release (Redisson's "wake one per process"). Set ``won`` before
    leaving with the lock; a waiter leaving without it passes its turn on.
    """

    __slots__ = ("_future", "_rung", "_timer", "counted", "exclusive", "member", "won")

    def __init__(
        self, *, exclusive: bool = False, member: str | None = None, counted: bool = False
    ) -> None:
        # A flag and, only while somebody waits, one future and its timer: a
        # waiting task costs no Event (with its deque), no timeout context
        # manager and no coroutine of its own (see :meth:`prepare`).
        self._rung = False
        self._future: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.exclusive = exclusive
        #: our entry in the lock's waiter queue: a message naming it rings us alone
        self.member = member
        #: a waiter for one semaphore lease: ``released <n>`` (n holds freed)
        #: rings at most n such waiters here, oldest first
        self.counted = counted
        self.won = False

    def is_set(self) -> bool:
        """Rung and not yet cleared."""
        return self._rung

    def clear(self) -> None:
        """Forget earlier rings; call this *before* sending a try."""
        self._rung = False

    def ring(self) -> None:
        self._rung = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def prepare(self, timeout: float | None) -> asyncio.Future[None] | None:
        """A future done at the next ring or after ``timeout`` s; ``None`` if rung already.

        Await it, then call :meth:`settle` (in a ``finally``).
        """
        if self._rung:
            return None
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        if timeout is not None:
            self._timer = loop.call_later(timeout, _time_up, future)
        return future

    def settle(self) -> None:
        """The wait is over (rung, timed out or cancelled): drop the future and timer."""
        self._future = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def wait(self, timeout: float | None) -> bool:
        """Wait for a ring or ``timeout`` seconds; True if rung."""
        future = self.prepare(timeout)
        if future is None:
            return True
        try:
            await future
        finally:
            self.settle()
        return self._rung


def _time_up(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Channel:
    __slots__ = ("linger", "listeners", "ready", "wakes")

    def __init__(self) -> None:
        # insertion-ordered: exclusive waiters are rung oldest first
        self.wakes: dict[Wake, None] = {}
        #: called with each message, and with None on every (re)subscription
        #: (messages may have been lost): keyspace events
        self.listeners: dict[Callable[[str | None], None], None] = {}
        #: a watched channel stays subscribed a while after its last listener
        self.linger = False
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def ring_all(self) -> None:
        """Everybody looks again (reconnects, errors, close)."""
        for wake in self.wakes:
            wake.ring()
        self.notify(None)

    def notify(self, payload: str | None) -> None:
        """Call the listeners (they only schedule work, never block)."""
        for listener in list(self.listeners):
            listener(payload)

    def ring_message(self, payload: str) -> None:
        """An unlock addressed to a queue member rings that waiter only (if it is ours).

        Otherwise (``released`` or ``released <n>``: nobody queued): every
        shared waiter, but only ``n`` one-lease waiters not rung yet, and
        one exclusive waiter unless one is already rung.
        """
        self.notify(payload)
        verb, _, count = payload.partition(" ")
        if verb != "released":
            for wake in self.wakes:
                if wake.member == payload:
                    wake.ring()
                    return
            return
        budget = int(count) if count.isdigit() else len(self.wakes)
        pending = False
        first: Wake | None = None
        for wake in self.wakes:
            if wake.counted:
                # a freed hold for each of n waiters not rung yet
                if budget > 0 and not wake.is_set():
                    budget -= 1
                    wake.ring()
            elif not wake.exclusive:
                wake.ring()
            elif wake.is_set():
                pending = True
            elif first is None:
                first = wake
        if first is not None and not pending:
            first.ring()

    def pass_turn(self, counted: bool = False) -> None:
        """An exclusive (or one-lease) waiter left without the lock: ring the next one."""
        if counted:
            for wake in self.wakes:
                if wake.counted and not wake.is_set():
                    wake.ring()
                    return
            return
        for wake in self.wakes:
            # a queued waiter's turn is passed on by the server (release.lua)
            if wake.exclusive and wake.member is None and not wake.is_set():
                wake.ring()
                return


@final
class PubSubHub:
    """Per-channel waiters over a single ``PubSub`` connection (:class:`~._client.RedisPubSub`)."""

    def __init__(
        self, make_pubsub: Callable[[], RedisPubSub], *, describe: str, timeout: float
    ) -> None:
        self._make_pubsub = make_pubsub
        self._describe = describe
        self._timeout = timeout
        self._pubsub: RedisPubSub | None = None
        self._channels: dict[str, _Channel] = {}
        # SUBSCRIBEs sent per channel and not yet confirmed: a confirmation only
        # makes a channel ready once every SUBSCRIBE sent for it is answered,
        # so an old confirmation cannot vouch for a newer subscription.
        self._unconfirmed: dict[str, int] = {}
        self._commands: asyncio.Queue[tuple[str, tuple[str, ...]]] = asyncio.Queue()
        self._commander: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._closed = False

    @property
    def channel_count(self) -> int:
        """How many channels have local waiters (for tests: 0 once quiet)."""
        return len(self._channels)

    @contextlib.asynccontextmanager
    async def listen(self, channel: str, wake: Wake | None = None) -> AsyncIterator[Wake]:
        """Subscribe to ``channel`` (ref-counted) and yield a :class:`Wake` once confirmed.

        Pass ``wake`` to share one doorbell between several hubs (Redlock).
        """
        wake = Wake() if wake is None else wake
        self.attach(channel, wake)
        try:
            await self.confirmed(channel)
            yield wake
        finally:
            self.detach(channel, wake)

    def attach(self, channel: str, wake: Wake, companion: str | None = None) -> None:
        """Ring ``wake`` on messages of ``channel`` from now on; subscribes if needed. No I/O.

        ``companion``: a channel to :meth:`watch` later (the lock's keyspace
        events once the waiter holds it), subscribed in the same SUBSCRIBE.
        """
        if self._closed:
            raise BackendUnavailableError(f"the Redis backend {self._describe} is closed")
        self._start()
        entry = self._channels.get(channel)
        if entry is None:
            entry = self._channels[channel] = _Channel()
            channels = [channel]
            if companion is not None and companion not in self._channels:
                extra = self._channels[companion] = _Channel()
                extra.linger = True
                self._drop_if_idle(companion, extra)  # lingers, then goes unless watched
                channels.append(companion)
            self._commands.put_nowait(("subscribe", tuple(channels)))
        entry.wakes[wake] = None

    async def confirmed(self, channel: str) -> None:
        """Wait until the server confirmed the subscription of ``channel`` (after attach)."""
        entry = self._channels.get(channel)
        if entry is None:
            return
        # Several waiters share the future: waiting never cancels it (a
        # cancelled waiter leaves it to the others).
        if not await wait_done(entry.ready, self._timeout):
            raise BackendUnavailableError(
                f"Redis {self._describe} did not confirm a SUBSCRIBE within {self._timeout:g} s"
            )
        entry.ready.result()  # the subscription's error, if it failed

    def is_confirmed(self, channel: str) -> bool:
        """``channel`` is subscribed and the server confirmed it (no I/O)."""
        entry = self._channels.get(channel)
        return (
            entry is not None
            and entry.ready.done()
            and not entry.ready.cancelled()
            and entry.ready.exception() is None
        )

    def watch(self, channel: str, listener: Callable[[str | None], None]) -> None:
        """Call ``listener(message)`` on every message of ``channel``, and
        ``listener(None)`` after every (re)subscription (messages may have been
        lost); subscribes if needed. No I/O.

        The subscription outlives the last listener by ``WATCH_LINGER``
        seconds, so a lock taken again and again costs no SUBSCRIBE and
        UNSUBSCRIBE per hold."""
        if self._closed:
            return
        self._start()
        entry = self._channels.get(channel)
        if entry is None:
            entry = self._channels[channel] = _Channel()
            self._commands.put_nowait(("subscribe", (channel,)))
        entry.listeners[listener] = None
        entry.linger = True

    def nudge_listeners(self) -> None:
        """Call every listener with None, as after a resubscription (they look again). No I/O."""
        for entry in list(self._channels.values()):
            entry.notify(None)

    def unwatch(self, channel: str, listener: Callable[[str | None], None]) -> None:
        """Stop calling ``listener``; unsubscribes when nobody is left. No I/O; idempotent."""
        entry = self._channels.get(channel)
        if entry is None or listener not in entry.listeners:
            return
        del entry.listeners[listener]
        self._drop_if_idle(channel, entry)

    def drop_idle(self, channel: str) -> None:
        """Unsubscribe ``channel`` now if it only lingers (nobody listens). No I/O."""
        entry = self._channels.get(channel)
        if entry is not None and not self._closed:
            self._drop_if_idle(channel, entry, now=True)

    def _linger_over(self, channel: str, entry: _Channel) -> None:
        if self._channels.get(channel) is entry and not self._closed:
            self._drop_if_idle(channel, entry, now=True)

    def detach(self, channel: str, wake: Wake) -> None:
        """Stop ringing ``wake``; unsubscribes when it was the last one. No I/O; idempotent."""
        entry = self._channels.get(channel)
        if entry is None or wake not in entry.wakes:
            return
        del entry.wakes[wake]
        if wake.exclusive and not wake.won:
            # It may have used up the only ring of an unlock (cancelled,
            # timed out, failed): let the next local waiter look instead.
            entry.pass_turn()
        elif wake.counted and (not wake.won or wake.is_set()):
            # the same for a one-lease waiter; one that won while rung again
            # (during its try) leaves that ring unused: pass it on
            entry.pass_turn(counted=True)
        self._drop_if_idle(channel, entry)

    def _drop_if_idle(self, channel: str, entry: _Channel, *, now: bool = False) -> None:
        if entry.wakes or entry.listeners:
            return
        if entry.linger and not now and not self._closed:
            asyncio.get_running_loop().call_later(WATCH_LINGER, self._linger_over, channel, entry)
            return
        del self._channels[channel]
        if not entry.ready.done():
            entry.ready.cancel()
        if not self._closed:
            self._commands.put_nowait(("unsubscribe", (channel,)))

    def _start(self) -> None:
        if self._commander is None:
            self._commander = asyncio.get_running_loop().create_task(
                self._command_loop(), name=f"aiolocks-redis-pubsub-commands:{self._describe}"
            )

    async def _command_loop(self) -> None:
        """Send SUBSCRIBE/UNSUBSCRIBE in order; the only writer of the connection."""
        while not self._closed:
            verb, wanted = await self._commands.get()
            if verb == "stop":
                return
            if verb == "subscribe":
                # not those everybody left before we got to them
                channels = [c for c in wanted if c in self._channels]
                for channel in channels:
                    self._unconfirmed[channel] = self._unconfirmed.get(channel, 0) + 1
            else:
                # not those somebody came back to: keep the subscription
                channels = [c for c in wanted if c not in self._channels]
            if not channels:
                continue
            try:
                if self._pubsub is None:
                    self._pubsub = self._make_pubsub()
                # Bounded here: these writes read no reply in between, so a
                # stalled server could fill the stream's buffer and hold a
                # write; redis-py drops the connection a timed-out write was
                # on, and re-subscribes on the next one.
                async with asyncio.timeout(self._timeout):
                    if verb == "subscribe":
                        await self._pubsub.subscribe(*channels)
                    else:
                        await self._pubsub.unsubscribe(*channels)
            except TimeoutError:
                exc = BackendUnavailableError(f"no answer within {self._timeout:g} s")
                for channel in channels:
                    self._command_failed(verb, channel, exc)
                continue
            except Exception as exc:  # any failure: tell the waiters, keep serving
                for channel in channels:
                    self._command_failed(verb, channel, exc)
                continue
            if self._reader is None:
                self._reader = asyncio.get_running_loop().create_task(
                    self._read_loop(), name=f"aiolocks-redis-pubsub-reader:{self._describe}"
                )

    def _command_failed(self, verb: str, channel: str, exc: Exception) -> None:
        """A failed SUBSCRIBE fails its waiters (they look again); an UNSUBSCRIBE is dropped."""
        if verb != "subscribe":
            return
        self._unconfirmed.pop(channel, None)
        entry = self._channels.get(channel)
        if entry is not None and not entry.ready.done():
            entry.ready.set_exception(
                denied(exc, self._describe, f"subscribing to {channel!r}")
                or BackendUnavailableError(f"cannot subscribe on Redis {self._describe}: {exc}")
            )
            entry.ready.exception()  # retrieved by whoever awaits it
            del self._channels[channel]
            entry.ring_all()

    async def _read_loop(self) -> None:
        """Turn messages into rings; the only reader of the connection."""
        backoff: Backoff | None = None  # while the connection fails
        while not self._closed:
            pubsub = self._pubsub
            assert pubsub is not None  # the reader starts once the connection is made
            try:
                message = await pubsub.get_message(timeout=None)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                # Messages may have been lost: every waiter looks again (its
                # try reports the error or the lock state). redis-py
                # re-subscribes our channels on reconnect; the confirmations
                # ring everyone once more.
                logger.debug("pub/sub connection to %s failed: %s", self._describe, exc)
                for entry in list(self._channels.values()):
                    entry.ring_all()
                if backoff is None:
                    backoff = Backoff(math.inf, first=0.05, cap=1.0)
                await backoff.wait()
                continue
            backoff = None
            if not message:
                continue
            kind = message.get("type")
            raw = message.get("channel")
            channel = raw.decode() if isinstance(raw, bytes) else str(raw)
            current = self._channels.get(channel)
            if kind == "subscribe":
                left = self._unconfirmed.get(channel, 0) - 1
                if left > 0:
                    self._unconfirmed[channel] = left
                else:
                    self._unconfirmed.pop(channel, None)
                if current is not None:
                    if left <= 0 and not current.ready.done():
                        current.ready.set_result(None)
                    current.ring_all()
            elif kind == "message" and current is not None:
                data = message.get("data")
                current.ring_message(data.decode() if isinstance(data, bytes) else str(data))

    async def close(self) -> None:
        """Stop both tasks and close the pub/sub connection (not the client)."""
        self._closed = True
        for entry in self._channels.values():
            entry.ring_all()
            if not entry.ready.done():
                entry.ready.set_exception(
                    BackendUnavailableError(f"the Redis backend {self._describe} is closed")
                )
                entry.ready.exception()  # retrieved by whoever awaits it
        self._channels.clear()
        # redis-py can swallow a cancellation that lands inside a command, so
        # the command loop is also told to stop through its queue.
        self._commands.put_nowait(("stop", ()))
        tasks = [task for task in (self._commander, self._reader) if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=5)
            for task in stuck:
                logger.warning("pub/sub task %s did not stop", task.get_name())
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
