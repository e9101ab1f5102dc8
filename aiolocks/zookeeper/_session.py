"""One ZooKeeper session as aiolocks sees it: connection states and bounded requests.

:class:`SessionMonitor` sits on our own :class:`~._connection.Session`:

* Curator's states (CONNECTED, SUSPENDED, RECONNECTED, LOST) are what lock
  users reason with; the monitor derives them from the session's reports
  (connected in session X, disconnected, expired) and the session id, so a
  reconnection into a new session is reported as LOST then RECONNECTED.
* A session learns that it expired only once it reconnects. While the
  network is partitioned another client may already hold our lock. Like the
  Java client since ZOOKEEPER-4508 and Curator's "simulated expiry", we
  declare LOST locally once we have been disconnected for a whole negotiated
  session timeout.
* :meth:`SessionMonitor.call` sends each request with one deadline bounding
  the wait for a connection and the reply; a write whose reply is lost is
  reported as ambiguous (:class:`AmbiguousResult`) instead of being re-sent;
  the caller reconciles (protected nodes, Curator's trick).
* Every waiter registers a wake-up future here, and every (re)connection
  resolves all of them: a wake-up is a hint to re-list, whatever became of
  the watches while we were away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from aiozk import exc as zk_exc

from .._core.errors import AccessDeniedError, BackendUnavailableError
from .._core.states import ConnectionState, StateFeed
from .._core.tasks import wait_done
from ._client import Link

__all__ = [
    "AmbiguousResult",
    "ConnectionState",
    "SessionChanged",
    "SessionMonitor",
]

logger = logging.getLogger("aiolocks.zookeeper")

#: errors that mean "the connection broke while the request was in flight":
#: the server may or may not have applied it.
_CONNECTION_ERRORS: Final = (
    zk_exc.ConnectError,
    zk_exc.TimeoutError,
    zk_exc.ConnectionLoss,
    ConnectionError,
    OSError,
)


#: the server's answers that refuse this client whatever it retries
_REFUSALS: Final = (zk_exc.NoAuth, zk_exc.AuthFailed)


def _denied(exc: BaseException, request: Any, link: Link) -> AccessDeniedError:
    """The :class:`AccessDeniedError` for a request the server refused (``NoAuth``...)."""
    hosts = ",".join(f"{host}:{port}" for host, port in link.hosts)
    path = getattr(request, "path", None)
    target = f" on {link.denormalize_path(path)!r}" if isinstance(path, str) else ""
    return AccessDeniedError(
        f"ZooKeeper {hosts} refused {type(request).__name__}{target}: "
        f"{type(exc).__name__} (the node's ACL does not let these credentials do it; "
        "check the user and password of the zk:// URL)"
    )


class AmbiguousResult(Exception):
    """The connection broke (or the deadline passed) after a write was sent.

    The server may or may not have applied it; the caller must find out.
    """


class SessionChanged(Exception):
    """The request was meant for a session that is no longer the current one."""


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (``None`` = unbounded), never negative."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


async def wait_future(fut: asyncio.Future[Any], deadline: float | None) -> bool:
    """Wait for ``fut`` until ``deadline``; ``True`` if it is done. Never cancels ``fut``."""
    return await wait_done(fut, remaining(deadline))


async def wait_own(fut: asyncio.Future[Any], deadline: float | None) -> bool:
    """Like :func:`wait_future` for a future only the caller waits on (a waker).

    Awaits it directly (one loop pass less per wake-up than an extra waiter
    future); a cancelled caller cancels ``fut`` too, which is fine for a
    future nobody else uses.
    """
    if fut.done():
        return True
    timeout = remaining(deadline)
    if timeout is not None and timeout <= 0:
        return False
    try:
        async with asyncio.timeout(timeout):
            await fut
    except TimeoutError:
        return fut.done()
    return True


class SessionMonitor:
    """Watches one session (it reports to the monitor); sends requests with deadlines.

    :param link: the session (:class:`~._client.Link`) that reports to this
        monitor (``link.events = monitor``)
    :param connect_timeout: how long a request may wait for a connection
        before :class:`BackendUnavailableError`
    :param suspended_is_lost: treat SUSPENDED as loss of every hold
        (Curator's ``StandardConnectionStateErrorPolicy``); default off
    :param on_lost: called with ``(session_id, reason)`` when holds of that
        session must be considered lost
    """

    def __init__(
        self,
        link: Link,
        *,
        connect_timeout: float,
        suspended_is_lost: bool,
        on_lost: Callable[[int | None, str], None],
    ) -> None:
        self.link = link
        self.connect_timeout = connect_timeout
        #: how long a sent request may wait for its reply past the deadline
        self.reply_grace = min(2.0, connect_timeout)
        self.suspended_is_lost = suspended_is_lost
        self._on_lost = on_lost
        self._wakers: set[asyncio.Future[None]] = set()
        self._waker_count = 0
        self._states: StateFeed[ConnectionState] = StateFeed()
        #: session id we consider current (None before the first connection)
        self.session_id: int | None = None
        self._suspended = False
        self._lost_locally = False
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._closed_fut: asyncio.Future[None] | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Begin reporting; the session must be connected."""
        link = self.link
        self.session_id = link.session_id
        self._closed_fut = asyncio.get_running_loop().create_future()
        link.events = self
        self._emit(ConnectionState.CONNECTED)

    async def stop(self) -> None:
        """Stop reporting (awaited by ``close()``); ends every state iterator."""
        self._closed = True
        if self.link.events is self:
            self.link.events = None
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)
        self._cancel_timer()
        self.wake_all()
        self._states.close()

    # -- what the session reports ---------------------------------------------------

    def session_connected(self, session_id: int) -> None:
        """Connected (again), in ``session_id``: RECONNECTED, after LOST if it is a new session."""
        if self._closed:
            return
        if session_id != self.session_id:
            # A new session: whatever the old one held is gone on the server.
            if not self._lost_locally:
                self._enter_suspended()
                self._declare_lost("the ZooKeeper session expired")
            self.session_id = session_id
        elif not self._suspended:
            # Not reported as down (a drop the session noticed only now).
            self._emit(ConnectionState.SUSPENDED)
        self._cancel_timer()
        self._suspended = False
        self._lost_locally = False
        self._emit(ConnectionState.RECONNECTED)
        # Watches may have fired (or been dropped) while we were away: every
        # waiter re-lists.
        self.wake_all()

    def session_disconnected(self) -> None:
        """The connection is down: SUSPENDED, and the client-side expiry timer runs."""
        if not self._closed:
            self._enter_suspended()

    def session_expired(self) -> None:
        """The server said our session is gone: LOST (a new session follows)."""
        if self._closed:
            return
        self._enter_suspended()
        if not self._lost_locally:
            self._declare_lost("the ZooKeeper session expired")

    def purge_watch_keys(self) -> None:
        """Drop empty watch-callback entries, so that SetWatches re-arms only live watches.

        The session removes a key with its last callback; this also drops
        any left empty by a caller that edited the mapping directly.
        """
        self.link.purge_watches()

    def _enter_suspended(self) -> None:
        if self._suspended:
            return
        self.purge_watch_keys()
        self._suspended = True
        self._emit(ConnectionState.SUSPENDED)
        if self.suspended_is_lost:
            self._on_lost(self.session_id, "the ZooKeeper connection was suspended")
        timeout = float(self.link.timeout or 10.0)
        self._cancel_timer()
        # Curator's simulated expiry: the server expires the session
        # `timeout` after it last heard from us, which is earlier than now;
        # once that long has passed without contact, assume it did.
        self._expiry_timer = asyncio.get_running_loop().call_later(timeout, self._expire_locally)

    def _expire_locally(self) -> None:
        self._expiry_timer = None
        if self._suspended and not self._lost_locally and not self._closed:
            self._declare_lost(
                "no contact with ZooKeeper for a whole session timeout; "
                "the session must be considered expired"
            )

    def _declare_lost(self, reason: str) -> None:
        self._lost_locally = True
        logger.warning("ZooKeeper session 0x%x lost: %s", self.session_id or 0, reason)
        self._emit(ConnectionState.LOST)
        self._on_lost(self.session_id, reason)

    def _cancel_timer(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None

    def _emit(self, state: ConnectionState) -> None:
        self._states.publish(state)

    @property
    def state(self) -> ConnectionState | None:
        """The last state reported (``None`` before :meth:`start`)."""
        return self._states.state

    # -- user API ------------------------------------------------------------

    def add_listener(self, listener: Callable[[ConnectionState], object]) -> Callable[[], None]:
        """Call ``listener(state)`` on every state change; returns a remover."""
        return self._states.add_listener(listener)

    def remove_listener(self, listener: Callable[[ConnectionState], object]) -> None:
        """Stop calling ``listener`` (nothing happens if it is not registered)."""
        self._states.remove_listener(listener)

    def states(self) -> AsyncIterator[ConnectionState]:
        """Yield every state change from now on, until the backend closes."""
        return self._states.states()

    # -- waiters -------------------------------------------------------------

    def new_waker(self) -> asyncio.Future[None]:
        """A future resolved by the next (re)connection or by :meth:`wake_all`."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waker_count += 1
        if self._waker_count % 1024 == 0:
            self.purge_watch_keys()
            # safety net: a waker resolved and never dropped goes here
            self._wakers = {f for f in self._wakers if not f.done()}
        # No done-callback to leave the set (a bound method and a callback
        # entry per waiting task): the owner drops it with drop_waker().
        self._wakers.add(fut)
        return fut

    def drop_waker(self, fut: asyncio.Future[None]) -> None:
        """Forget a future from :meth:`new_waker` (cancelled if still pending)."""
        fut.cancel()
        self._wakers.discard(fut)

    def wake_all(self) -> None:
        """Resolve every waiter's wake-up future (they re-list and re-decide)."""
        for fut in list(self._wakers):
            if not fut.done():
                fut.set_result(None)

    # -- requests --------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """The session is connected: requests can be sent."""
        return self.link.connected

    async def _wait_connected(self, deadline: float | None, wait_for_connection: bool) -> None:
        """Return once connected; ``TimeoutError`` at ``deadline``, else ``BackendUnavailableError``
        after ``connect_timeout`` (never, without ``wait_for_connection``) or once closed."""
        if self._closed:
            raise BackendUnavailableError("the ZooKeeper backend is closed")
        link = self.link
        if link.connected:
            return
        unavailable_after = time.monotonic() + self.connect_timeout if wait_for_connection else None
        while not link.connected:
            if self._closed:
                raise BackendUnavailableError("the ZooKeeper backend is closed")
            if link.refused is not None:
                raise AccessDeniedError(str(link.refused))
            limit = deadline
            if unavailable_after is not None and (limit is None or unavailable_after < limit):
                limit = unavailable_after
            # close() must also end this wait (background deletes wait here
            # without a time limit).
            waits: list[asyncio.Future[Any]] = [link.connected_future()]
            if self._closed_fut is not None:
                waits.append(self._closed_fut)
            timeout = remaining(limit)
            if timeout is None or timeout > 0:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if self._closed:
                raise BackendUnavailableError("the ZooKeeper backend is closed")
            if link.refused is not None:
                raise AccessDeniedError(str(link.refused))
            if not link.connected and timeout is not None and remaining(limit) == 0:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError("deadline passed while waiting for a connection")
                raise BackendUnavailableError(
                    f"ZooKeeper {link.hosts} unreachable for "
                    f"{self.connect_timeout:g} s (connect_timeout)"
                )

    async def _next_connection(self, deadline: float | None) -> None:
        """Wait for the next (re)connection (or :meth:`wake_all`), within ``connect_timeout``."""
        limit = time.monotonic() + self.connect_timeout
        if deadline is not None:
            limit = min(limit, deadline)
        waker = self.new_waker()
        try:
            if await wait_future(waker, limit):
                return
        finally:
            self.drop_waker(waker)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("deadline passed waiting for a new session")
        raise BackendUnavailableError(
            f"no new ZooKeeper session within {self.connect_timeout:g} s (connect_timeout)"
        )

    async def call(
        self,
        request: Any,
        deadline: float | None,
        *,
        retry: bool,
        session_id: int | None = None,
        wait_for_connection: bool = True,
        then: Any = None,
        then_reply: list[asyncio.Future[Any]] | None = None,
    ) -> Any:
        """Send ``request`` and return its response, bounded by ``deadline``.

        With ``then``, that second request is written right behind the first
        one, on the same connection, without waiting for the first reply
        (ZooKeeper answers a session's requests in order), and its reply
        future is appended to ``then_reply`` (``(zxid, response)`` or the
        error; the caller must look at it). Only the first send does this.

        :param retry: the request is idempotent (reads, deletes): on a broken
            connection send it again; otherwise raise :class:`AmbiguousResult`
        :param session_id: only send in this session, else
            :class:`SessionChanged` (a lease created under a turnstile must not
            land in a later session)
        :param wait_for_connection: wait for a connection up to
            ``connect_timeout`` (``False``: forever, for background cleanup)
        :raises TimeoutError: the deadline passed (for a write, the outcome
            may be ambiguous: the caller reconciles)
        :raises BackendUnavailableError: no connection within ``connect_timeout``
        :raises aiozk.exc.ResponseError: the server's answer (``NoNode``...)
        """
        link = self.link
        expired_in: int | None = None  # the session a SESSION_EXPIRED answer came from
        while True:
            await self._wait_connected(deadline, wait_for_connection)
            if session_id is not None and link.session_id != session_id:
                raise SessionChanged
            conn = link.connection()
            sent_in = link.session_id
            fut = link.send(request)
            if then is not None and then_reply is not None:
                then_reply.append(link.send(then))
                then = None
            # Once sent, the reply gets at least `reply_grace` seconds even if
            # the lock deadline has passed: a deadline in the past means "try
            # exactly once", and a try needs its answers. Waiting for a
            # connection, on the other hand, stops at the deadline.
            reply_deadline = (
                deadline if deadline is None else max(deadline, time.monotonic() + self.reply_grace)
            )
            try:
                done = await wait_future(fut, reply_deadline)
            except BaseException:
                # Cancelled while in flight: the reply (if any) is dropped by
                # the connection because the future is done.
                fut.cancel()
                raise
            if not done:
                fut.cancel()
                if request.writes_data:
                    raise AmbiguousResult("deadline passed before the reply")
                raise TimeoutError("deadline passed before the reply")
            try:
                _zxid, response = fut.result()
            except zk_exc.SessionExpired:
                # Sent in a session the server had already expired: it did
                # not run. A request bound to that session cannot be sent
                # again; an idempotent one goes out in the next session.
                if session_id is not None or not retry or expired_in == sent_in:
                    raise SessionChanged from None
                expired_in = sent_in
                if link.session_id == sent_in:
                    await self._next_connection(deadline)
                continue
            except _REFUSALS as exc:
                raise _denied(exc, request, link) from exc
            except _CONNECTION_ERRORS as exc:
                self._connection_broke(conn, request, retry, exc)
                continue
            return response

    def _connection_broke(self, conn: object, request: Any, retry: bool, exc: Exception) -> None:
        """Drop the broken connection (the session reconnects and reports the drop to us).

        :raises AmbiguousResult: unless the request may be sent again (``retry``)
        """
        self.link.drop(conn)
        if not retry:
            raise AmbiguousResult(f"connection lost during {type(request).__name__}") from exc
