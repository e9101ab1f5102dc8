"""The ZooKeeper client layer: the narrow link the lock recipe talks to, and ``backend.client``.

The recipe (:mod:`._internals`) and the session monitor (:mod:`._session`)
use a ZooKeeper session only through :class:`Link`: send one request now,
on the current connection, in order; watch callbacks by (event type,
absolute path); the session id, the negotiated timeout, the chroot and the
default ACL; and session events (connected in session X, disconnected,
expired) reported to a :class:`~._connection.SessionEvents`. Two links
implement it:

* :class:`OwnLink`, aiolocks' own session (:class:`~._connection.Session`:
  reconnect, pings, SetWatches). A backend built from a ``zk://`` URL runs
  on it. Whatever has to happen on every connection before any request
  (authentication) or on the socket itself (TLS) belongs in that session.
* :class:`AiozkLink`, the session of an ``aiozk.ZKClient`` the application
  already has (``ZooKeeperBackend(client)``): requests, watches and states
  go through aiozk's public client and session API, so the application's
  authentication applies and the process keeps one session. The link never
  starts or closes that client.

:class:`ZooKeeperClient` is ``backend.client`` of a URL-built backend: a few
documented node operations in the backend's own session, sent with the
backend's rules (a bounded wait for a connection, reads re-sent after a
drop, a write whose reply was lost reported as :class:`AmbiguousResult`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import aiozk
from aiozk import exc as zk_exc
from aiozk import protocol
from aiozk.protocol.create import Create2Request

from .._core.errors import AccessDeniedError
from .._core.tasks import stop_task, wait_done
from ._connection import Session, SessionEvents
from ._protocol import CONTAINER_FLAG, CreateContainerRequest, encode_request

if TYPE_CHECKING:
    from ._session import SessionMonitor

__all__ = ["AiozkLink", "Link", "OwnLink", "WatchCallback", "ZooKeeperClient"]

logger = logging.getLogger("aiolocks.zookeeper")

#: ``watch=`` of :class:`ZooKeeperClient`: called once with ``(kind, path)``
WatchCallback = Callable[[str, str], object]

_EVENT_KINDS: Final = {
    protocol.WatchEvent.CREATED: "created",
    protocol.WatchEvent.DELETED: "deleted",
    protocol.WatchEvent.DATA_CHANGED: "data",
    protocol.WatchEvent.CHILDREN_CHANGED: "children",
}


def normalize_path(chroot: str | None, path: str) -> str:
    """``path`` below ``chroot`` as the server sees it (aiozk's ``normalize_path`` rule)."""
    if chroot:
        path = f"{chroot}/{path}"
    return "/" + "/".join(name for name in path.split("/") if name)


def denormalize_path(chroot: str | None, path: str) -> str:
    """A server path back below ``chroot``."""
    if chroot and path.startswith(chroot):
        return path[len(chroot) :] or "/"
    return path


class Link(Protocol):
    """The narrow ZooKeeper session interface of the lock recipe (see the module doc)."""

    chroot: str | None
    default_acl: Any
    #: told about connections, disconnections and expiry (set by the monitor)
    events: SessionEvents | None

    @property
    def session_id(self) -> int | None:
        """The current session id (``None`` before the first connection)."""

    @property
    def timeout(self) -> float:
        """The negotiated session timeout in seconds (the requested one before that)."""

    @property
    def connected(self) -> bool:
        """Requests can be sent now."""

    @property
    def hosts(self) -> list[tuple[str, int]]:
        """The ensemble's ``(host, port)`` pairs (for messages)."""

    @property
    def refused(self) -> AccessDeniedError | None:
        """Set once the server refused the link's credentials: it will not connect again."""

    def connected_future(self) -> asyncio.Future[None]:
        """Resolved while (or as soon as) connected."""

    def send(self, request: Any) -> asyncio.Future[Any]:
        """Send ``request`` now (only while connected); a future for ``(zxid, response)``.

        Requests sent one after the other go out in that order; ``zxid`` may
        be 0 when the link does not know it.
        """

    def connection(self) -> object | None:
        """The current connection (an opaque token for :meth:`drop`), if the link knows it."""

    def drop(self, connection: object | None) -> None:
        """A request on ``connection`` failed with a connection error: drop it if still current."""

    def saw_zxid(self, zxid: int) -> None:
        """A reply carried ``zxid`` (the point from which lost watches are asked for)."""

    def add_watch_callback(
        self, event_type: int, path: str, callback: Callable[[str], object]
    ) -> None:
        """Call ``callback(path)`` on events of ``event_type`` on ``path`` (absolute)."""

    def remove_watch_callback(
        self, event_type: int, path: str, callback: Callable[[str], object]
    ) -> None:
        """Forget a callback added with :meth:`add_watch_callback`."""

    def purge_watches(self) -> None:
        """Drop empty watch entries (so that re-arming asks only for live watches)."""

    def normalize_path(self, path: str) -> str:
        """``path`` (below the chroot) as the server sees it."""

    def denormalize_path(self, path: str) -> str:
        """A server path back below the chroot."""

    async def start(self, timeout: float) -> None:
        """Be connected within ``timeout`` seconds (``TimeoutError`` otherwise)."""

    async def close(self, timeout: float) -> None:
        """Stop; close the session only if the link owns it."""


class OwnLink:
    """:class:`Link` over aiolocks' own :class:`~._connection.Session`."""

    def __init__(self, session: Session, *, chroot: str | None, default_acl: Any) -> None:
        self.session = session
        self.chroot = normalize_path(None, chroot) if chroot and chroot != "/" else None
        self.default_acl = default_acl or [protocol.UNRESTRICTED_ACCESS]

    @property
    def events(self) -> SessionEvents | None:
        """The session's listener (the monitor)."""
        return self.session.events

    @events.setter
    def events(self, events: SessionEvents | None) -> None:
        self.session.events = events

    @property
    def session_id(self) -> int | None:
        """The session's id."""
        return self.session.session_id

    @property
    def timeout(self) -> float:
        """The negotiated session timeout."""
        return self.session.timeout

    @property
    def connected(self) -> bool:
        """Connected and the handshake done."""
        return self.session.connected

    @property
    def hosts(self) -> list[tuple[str, int]]:
        """The ensemble."""
        return self.session.hosts

    @property
    def refused(self) -> AccessDeniedError | None:
        """The session's refusal (``AUTH_FAILED``), if the server refused its credentials."""
        return self.session.refused

    def connected_future(self) -> asyncio.Future[None]:
        """See :meth:`Session.connected_future`."""
        return self.session.connected_future()

    def send(self, request: Any) -> asyncio.Future[Any]:
        """Write ``request`` on the current connection."""
        session = self.session
        conn = session.conn
        if conn is None:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_exception(zk_exc.ConnectError("aiolocks", 0))
            return fut
        return conn.send(request, xid=session.next_xid())

    def connection(self) -> object | None:
        """The session's current connection."""
        return self.session.conn

    def drop(self, connection: object | None) -> None:
        """Abort ``connection`` if still current (the session reconnects and reports it)."""
        conn = self.session.conn
        if conn is not None and conn is connection:
            conn.abort()

    def saw_zxid(self, zxid: int) -> None:
        """Move the session's last zxid on."""
        self.session.last_zxid = max(self.session.last_zxid, zxid)

    def add_watch_callback(
        self, event_type: int, path: str, callback: Callable[[str], object]
    ) -> None:
        """See :meth:`Session.add_watch_callback`."""
        self.session.add_watch_callback(event_type, path, callback)

    def remove_watch_callback(
        self, event_type: int, path: str, callback: Callable[[str], object]
    ) -> None:
        """See :meth:`Session.remove_watch_callback`."""
        self.session.remove_watch_callback(event_type, path, callback)

    def purge_watches(self) -> None:
        """Drop empty watch entries left by a caller that edited the table."""
        callbacks = self.session.watch_callbacks
        for key in [k for k, v in callbacks.items() if not v]:
            callbacks.pop(key, None)

    def normalize_path(self, path: str) -> str:
        """``path`` below the chroot, as the server sees it."""
        return normalize_path(self.chroot, path)

    def denormalize_path(self, path: str) -> str:
        """A server path back below the chroot."""
        return denormalize_path(self.chroot, path)

    async def start(self, timeout: float) -> None:
        """Start the session (a first connection within ``timeout``)."""
        await self.session.start(timeout)

    async def close(self, timeout: float) -> None:
        """Close the session on the server (its ephemeral nodes go)."""
        try:
            await self.session.close(timeout)
        except Exception:
            logger.warning("closing the ZooKeeper session failed", exc_info=True)
            await self.session.abort()


#: what :class:`AiozkLink` uses of an ``aiozk.ZKClient`` (all public names)
_AIOZK_CLIENT_NEEDS: Final = ("session", "chroot", "default_acl")
_AIOZK_SESSION_NEEDS: Final = (
    "send",
    "state",
    "add_watch_callback",
    "remove_watch_callback",
    "session_id",
    "timeout",
    "hosts",
)


def _ignore(_path: str) -> None:
    """Data-watch stand-in that makes aiozk re-arm a deletion watch after a reconnect."""


class AiozkLink:
    """:class:`Link` over the session of an application's ``aiozk.ZKClient``.

    Uses only aiozk's public client and session API: ``session.send``
    (rather than ``client.send``, which caches the ``Stat`` of every path it
    sees: one entry per lock node ever made), ``session.add_watch_callback``
    / ``remove_watch_callback``, ``session.state`` (``current_state``,
    ``wait_for``), ``session.session_id`` and ``session.timeout``. Session
    states are read by one task that waits on aiozk's state machine.

    aiozk re-arms only data, exists and child watches after a reconnection;
    a deletion watch is therefore registered with a do-nothing data
    callback on the same path, which aiozk re-arms (a data watch also fires
    on deletion). aiozk re-sends a request after a dropped connection, a
    create included: the recipe removes a second node carrying its uid.

    :raises TypeError: ``client`` lacks what the link uses (not an aiozk client)
    """

    def __init__(self, client: Any) -> None:
        missing = [name for name in _AIOZK_CLIENT_NEEDS if not hasattr(client, name)]
        session = getattr(client, "session", None)
        missing += [f"session.{n}" for n in _AIOZK_SESSION_NEEDS if not hasattr(session, n)]
        if missing:
            raise TypeError(
                f"ZooKeeperBackend(client) needs an aiozk.ZKClient; {type(client).__name__} "
                f"lacks {', '.join(missing)}"
            )
        self.client = client
        self._session: Any = session
        chroot = client.chroot
        self.chroot = normalize_path(None, chroot) if chroot and chroot != "/" else None
        self.default_acl = client.default_acl or [protocol.UNRESTRICTED_ACCESS]
        self.events: SessionEvents | None = None
        self._deleted_watches: dict[str, int] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._reported: tuple[str, int | None] | None = None

    # -- state --------------------------------------------------------------------------

    @property
    def session_id(self) -> int | None:
        """The client's session id."""
        sid = self._session.session_id
        return int(sid) if sid else None

    @property
    def timeout(self) -> float:
        """The client's (negotiated) session timeout."""
        return float(self._session.timeout or 10.0)

    @property
    def connected(self) -> bool:
        """aiozk's session is CONNECTED (read-only does not count: locks write)."""
        return bool(self._session.state.current_state == _connected_state())

    @property
    def hosts(self) -> list[tuple[str, int]]:
        """The client's servers."""
        return [(str(h), int(p)) for h, p in self._session.hosts]

    @property
    def refused(self) -> AccessDeniedError | None:
        """Always ``None``: the application's client handles its own authentication."""
        return None

    def connected_future(self) -> asyncio.Future[None]:
        """aiozk's future for the CONNECTED state."""
        fut: asyncio.Future[None] = self._session.state.wait_for(_connected_state())
        return fut

    # -- requests -----------------------------------------------------------------------

    def send(self, request: Any) -> asyncio.Future[Any]:
        """Send through aiozk's session (a task: aiozk's ``send`` is a coroutine)."""
        if type(request) is CreateContainerRequest:
            request = _container_for_aiozk(request)
        return asyncio.get_running_loop().create_task(self._send(request))

    async def _send(self, request: Any) -> tuple[int, Any]:
        return 0, await self._session.send(request)

    def connection(self) -> object | None:
        """Not tracked: aiozk reconnects by itself."""
        return None

    def drop(self, connection: object | None) -> None:
        """aiozk reconnects by itself."""

    def saw_zxid(self, zxid: int) -> None:
        """aiozk keeps its own last zxid."""

    # -- watches ------------------------------------------------------------------------

    def add_watch_callback(
        self, event_type: int, path: str, callback: Callable[[str], object]
    ) -> None:
        """aiozk's ``session.add_watch_callback`` (see the class doc for deletions)."""
        if event_type == protocol.WatchEvent.DELETED:
            count = self._deleted_watches.get(path, 0)
            if count == 0:
                self._session.add_watch_callback(protocol.WatchEvent.DATA_CHANGED, path, _ignore)
            self._deleted_watches[path] = count + 1
        self._session.add_watch_callback(event_type, path, callback)

    def remove_watch_callback(
        self, event_type: int, path: str, callback: Callable[[str], object]
    ) -> None:
        """aiozk's ``session.remove_watch_callback``."""
        self._session.remove_watch_callback(event_type, path, callback)
        if event_type == protocol.WatchEvent.DELETED and path in self._deleted_watches:
            count = self._deleted_watches.pop(path) - 1
            if count > 0:
                self._deleted_watches[path] = count
            else:
                self._session.remove_watch_callback(protocol.WatchEvent.DATA_CHANGED, path, _ignore)

    def purge_watches(self) -> None:
        """aiozk keeps its own table."""

    def normalize_path(self, path: str) -> str:
        """``path`` below the client's chroot."""
        return normalize_path(self.chroot, path)

    def denormalize_path(self, path: str) -> str:
        """A server path back below the client's chroot."""
        return denormalize_path(self.chroot, path)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, timeout: float) -> None:
        """Wait until the client is connected (the application starts it), then watch states."""
        if not self.connected:
            waiter = self.connected_future()
            try:
                if not await wait_done(waiter, timeout):
                    raise TimeoutError
            finally:
                if not waiter.done():
                    waiter.cancel()
            waiter.result()  # aiozk's error, if the wait for it failed
        self._reported = (str(_connected_state()), self.session_id)
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch_states(), name="aiolocks-zk-aiozk-states"
        )

    async def close(self, timeout: float) -> None:
        """Stop watching states; the client and its session stay the application's."""
        task, self._watcher = self._watcher, None
        if task is not None:
            await stop_task(task)

    async def _watch_states(self) -> None:
        state = self._session.state
        states = _all_states()
        while True:
            waiter: asyncio.Future[None] = state.wait_for(*states)
            if waiter.done():
                # wait_for resolves at once in a state it was asked for: wait
                # for the next transition instead
                waiter = state.wait_for(*[s for s in states if s != state.current_state])
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()
            self._report(str(state.current_state))

    def _report(self, current: str) -> None:
        """Tell the monitor what changed since the last report (states may have been skipped)."""
        sid = self.session_id
        now = (current, sid)
        if now == self._reported:
            return
        self._reported = now
        events = self.events
        if events is None:
            return
        if current == _connected_state() and sid is not None:
            events.session_connected(sid)
        elif current != _connected_state():
            events.session_disconnected()


#: aiozk releases whose connection decodes a reply by the ``opcode`` of the
#: request object it sent (checked for 0.32)
_AIOZK_DECODES_BY_REQUEST_OPCODE: Final = ("0.32.",)


class _AiozkCreateContainer(Create2Request):  # type: ignore[misc]
    """``createContainer`` on the wire, decoded by aiozk as the ``create2`` reply it equals.

    aiozk has no reply class for opcode 19 (and aiolocks registers nothing
    in aiozk's tables): the request writes opcode 19 but carries
    ``create2``'s opcode, which aiozk's connection uses to pick the reply
    class (path and ``Stat``, the same body).
    """

    def serialize(self, xid: int | None = None) -> bytes:
        """The ``createContainer`` frame body (see :func:`._protocol.encode_request`)."""
        body = CreateContainerRequest(path=self.path, data=self.data, acl=self.acl)
        return encode_request(body, xid)


def _container_for_aiozk(request: Any) -> Any:
    """A container create that aiozk's session can send and decode.

    On an aiozk release not checked to decode replies by the request's
    opcode, the parents are created as plain persistent nodes instead
    (never reaped by the server), with a warning.
    """
    if aiozk.__version__.startswith(_AIOZK_DECODES_BY_REQUEST_OPCODE):
        return _AiozkCreateContainer(
            path=request.path, data=request.data, acl=request.acl, flags=CONTAINER_FLAG
        )
    _warn_no_containers()
    return protocol.CreateRequest(path=request.path, data=request.data, acl=request.acl, flags=0)


@functools.cache
def _warn_no_containers() -> None:
    logger.warning(
        "aiozk %s is not known to decode createContainer replies: lock parents on this "
        "client are persistent nodes (not reaped when empty)",
        aiozk.__version__,
    )


def _connected_state() -> str:
    from aiozk.states import States

    return str(States.CONNECTED)


def _all_states() -> list[str]:
    from aiozk.states import States

    return [States.CONNECTED, States.SUSPENDED, States.LOST, States.READ_ONLY]


class ZooKeeperClient:
    """``backend.client`` of a backend built from a ``zk://`` URL: node operations in its session.

    >>> stat = await backend.client.exists("/config")          # doctest: +SKIP
    >>> data, stat = await backend.client.get_data("/config")   # doctest: +SKIP

    Paths are below the backend's chroot. Every request waits at most
    ``connect_timeout`` for a connection (then
    :class:`aiolocks.BackendUnavailableError`); a read is sent again after a
    dropped connection; a write whose reply was lost raises
    :class:`AmbiguousResult` instead of being sent twice. The server's
    answers are aiozk's exceptions (``aiozk.exc.NoNode``, ``NodeExists``,
    ``BadVersion``, ``NotEmpty``...), except a permission refusal
    (``NoAuth``): :class:`aiolocks.AccessDeniedError`.

    ``watch=`` (where offered) is a callback called at most once, with
    ``(kind, path)``: ``kind`` is ``"created"``, ``"deleted"``, ``"data"``
    or ``"children"``, ``path`` below the chroot. It runs in the event loop
    and must not block. A watch survives a reconnection in the same session
    (re-armed); one set in a session that expires never fires.
    """

    def __init__(self, monitor: SessionMonitor) -> None:
        self._monitor = monitor
        self._link = monitor.link

    def __repr__(self) -> str:
        return f"<ZooKeeperClient session=0x{self.session_id or 0:x} chroot={self.chroot!r}>"

    @property
    def chroot(self) -> str | None:
        """The chroot every path is below (``None``: the root)."""
        return self._link.chroot

    @property
    def session_id(self) -> int | None:
        """The current session id."""
        return self._link.session_id

    @property
    def session_timeout(self) -> float:
        """The session timeout the server granted, in seconds."""
        return self._link.timeout

    @property
    def connected(self) -> bool:
        """A connection is up: requests go out at once."""
        return self._link.connected

    async def _call(self, request: Any) -> Any:
        return await self._monitor.call(request, None, retry=not request.writes_data)

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        container: bool = False,
    ) -> str:
        """Create a node with the backend's default ACL; the path created (below the chroot).

        A missing chroot is created first (as the backend's locks do).

        ``ephemeral`` nodes go with the backend's session; ``sequential``
        appends the server's 10-digit counter; ``container`` makes a
        container node (removed by the server once its last child goes).

        :raises ValueError: ``container`` with ``ephemeral`` or ``sequential``
        :raises aiozk.exc.NodeExists: the node exists
        :raises aiozk.exc.NoNode: the parent does not exist
        """
        if container and (ephemeral or sequential):
            raise ValueError("a container node cannot be ephemeral or sequential")
        acl = self._link.default_acl
        abs_path = self._link.normalize_path(path)
        if container:
            request: Any = CreateContainerRequest(path=abs_path, data=data, acl=acl)
        else:
            flags = (1 if ephemeral else 0) | (2 if sequential else 0)
            request = protocol.CreateRequest(path=abs_path, data=data, acl=acl, flags=flags)
        try:
            response = await self._call(request)
        except zk_exc.NoNode:
            if not await self._make_chroot():
                raise
            response = await self._call(request)
        return self._link.denormalize_path(str(response.path))

    async def _make_chroot(self) -> bool:
        """Create the chroot if it is missing (as the backend's locks do); ``False`` if not."""
        chroot = self._link.chroot
        if not chroot or await self.exists("/") is not None:
            return False
        prefix = ""
        for segment in [s for s in chroot.split("/") if s]:
            prefix = f"{prefix}/{segment}"
            with contextlib.suppress(zk_exc.NodeExists):
                await self._call(
                    protocol.CreateRequest(
                        path=prefix, data=b"", acl=self._link.default_acl, flags=0
                    )
                )
        return True

    async def ensure_path(self, path: str) -> None:
        """Create ``path`` and its missing ancestors as persistent nodes (existing ones kept)."""
        prefix = ""
        for segment in [s for s in path.split("/") if s]:
            prefix = f"{prefix}/{segment}"
            with contextlib.suppress(zk_exc.NodeExists):
                await self.create(prefix)

    async def get_data(self, path: str, *, watch: WatchCallback | None = None) -> tuple[bytes, Any]:
        """``(data, stat)`` of ``path``; ``stat`` is aiozk's ``Stat`` (``version``, ``mzxid``...).

        :param watch: called once when the node's data changes or it is deleted
        :raises aiozk.exc.NoNode: the node does not exist (no watch is left)
        """
        request = protocol.GetDataRequest(path=self._link.normalize_path(path), watch=bool(watch))
        with self._watching(request.path, watch, _DATA_TYPES) as cancel:
            try:
                response = await self._call(request)
            except BaseException:
                cancel()
                raise
        return bytes(response.data or b""), response.stat

    async def set_data(self, path: str, data: bytes, *, version: int = -1) -> Any:
        """Replace the data of ``path`` (only at ``version``, unless -1); its new ``Stat``.

        :raises aiozk.exc.NoNode: the node does not exist
        :raises aiozk.exc.BadVersion: its version is not ``version``
        """
        request = protocol.SetDataRequest(
            path=self._link.normalize_path(path), data=data, version=version
        )
        return (await self._call(request)).stat

    async def exists(self, path: str, *, watch: WatchCallback | None = None) -> Any | None:
        """The ``Stat`` of ``path``, ``None`` if it does not exist.

        :param watch: called once when the node is created, changed or deleted
        """
        request = protocol.ExistsRequest(path=self._link.normalize_path(path), watch=bool(watch))
        with self._watching(request.path, watch, _EXISTS_TYPES) as cancel:
            try:
                response = await self._call(request)
            except zk_exc.NoNode:
                return None  # the server keeps an exists watch on a missing node
            except BaseException:
                cancel()
                raise
        return response.stat

    async def get_children(self, path: str, *, watch: WatchCallback | None = None) -> list[str]:
        """The names of the children of ``path`` (unsorted).

        :param watch: called once when a child is added or removed, or the node deleted
        :raises aiozk.exc.NoNode: the node does not exist (no watch is left)
        """
        request = protocol.GetChildrenRequest(
            path=self._link.normalize_path(path), watch=bool(watch)
        )
        with self._watching(request.path, watch, _CHILD_TYPES) as cancel:
            try:
                response = await self._call(request)
            except BaseException:
                cancel()
                raise
        return list(response.children)

    async def delete(self, path: str, *, version: int = -1) -> None:
        """Delete ``path`` (only at ``version``, unless -1).

        :raises aiozk.exc.NoNode: the node does not exist
        :raises aiozk.exc.NotEmpty: it has children
        :raises aiozk.exc.BadVersion: its version is not ``version``
        """
        await self._call(
            protocol.DeleteRequest(path=self._link.normalize_path(path), version=version)
        )

    @contextlib.contextmanager
    def _watching(self, abs_path: str, watch: WatchCallback | None, types: tuple[int, ...]) -> Any:
        """Register ``watch`` (one shot) before the request goes out; yields its canceller."""
        if watch is None:
            yield _nothing
            return
        link = self._link
        path = link.denormalize_path(abs_path)
        callbacks: list[tuple[int, Callable[[str], object]]] = []

        def cancel() -> None:
            for event_type, callback in callbacks:
                link.remove_watch_callback(event_type, abs_path, callback)
            callbacks.clear()

        for event_type in types:

            def fire(_path: str, kind: str = _EVENT_KINDS[event_type]) -> None:
                if not callbacks:
                    return  # fired already (one server event per watch)
                cancel()
                try:
                    watch(kind, path)
                except Exception:
                    logger.exception("watch callback for %s failed", path)

            callbacks.append((event_type, fire))
            link.add_watch_callback(event_type, abs_path, fire)
        yield cancel


def _nothing() -> None:
    """No watch to cancel."""


_DATA_TYPES: Final = (protocol.WatchEvent.DATA_CHANGED, protocol.WatchEvent.DELETED)
_EXISTS_TYPES: Final = (
    protocol.WatchEvent.CREATED,
    protocol.WatchEvent.DATA_CHANGED,
    protocol.WatchEvent.DELETED,
)
_CHILD_TYPES: Final = (protocol.WatchEvent.CHILDREN_CHANGED, protocol.WatchEvent.DELETED)
