"""Our own ZooKeeper session: connection, handshake, reconnect, request matching, watches.

aiozk provides the wire types (requests, replies, ``Stat``, error codes) and
their serializers; everything that keeps a session alive is here, in classes
that hold aiozk objects instead of patching them:

* :class:`Connection` is an :class:`asyncio.Protocol` on one TCP connection
  to one server. Replies are cut from the byte stream and matched to their
  request by xid inside ``data_received``: no reader task, no extra loop
  pass per reply, watch callbacks run as their event is read.
* :class:`Session` owns the session id, password, negotiated timeout and
  the last zxid seen. Its connect loop tries the servers in random order
  (the one just lost last) with a short, capped, jittered back-off (a
  leader election refuses clients for a few seconds; a long back-off would
  outlive the session). A
  handshake the server closes without an answer (it is electing, or behind
  our zxid, or read-only) moves on to the next server and keeps the
  session: only an explicit "no such session" answer means it expired.
  After a reconnection in the same session the watches are re-armed with
  SetWatches, written ahead of any other request and never awaited by the
  connect loop, so a drop during it cannot stall reconnection. Pings go
  out every third of the session timeout; a connection silent for two
  thirds of it is dropped, as the Java client does.
* Authentication (``addauth``): the session's credentials go out right
  after every handshake, the first connection and each reconnection alike,
  and their answers are awaited before the connection counts as up, so no
  request (SetWatches included) ever runs unauthenticated. A refusal
  (``AUTH_FAILED``) ends the session: :attr:`Session.refused` holds the
  :class:`~aiolocks.AccessDeniedError`, ``start()`` raises it, and the
  connect loop stops (credentials the server refuses are refused on every
  server; retrying would only hide the mistake as an outage).
* TLS (``secureClientPort``): the socket is wrapped with the session's
  ``ssl.SSLContext``; a certificate that is not trusted, a host name
  mismatch or a server that refuses our certificate is a refusal too
  (:class:`~aiolocks.AccessDeniedError`, no reconnect loop), never an outage.
* The lock recipe reaches the session through :class:`~._client.OwnLink`
  (the chroot, the default ACL and path mapping are there).

Nothing here changes aiozk's module state, so other aiozk users in the
process are unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import ssl
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Protocol

from aiozk import exc as zk_exc
from aiozk import protocol
from aiozk.protocol.auth import AUTH_XID, AuthRequest

from .._core.backoff import Backoff
from .._core.errors import AccessDeniedError
from .._core.tasks import stop_task, wait_done
from ._protocol import decode_reply, decode_watch_event, encode_request

__all__ = ["Connection", "Credential", "Session", "SessionEvents", "parse_hosts"]

logger = logging.getLogger("aiolocks.zookeeper")

_SIZE: Final = struct.Struct("!i")
_REPLY_HEADER: Final = struct.Struct("!iqi")  # xid, zxid, error code
_CONNECT_HEAD: Final = struct.Struct("!iiq")  # protocol version, timeout (ms), session id
_WATCH_XID: Final = -1
_PING_XID: Final = -2
_PING: Final = _SIZE.pack(8) + struct.pack("!ii", _PING_XID, protocol.PingRequest.opcode)
_EMPTY_PASSWORD: Final = b"\x00" * 16

#: first pause between two rounds over the server list (doubles up to a cap)
_FIRST_DELAY: Final = 0.05
#: the longest wait for the answer to a ConnectRequest. A server that is
#: still starting can accept the connection, fail to serve it ("ZooKeeperServer
#: not running") and, through a server bug, never close it: without this bound
#: we would wait a whole session timeout, and lose the session, on a server
#: that answers the next connection at once. Asking again is safe (same session).
_HANDSHAKE_LIMIT: Final = 10.0

#: paths per SetWatches request, in bytes (the Java client's limit: far below
#: the server's packet limit, so re-arming many watches cannot be refused)
_SET_WATCHES_BYTES: Final = 128 * 1024


class Credential:
    """One ``addauth``: a scheme (``"digest"``) and its secret (``b"user:password"``).

    The secret never shows in ``repr()``, ``str()`` or messages; only
    :attr:`identity` (the user name, for messages) does.
    """

    __slots__ = ("_secret", "identity", "scheme")

    def __init__(self, scheme: str, secret: bytes, *, identity: str) -> None:
        self.scheme = scheme
        self._secret = secret
        self.identity = identity

    def request(self) -> Any:
        """The ``AuthPacket`` (sent with xid -4)."""
        return AuthRequest(type=0, scheme=self.scheme, auth=self._secret)

    def __repr__(self) -> str:
        return f"Credential({self.scheme!r}, identity={self.identity!r}, secret=***)"


class SessionEvents(Protocol):
    """What a :class:`Session` reports (implemented by the session monitor)."""

    def session_connected(self, session_id: int) -> None:
        """A connection is up, in session ``session_id`` (maybe a new one)."""

    def session_disconnected(self) -> None:
        """The connection is down; the session may still live on the server."""

    def session_expired(self) -> None:
        """The server answered that our session no longer exists."""


class Connection(asyncio.Protocol):
    """One TCP connection to one ZooKeeper server.

    :meth:`send` writes a framed request and returns a future for
    ``(zxid, response)`` (or the server's error as an exception); every
    future still pending when the connection ends fails with
    ``aiozk.exc.ConnectError``.
    """

    def __init__(self, host: str, port: int, session: Session) -> None:
        self.host = host
        self.port = port
        self._session = session
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        #: xid -> (opcode, reply future)
        self.pending: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        self._handshake: asyncio.Future[bytes] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last_received = time.monotonic()
        #: why the connection ended, if asyncio said (a TLS alert, a reset...)
        self.error: Exception | None = None

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Store the transport (asyncio calls this once)."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        """Cut complete frames out of the stream and handle each one."""
        self.last_received = time.monotonic()
        buffered = bool(self._buf)
        if buffered:
            self._buf += data
            view: bytes | bytearray = self._buf
        else:
            view = data  # the usual case: whole replies, no copy into the buffer
        pos = 0
        end = len(view)
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(view, pos)
            stop = pos + 4 + size
            if size < 0:
                self.abort()
                return
            if stop > end:
                break
            frame = bytes(view[pos + 4 : stop])
            pos = stop
            try:
                self._frame(frame)
            except Exception:
                logger.exception("bad reply from ZooKeeper %s:%s", self.host, self.port)
                self.abort()
                return
        if buffered:
            del self._buf[:pos]
        elif pos < end:
            self._buf += view[pos:]

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail every pending request; resolve :attr:`closed`; tell the session."""
        self.error = exc
        self._lost()

    def _lost(self) -> None:
        self._fail_pending()
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(ConnectionResetError("closed during the handshake"))
        if not self.closed.done():
            self.closed.set_result(None)
            self._session.connection_lost(self)

    # -- frames -----------------------------------------------------------------------

    def _frame(self, frame: bytes) -> None:
        handshake = self._handshake
        if handshake is not None:
            self._handshake = None
            if not handshake.done():
                handshake.set_result(frame)
            return
        xid, zxid, error = _REPLY_HEADER.unpack_from(frame)
        if xid == _PING_XID:
            return
        session = self._session
        if xid == _WATCH_XID:
            session.dispatch(decode_watch_event(frame[_REPLY_HEADER.size :]))
            return
        # As the Java client: only replies move the zxid we have seen (it is
        # the point from which SetWatches asks for missed changes).
        if zxid > 0:
            session.last_zxid = zxid
        entry = self.pending.pop(xid, None)
        if entry is None:
            return  # its caller gave up; nothing waits for this reply
        opcode, fut = entry
        if fut.done():
            return
        if error:
            fut.set_exception(zk_exc.get_response_error(error))
        else:
            fut.set_result((zxid, decode_reply(opcode, frame[_REPLY_HEADER.size :])))

    # -- requests ---------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """The connection can still carry requests."""
        return not self.closed.done() and self.transport is not None

    def send(self, request: Any, xid: int | None = None) -> asyncio.Future[Any]:
        """Write ``request`` with ``xid``; a future for ``(zxid, response)``."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        transport = self.transport
        if self.closed.done() or transport is None or transport.is_closing():
            fut.set_exception(zk_exc.ConnectError(self.host, self.port))
            return fut
        if xid is None:
            xid = self._session.next_xid()
        payload = encode_request(request, xid)
        self.pending[xid] = (request.opcode, fut)
        transport.write(_SIZE.pack(len(payload)) + payload)
        return fut

    def ping(self) -> None:
        """Write a ping (its reply only refreshes :attr:`last_received`)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(_PING)

    async def handshake(self, request: Any, timeout: float) -> bytes | None:
        """Send the ConnectRequest; the raw reply, ``None`` if the server closed or was silent."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._handshake = loop.create_future()
        payload = request.serialize()
        self.transport.write(_SIZE.pack(len(payload)) + payload)
        try:
            async with asyncio.timeout(timeout):
                return await self._handshake
        except (TimeoutError, ConnectionError):
            return None

    def abort(self) -> None:
        """Drop the connection now: pending requests fail and the session hears of it at once."""
        if self.transport is not None:
            self.transport.abort()
        self._lost()

    def _fail_pending(self) -> None:
        pending, self.pending = self.pending, {}
        for _opcode, fut in pending.values():
            if not fut.done():
                fut.set_exception(zk_exc.ConnectError(self.host, self.port))


def parse_hosts(servers: str) -> list[tuple[str, int]]:
    """``"h1:2181,[::1]:2182,h3"`` -> ``[("h1", 2181), ("::1", 2182), ("h3", 2181)]``."""
    hosts: list[tuple[str, int]] = []
    for server in servers.split(","):
        server = server.strip()
        if server.startswith("["):
            host, _, rest = server[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        elif server.count(":") == 1:
            host, port = server.split(":")
        else:
            host, port = server, ""
        hosts.append((host, int(port) if port else 2181))
    return hosts


class Session:
    """One ZooKeeper session over successive connections (see the module doc).

    :param hosts: ``(host, port)`` pairs of the ensemble
    :param timeout: the session timeout to ask for, in seconds (the server
        clamps it; :attr:`timeout` is then the negotiated value)
    :param events: told about connections, disconnections and expiry
    :param credentials: sent (``addauth``) after every handshake, before any request
    :param ssl_context: TLS to the servers' ``secureClientPort``: the server's
        certificate is verified (and its host name, if the context checks it)
    """

    def __init__(
        self,
        hosts: Iterable[tuple[str, int]],
        *,
        timeout: float,
        events: SessionEvents | None,
        credentials: Sequence[Credential] = (),
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.hosts = list(hosts)
        if not self.hosts:
            raise ValueError("no ZooKeeper server given")
        self.requested_timeout = timeout
        self.timeout = timeout
        self.session_id: int | None = None
        self.password = _EMPTY_PASSWORD
        self.last_zxid = 0
        self.xid = 0
        self.conn: Connection | None = None
        self.events = events
        #: (event type, path) -> callbacks, each called with the path. A tuple,
        #: replaced on each change: most paths have one callback, and a set of
        #: one costs about four times a tuple of one (there is one such key per
        #: waiting task, so this is most of the session's memory per waiter).
        self.watch_callbacks: dict[tuple[int, str], tuple[Callable[[str], object], ...]] = {}
        self._connected: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._ticker: asyncio.TimerHandle | None = None
        #: the server of the last connection that ended (tried last)
        self._last_lost: tuple[str, int] | None = None
        #: when the next ping is due (``time.monotonic()``)
        self._next_ping = 0.0
        self.closing = False
        self.credentials = tuple(credentials)
        self.ssl_context = ssl_context
        #: set when the server refused our credentials: the session is over
        self.refused: AccessDeniedError | None = None

    # -- state ------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """A connection is up and the handshake done."""
        fut = self._connected
        return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None

    def connected_future(self) -> asyncio.Future[None]:
        """Resolved while connected; a new one (resolved at the next connection) otherwise."""
        fut = self._connected
        if fut is None:
            fut = self._connected = asyncio.get_running_loop().create_future()
        return fut

    def next_xid(self) -> int:
        """The next request xid (a positive signed 32-bit int)."""
        self.xid = self.xid + 1 if self.xid < 0x7FFFFFFF else 1
        return self.xid

    # -- watches ----------------------------------------------------------------------

    def add_watch_callback(
        self, event_type: int, path: str, callback: Callable[[str], object]
    ) -> None:
        """Call ``callback(path)`` for events of ``event_type`` on ``path`` (absolute)."""
        key = (event_type, path)
        callbacks = self.watch_callbacks.get(key, ())
        if callback not in callbacks:
            self.watch_callbacks[key] = (*callbacks, callback)

    def remove_watch_callback(
        self, event_type: int, path: str, callback: Callable[[str], object]
    ) -> None:
        """Forget a callback; the key goes with its last callback."""
        key = (event_type, path)
        callbacks = self.watch_callbacks.get(key)
        if callbacks is not None and callback in callbacks:
            rest = tuple(c for c in callbacks if c != callback)
            if rest:
                self.watch_callbacks[key] = rest
            else:
                del self.watch_callbacks[key]

    def dispatch(self, event: Any) -> None:
        """Run the callbacks of a node watch event (session events are ours to make)."""
        callbacks = self.watch_callbacks.get((event.type, event.path))
        if not callbacks:
            return
        for callback in callbacks:  # a tuple: callbacks may add or remove others
            try:
                callback(event.path)
            except Exception:
                logger.exception("watch callback for %s failed", event.path)

    def set_watches_requests(self) -> list[Any]:
        """SetWatches requests re-arming every watched path, each under ``_SET_WATCHES_BYTES``.

        Data watches also fire on deletion, so DELETED callbacks are re-armed
        as data watches (the server fires NodeDeleted for a path gone meanwhile).
        """
        kinds: dict[int, str] = {
            protocol.WatchEvent.DATA_CHANGED: "data_watches",
            protocol.WatchEvent.DELETED: "data_watches",
            protocol.WatchEvent.CREATED: "exist_watches",
            protocol.WatchEvent.CHILDREN_CHANGED: "child_watches",
        }
        wanted = sorted({(kinds[t], path) for t, path in self.watch_callbacks if t in kinds})
        requests: list[Any] = []
        size = _SET_WATCHES_BYTES
        for kind, path in wanted:
            length = len(path.encode("utf-8")) + 4
            if size + length > _SET_WATCHES_BYTES:
                requests.append(
                    protocol.SetWatchesRequest(
                        relative_zxid=self.last_zxid,
                        data_watches=[],
                        exist_watches=[],
                        child_watches=[],
                    )
                )
                size = 0
            getattr(requests[-1], kind).append(path)
            size += length
        return requests

    # -- lifecycle --------------------------------------------------------------------

    async def start(self, timeout: float) -> None:
        """Connect (a first session); ``TimeoutError``, cleaned up, if not within ``timeout``."""
        if self._task is not None:
            raise RuntimeError("session already started")
        connected = self.connected_future()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aiolocks-zk-connect")
        try:
            if not await wait_done(connected, timeout):
                raise TimeoutError
            connected.result()
        except BaseException:
            await self.abort()
            raise

    async def close(self, timeout: float) -> None:
        """Close the session on the server (its ephemeral nodes go), then the connection."""
        conn = self.conn if self.connected else None
        self.closing = True
        await self._stop_loop()
        if conn is not None and conn.is_open:
            reply = conn.send(protocol.CloseRequest())
            with contextlib.suppress(TimeoutError, zk_exc.ZKError, ConnectionError):
                async with asyncio.timeout(timeout):
                    await asyncio.wait((reply, conn.closed), return_when=asyncio.FIRST_COMPLETED)
            if not reply.done():
                reply.cancel()
            elif not reply.cancelled():
                reply.exception()  # retrieved: a failed close is not worth a warning
        await self.abort()

    async def abort(self) -> None:
        """Drop everything without telling the server (its session then times out)."""
        self.closing = True
        await self._stop_loop()
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()
        fut, self._connected = self._connected, None  # no longer connected
        if fut is not None and not fut.done():
            fut.cancel()

    async def _stop_loop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            await stop_task(task)

    # -- the connect loop ---------------------------------------------------------------

    async def _run(self) -> None:
        backoff: Backoff | None = None  # while no server takes us
        while not self.closing:
            try:
                conn = await self._connect_round()
            except Exception:  # a bug or a malformed answer must not end reconnection
                logger.exception("connecting to ZooKeeper failed")
                conn = None
            if conn is None:
                if backoff is None:
                    cap = min(2.0, max(0.1, self.timeout / 4))
                    backoff = Backoff(math.inf, first=_FIRST_DELAY, cap=cap, jitter=0.2)
                await backoff.wait()
                continue
            backoff = None
            await wait_done(conn.closed)  # stopping this loop must not close it
            self.connection_lost(conn)  # no-op if already reported
            self._last_lost = (conn.host, conn.port)

    async def _connect_round(self) -> Connection | None:
        """One pass over the servers in random order; the connection of the first that takes us.

        The server whose connection just ended is tried last, as the Java
        client moves on to the next server: when it is the one cut off (and
        silent), a round starting with it would spend its whole share of the
        session timeout there, which is about all that is left of the session.
        """
        order = random.sample(self.hosts, len(self.hosts))
        if self._last_lost in order:
            order.remove(self._last_lost)
            order.append(self._last_lost)
        for host, port in order:
            if self.closing:
                return None
            conn = await self._try_server(host, port)
            if conn is not None:
                return conn
        return None

    async def _try_server(self, host: str, port: int) -> Connection | None:
        loop = asyncio.get_running_loop()
        # Java's connect timeout: the session timeout shared by the servers.
        per_server = max(0.5, self.timeout / len(self.hosts))
        tls = self.ssl_context
        try:
            async with asyncio.timeout(per_server):
                _, conn = await loop.create_connection(
                    lambda: Connection(host, port, self),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                )
        except (OSError, TimeoutError) as exc:
            refusal = tls_refusal(exc)
            if refusal is not None:
                self._refuse(f"TLS to ZooKeeper {host}:{port} refused: {refusal}")
                return None
            logger.debug("cannot connect to ZooKeeper %s:%s: %r", host, port, exc)
            return None
        try:
            return await self._handshake_with(conn, host, port, min(per_server, _HANDSHAKE_LIMIT))
        except BaseException:
            conn.abort()  # cancelled (closing) or failed mid-handshake: no stray socket
            raise

    async def _handshake_with(
        self, conn: Connection, host: str, port: int, per_server: float
    ) -> Connection | None:
        asked_for = self.session_id or 0
        request = protocol.ConnectRequest(
            protocol_version=0,
            last_seen_zxid=self.last_zxid,
            timeout=int(self.requested_timeout * 1000),
            session_id=asked_for,
            password=self.password,
            read_only=False,
        )
        reply = await conn.handshake(request, per_server)
        refusal = None if conn.error is None else tls_refusal(conn.error)
        if refusal is not None:
            # TLS 1.3: the server checks our certificate after our side of the
            # handshake is done; its refusal arrives as the first read fails.
            self._refuse(f"TLS to ZooKeeper {host}:{port} refused: {refusal}")
            conn.abort()
            return None
        if reply is None or self.closing:
            # Closed or silent without an answer: electing a leader, behind
            # our zxid, or read-only (locks need writes). Not an expiry: try
            # the next server with the same session.
            logger.debug("ZooKeeper %s:%s closed the handshake", host, port)
            conn.abort()
            return None
        try:
            _version, timeout_ms, session_id = _CONNECT_HEAD.unpack_from(reply)
            (size,) = _SIZE.unpack_from(reply, _CONNECT_HEAD.size)
        except struct.error:
            logger.warning("ZooKeeper %s:%s sent a malformed handshake answer", host, port)
            conn.abort()
            return None
        offset = _CONNECT_HEAD.size + 4
        password = reply[offset : offset + max(size, 0)]
        if session_id == 0:
            # "No such session": the server expired it. Start a new one.
            conn.abort()
            self.session_id = None
            self.password = _EMPTY_PASSWORD
            if asked_for and self.events is not None:
                self.events.session_expired()
            return None
        same = session_id == asked_for
        self.session_id = session_id
        self.password = bytes(password)
        self.timeout = timeout_ms / 1000
        if self.credentials and not await self._authenticate(conn, host, port, per_server):
            conn.abort()
            return None
        self.conn = conn
        if same:
            # Written before anything else on this connection: the server
            # re-arms the watches (and fires those that a change meanwhile
            # triggered) before it runs any later request. Never awaited, so
            # a drop right now only means another reconnection; waiters
            # re-list after every reconnection anyway, which is what they
            # rely on (re-arming serves watches set through the client API).
            for request in self.set_watches_requests():
                conn.send(request).add_done_callback(_log_failure(conn))
        self._schedule_tick(conn)
        fut = self.connected_future()
        if not fut.done():
            fut.set_result(None)
        if self.events is not None:
            self.events.session_connected(session_id)
        return conn

    async def _authenticate(self, conn: Connection, host: str, port: int, limit: float) -> bool:
        """Send every credential and await the answers; ``False`` to try again elsewhere.

        A refusal (``AUTH_FAILED``) ends the session (see :meth:`_refuse`).
        """
        # Every AuthPacket has the protocol's xid -4: one in flight at a time.
        for credential in self.credentials:
            reply = conn.send(credential.request(), xid=AUTH_XID)
            try:
                async with asyncio.timeout(limit):
                    await reply
            except zk_exc.AuthFailed:
                self._refuse(
                    f"ZooKeeper {host}:{port} refused the {credential.scheme} credentials of "
                    f"{credential.identity!r} (AUTH_FAILED)"
                )
                return False
            except (TimeoutError, zk_exc.ZKError, ConnectionError):
                reply.cancel()
                logger.debug("ZooKeeper %s:%s: no answer to addauth", host, port)
                return False
        return True

    def _refuse(self, message: str) -> None:
        """A refusal (credentials, certificate): end the session, keep the error for callers."""
        error = AccessDeniedError(message)
        logger.error("%s", error)
        self.refused = error
        self.closing = True
        fut = self.connected_future()
        if not fut.done():
            fut.set_exception(error)
            fut.exception()  # retrieved: connected() and callers look at refused
        if self.events is not None:
            self.events.session_disconnected()

    def connection_lost(self, conn: Connection) -> None:
        """Called by ``conn`` when it ends: if it was our connection, we are disconnected."""
        fut = self._connected
        if conn is not self.conn or fut is None or not fut.done():
            return  # not ours, or not connected through it
        self._connected = None
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if not self.closing and self.events is not None:
            self.events.session_disconnected()

    # -- pings --------------------------------------------------------------------------

    def _schedule_tick(self, conn: Connection) -> None:
        """Start pinging ``conn`` (a new connection): first ping a third of the timeout from now."""
        self._next_ping = time.monotonic() + self.timeout / 3
        self._check_at(conn, self._next_ping)

    def _check_at(self, conn: Connection, when: float) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        delay = max(0.0, when - time.monotonic())
        self._ticker = asyncio.get_running_loop().call_later(delay, self._tick, conn)

    def _tick(self, conn: Connection) -> None:
        """Ping when one is due; drop the connection once silent for two thirds of the timeout.

        As the Java client, the silence is checked at the very moment it
        reaches two thirds of the session timeout, not at the next ping: a
        check only every third would notice it up to a whole session timeout
        after the last byte, when the server has expired the session already
        and a healed network comes too late.
        """
        self._ticker = None
        if self.closing or self.conn is not conn or not conn.is_open:
            return
        now = time.monotonic()
        silent_until = conn.last_received + self.timeout * 2 / 3
        if now >= silent_until:
            # Silent for two thirds of the session timeout: the server (or
            # the network) is gone; reconnect elsewhere while the session lives.
            logger.debug("ZooKeeper %s:%s silent; reconnecting", conn.host, conn.port)
            conn.abort()
            return
        if now >= self._next_ping:
            conn.ping()
            self._next_ping = now + self.timeout / 3
        self._check_at(conn, min(self._next_ping, silent_until))


#: OpenSSL reasons for a handshake the peer refused (our certificate missing,
#: not trusted, or expired on its side): retrying cannot help
_TLS_REFUSALS: Final = (
    "CERTIFICATE_REQUIRED",
    "UNKNOWN_CA",
    "BAD_CERTIFICATE",
    "CERTIFICATE_EXPIRED",
    "CERTIFICATE_UNKNOWN",
    "HANDSHAKE_FAILURE",
)


def tls_refusal(exc: BaseException) -> str | None:
    """Why a TLS handshake failure is a refusal (untrusted, wrong host name...), else None."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the server's certificate: {exc.verify_message or exc.reason}"
    if isinstance(exc, ssl.SSLError) and any(r in str(exc.reason) for r in _TLS_REFUSALS):
        return f"the server refused our TLS handshake ({exc.reason})"
    return None


def _log_failure(conn: Connection) -> Callable[[asyncio.Future[Any]], None]:
    """A done-callback reporting a SetWatches the server refused."""

    def done(fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            return
        error = fut.exception()  # retrieved either way
        if error is not None and not isinstance(error, zk_exc.ConnectError):
            logger.warning("re-arming watches on %s:%s failed: %r", conn.host, conn.port, error)

    return done
