"""The ZooKeeper driver: families mapped to node layouts over :mod:`._internals`.

Layout (below the client's chroot; every parent is a container node)::

    /aiolocks/mutex/<name>/_c_<uuid>-lock-<seq>            Mutex (InterProcessMutex)
    /aiolocks/semaphore-mutex/<name>/_c_<uuid>-lock-<seq>  SemaphoreMutex
    /aiolocks/rwlock/<name>/_c_<uuid>-read-<seq>           ReadWriteLock: one queue,
    /aiolocks/rwlock/<name>/_c_<uuid>-write-<seq>            read and write nodes
    /aiolocks/rwlock/<name>/_c_<uuid>-read@<wseq>-<seq>      downgrade read (CURATOR-621)
    /aiolocks/semaphore/<name>/locks/_c_<uuid>-lock-<seq>  Semaphore turnstile
    /aiolocks/semaphore/<name>/leases/_c_<uuid>-lease-<seq>  the leases
    /aiolocks/leader/<name>/_c_<uuid>-latch-<seq>          LeaderLatch

Each node's data is the participant id (UTF-8). Fencing token = ``czxid`` of
the node (a global, strictly increasing transaction id).

Semaphore (Curator's InterProcessSemaphoreV2, tightened): the caller takes the
turnstile mutex, then for each of its ``count`` leases waits (only the
turnstile holder watches ``leases/``, so there is no herd) until fewer than
``max_leases`` leases exist and creates one. Only the turnstile holder creates
leases and it checks before creating, so there are never more than
``max_leases`` lease nodes; the lease create is refused if the turnstile's
session has changed meanwhile. The turnstile is released at the end, and on
failure the partial leases are deleted (all or nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

import aiozk
from aiozk import exc as zk_exc
from aiozk import protocol
from aiozk.states import States

from .._core.doctor import Diagnosis
from .._core.driver import Capabilities, Family, Grant, Mode, Request
from .._core.errors import BackendUnavailableError
from .._core.options import check_portable_options
from .._core.participants import Participant
from .._core.tasks import TaskSet, wait_done
from ._internals import LockInternals, Node, exclusive_predicate, read_predicate, sort_nodes
from ._protocol import BufferedConnection
from ._session import ConnectionState, SessionChanged, SessionMonitor, next_xid, wait_future

__all__ = ["ZooKeeperDriver", "lock_path"]

logger = logging.getLogger("aiolocks.zookeeper")

#: Part of the session timeout the event loop may be blocked before a hold is
#: reported lost when its body ends: pings stop with the loop, and the server
#: expires a session that was silent for the whole timeout.
STALL_FRACTION: Final = 0.8

ROOT: Final = "/aiolocks"

_KIND: Final = {
    Family.MUTEX: "lock",
    Family.SEMAPHORE_MUTEX: "lock",
    Family.LEADER: "latch",
}

# ZooKeeper refuses these code points in paths (PathUtils.validatePath).
_FORBIDDEN_RANGES: Final = ((0xD800, 0xF8FF), (0xFFF0, 0xFFFF))


def _escape(name: str) -> str:
    """Map a lock name to path characters ZooKeeper accepts; injective.

    ``%`` becomes ``%25``, code points ZooKeeper refuses become ``%uXXXX``
    and those above U+FFFF (surrogate pairs in Java, also refused)
    ``%UXXXXXX``; everything else (including ``/``) is kept, so paths stay
    readable.
    """
    if "%" not in name and not any(_forbidden(ch) for ch in name):
        return name
    out = []
    for ch in name:
        code = ord(ch)
        if ch == "%":
            out.append("%25")
        elif code > 0xFFFF:
            out.append(f"%U{code:06X}")
        elif _forbidden(ch):
            out.append(f"%u{code:04X}")
        else:
            out.append(ch)
    return "".join(out)


def _forbidden(ch: str) -> bool:
    code = ord(ch)
    # Above U+FFFF: Java (the server) sees a surrogate pair, which it refuses.
    return code > 0xFFFF or any(lo <= code <= hi for lo, hi in _FORBIDDEN_RANGES)


@functools.lru_cache(maxsize=4096)
def lock_path(family: Family, name: str) -> str:
    """The container node under which the nodes of lock ``name`` live (below the chroot)."""
    return f"{ROOT}/{family.value}/{_escape(name)}"


class ZooKeeperDriver:
    """Driver protocol implementation for ZooKeeper (see :mod:`aiolocks._core.driver`)."""

    capabilities = Capabilities(fair=True, queue_visible=True, can_lose=True)
    #: a cancelled acquire deletes its node (or sweeps a create whose reply was
    #: lost) in tasks of its own; waits for deletes go through wait_finished
    isolates_acquire = True
    #: a cancelled release deletes again from a task of its own and waits for it
    isolates_release = True

    def __init__(
        self,
        *,
        client: Any | None,
        servers: str,
        chroot: str | None,
        session_timeout: float,
        connect_timeout: float,
        suspended_is_lost: bool,
        description: str,
    ) -> None:
        self._owns_client = client is None
        self._client = client
        self._servers = servers
        self._chroot = chroot
        self._session_timeout = session_timeout
        self._connect_timeout = connect_timeout
        self._suspended_is_lost = suspended_is_lost
        self._description = description
        self._tasks = TaskSet()
        self._grants: dict[Grant, None] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._monitor: SessionMonitor | None = None
        self._internals: LockInternals | None = None
        self._listeners: list[Callable[[ConnectionState], object]] = []

    # -- identity / options -----------------------------------------------------

    def describe(self) -> str:
        """``zk://hosts/chroot``."""
        return self._description

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        """Accept ``fair``, ``lease_time``, ``watchdog`` as no-ops; refuse anything else.

        ZooKeeper locks are always FIFO and have no leases (the session keeps
        them), but code written for Redis runs unchanged here.
        """
        return check_portable_options(family, options, "zk://")

    @property
    def client(self) -> Any:
        """The ``aiozk.ZKClient`` (``None`` before ``open()`` for a URL-built backend)."""
        return self._client

    @property
    def monitor(self) -> SessionMonitor:
        """The session monitor; only after ``open()``."""
        if self._monitor is None:
            raise BackendUnavailableError(f"backend {self._description} is not open")
        return self._monitor

    @property
    def internals(self) -> LockInternals:
        if self._internals is None:
            raise BackendUnavailableError(f"backend {self._description} is not open")
        return self._internals

    # -- lifecycle ------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (URL-built) or adopt the given client; start watching the session."""
        if self._client is None:
            self._client = aiozk.ZKClient(
                self._servers, chroot=self._chroot, session_timeout=self._session_timeout
            )
            _install_fast_reconnect(self._client, self._tasks)
        client = self._client
        session = client.session
        if not session.started or session.state != "connected":
            try:
                await asyncio.wait_for(client.start(), self._connect_timeout)
            except (TimeoutError, OSError, zk_exc.ZKError) as exc:
                if self._owns_client:
                    await _abort_client(client)
                    self._client = None
                raise BackendUnavailableError(
                    f"cannot connect to ZooKeeper at {self._description} within "
                    f"{self._connect_timeout:g} s (connect_timeout)"
                ) from exc
            except BaseException:
                if self._owns_client:
                    await _abort_client(client)
                    self._client = None
                raise
        monitor = SessionMonitor(
            client,
            connect_timeout=self._connect_timeout,
            suspended_is_lost=self._suspended_is_lost,
            on_lost=self._on_lost,
        )
        for listener in self._listeners:
            monitor.add_listener(listener)
        self._monitor = monitor
        self._internals = LockInternals(monitor, self._tasks)
        monitor.start()
        self._ticker = asyncio.get_running_loop().create_task(
            self._keep_grants_valid(), name="aiolocks-zk-validity"
        )

    def _horizon(self) -> float:
        """How long from now our holds are vouched for while the loop keeps running."""
        client = self._client
        timeout = float(getattr(client.session, "timeout", 0) or 0) if client else 0.0
        return time.monotonic() + STALL_FRACTION * (timeout or self._session_timeout)

    async def _keep_grants_valid(self) -> None:
        """Move every grant's ``valid_until`` on while the event loop runs.

        Heartbeats run in this loop too: if it is blocked for most of the
        session timeout, the server may expire the session before we could
        hear about it. This ticker stops with the loop, so when a body ends
        after such a stall the core finds ``valid_until`` passed and reports
        the hold lost instead of letting it pass silently.
        """
        while True:
            horizon = self._horizon()
            for grant in self._grants:
                grant.valid_until = horizon
            client = self._client
            timeout = float(getattr(client.session, "timeout", 0) or 0) if client else 0.0
            await asyncio.sleep((timeout or self._session_timeout) / 8)

    async def close(self) -> None:
        """Stop background work; close the client only if we made it."""
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        monitor, self._monitor = self._monitor, None
        # Deletes still pending (server unreachable) get a bounded chance;
        # an owned session's close removes every ephemeral node anyway.
        if len(self._tasks):
            pending = asyncio.ensure_future(self._tasks.drain(cancel=False))
            await asyncio.wait((pending,), timeout=self._connect_timeout)
            if not pending.done():
                pending.cancel()
        if monitor is not None:
            await monitor.stop()
        await self._tasks.drain(cancel=True)
        client = self._client
        if self._owns_client and client is not None:
            self._client = None
            if client.session.state == "connected":
                try:
                    await asyncio.wait_for(client.close(), self._connect_timeout)
                except Exception:
                    logger.warning("closing the ZooKeeper session failed", exc_info=True)
                    await _abort_client(client)
            else:
                await _abort_client(client)

    async def diagnose(self) -> Diagnosis:
        """``backend.doctor()``'s findings for this ensemble (see :mod:`._doctor`)."""
        from ._doctor import diagnose_zookeeper

        return await diagnose_zookeeper(self, ROOT)

    # -- loss -------------------------------------------------------------------------

    def _on_lost(self, session_id: int | None, reason: str) -> None:
        for grant in list(self._grants):
            node = grant.handle
            assert isinstance(node, Node)
            if session_id is None or node.session_id == session_id or self._suspended_is_lost:
                grant.mark_lost(reason)

    def _grant(self, request: Request, node: Node) -> Grant:
        assert node.czxid is not None
        grant = Grant(request, node.czxid, node)
        grant.valid_until = self._horizon()
        self._grants[grant] = None
        return grant

    # -- acquire / release --------------------------------------------------------------

    async def acquire(self, request: Request, deadline: float | None) -> list[Grant] | None:
        """Take ``request.count`` holds (see the driver contract)."""
        internals = self.internals
        data = request.participant.encode("utf-8", "surrogatepass")
        parent = lock_path(request.family, request.name)
        if request.family is Family.SEMAPHORE:
            nodes = await self._acquire_leases(parent, request, data, deadline)
            if nodes is None:
                return None
            return [self._grant(request, node) for node in nodes]
        if request.family is Family.READ_WRITE:
            if request.mode is Mode.READ:
                anchor = None
                if request.downgrade_of is not None:
                    held = request.downgrade_of.handle
                    assert isinstance(held, Node)
                    anchor = held.seq
                node = await internals.acquire(
                    parent, "read", data, deadline, read_predicate, anchor=anchor
                )
            else:
                node = await internals.acquire(parent, "write", data, deadline, exclusive_predicate)
        else:
            node = await internals.acquire(
                parent, _KIND[request.family], data, deadline, exclusive_predicate
            )
        if node is None:
            return None
        # No await between the grant and its return: the core records it at once.
        return [self._grant(request, node)]

    async def _acquire_leases(
        self, parent: str, request: Request, data: bytes, deadline: float | None
    ) -> list[Node] | None:
        internals = self.internals
        leases_dir = f"{parent}/leases"
        while True:
            turnstile = await internals.acquire(
                f"{parent}/locks", "lock", data, deadline, exclusive_predicate
            )
            if turnstile is None:
                return None
            leases: list[Node] = []
            try:
                while len(leases) < request.count:
                    if not await self._wait_for_room(leases_dir, request.max_leases, deadline):
                        break
                    leases.append(
                        await internals.create(
                            leases_dir, "lease", data, deadline, session_id=turnstile.session_id
                        )
                    )
            except (SessionChanged, TimeoutError):
                # The turnstile's session is gone (its partial leases went with
                # it), or time is up during a create: start over, or give up.
                pass
            except BaseException:
                # Cancelled or failed: all or nothing, give back what we took.
                # Both deletes run in tasks of their own; nothing is skipped.
                for lease in leases:
                    internals.spawn_delete(lease)
                internals.spawn_delete(turnstile)
                raise
            try:
                # Release the turnstile before returning, so a caller sees it gone.
                await internals.delete(turnstile)
            except BaseException:
                # Cancelled while releasing the turnstile (the delete itself
                # goes on): we will not return the leases, so give them back.
                for lease in leases:
                    internals.spawn_delete(lease)
                raise
            if len(leases) == request.count:
                return leases
            for lease in leases:  # partial: all or nothing
                internals.spawn_delete(lease)
            if deadline is not None and time.monotonic() >= deadline:
                return None
            # only a lost turnstile session gets here with time left: retry

    async def _wait_for_room(
        self, leases_dir: str, max_leases: int, deadline: float | None
    ) -> bool:
        """As turnstile holder, wait until fewer than ``max_leases`` leases exist."""
        internals = self.internals
        monitor = self.monitor
        watch = False
        while True:
            waker = monitor.new_waker() if watch else None
            target = internals._abs(leases_dir)
            session = self.client.session

            def wake(_path: object, waker: asyncio.Future[None] | None = waker) -> None:
                if waker is not None and not waker.done():
                    waker.set_result(None)

            if watch:
                session.add_watch_callback(protocol.WatchEvent.CHILDREN_CHANGED, target, wake)
            try:
                try:
                    children = await internals.list_children(leases_dir, deadline, watch=watch)
                except TimeoutError:
                    return False
                count = len(sort_nodes(leases_dir, children))
                if count < max_leases:
                    return True
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                if waker is None:
                    # Full: list again, this time with a child watch (only the
                    # turnstile holder ever watches leases/, so no herd).
                    watch = True
                    continue
                if not await wait_future(waker, deadline):
                    return False
            finally:
                if watch:
                    session.remove_watch_callback(
                        protocol.WatchEvent.CHILDREN_CHANGED, target, wake
                    )
                if waker is not None:
                    waker.cancel()

    async def release(self, grant: Grant) -> None:
        """Delete the grant's node; idempotent; a lost grant is cleaned up in the background."""
        self._grants.pop(grant, None)
        node = grant.handle
        assert isinstance(node, Node)
        internals = self.internals
        if grant.lost:
            # The hold is already gone as far as the user is concerned; the
            # node (if the session survived after all) is deleted without
            # making the caller wait for a reconnection.
            internals.spawn_delete(node)
            return
        if not await internals.delete_isolated(node):
            # Our node was gone before we deleted it (deleted behind our back,
            # or with an expired session): the hold had been lost.
            grant.mark_lost("its lock node was already gone when it was released")

    # -- inspection -----------------------------------------------------------------------

    async def participants(self, name: str, family: Family) -> list[Participant]:
        """Holders first, then waiters in queue order, each with its node's data."""
        internals = self.internals
        parent = lock_path(family, name)
        deadline = time.monotonic() + self._connect_timeout
        if family is Family.SEMAPHORE:
            leases = sort_nodes(
                f"{parent}/leases", await internals.list_children(f"{parent}/leases", deadline)
            )
            queue = sort_nodes(
                f"{parent}/locks", await internals.list_children(f"{parent}/locks", deadline)
            )
            entries = [(n, True) for n in leases] + [(n, False) for n in queue]
        else:
            nodes = sort_nodes(parent, await internals.list_children(parent, deadline))
            entries = []
            for index, node in enumerate(nodes):
                predicate = read_predicate if node.kind == "read" else exclusive_predicate
                entries.append((node, predicate(nodes, index)[0]))
            entries.sort(key=lambda e: not e[1])  # stable: holders first, order kept
        result: list[Participant] = []
        for node, holds in entries:
            found = await internals.get_data(node.path, deadline)
            if found is None:
                continue  # released meanwhile
            data, stat = found
            if family is Family.SEMAPHORE:
                mode = "lease"  # holders and turnstile waiters alike
            else:
                mode = {"read": "read", "write": "write"}.get(node.kind, "exclusive")
            result.append(
                Participant(
                    id=data.decode("utf-8", "replace"),
                    is_holder=holds,
                    fencing_token=int(stat.created_zxid) if holds else None,
                    mode=mode,
                    node=node.path,
                )
            )
        return result

    # -- connection states (public through ZooKeeperBackend) -------------------------------

    def add_listener(self, listener: Callable[[ConnectionState], object]) -> Callable[[], None]:
        """Register a connection-state listener (also before ``open()``)."""
        self._listeners.append(listener)
        remove_monitor = self._monitor.add_listener(listener) if self._monitor else None

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
            if remove_monitor is not None:
                remove_monitor()
            elif self._monitor is not None:
                # added before open(): open() registered it on the monitor
                self._monitor._listeners[:] = [
                    x for x in self._monitor._listeners if x is not listener
                ]

        return remove

    def states(self) -> AsyncIterator[ConnectionState]:
        """Async iterator over connection-state changes (after ``open()``)."""
        return self.monitor.states()


def _install_fast_reconnect(client: Any, tasks: TaskSet) -> None:
    """Replace aiozk's server search on a client we own with one that retries sooner.

    aiozk waits ``2**n`` seconds (up to 60 s) between rounds over the server
    list. During a leader election every server refuses clients for a few
    seconds, so the next round can come after our session (or our
    client-side expiry timer) has run out, and a hold that the ensemble kept
    is lost. This version retries after 50 ms, doubling up to a quarter of
    the session timeout (at most 2 s), with jitter; it also logs refused
    connections at DEBUG instead of a traceback per attempt.

    Its connections read replies with :class:`BufferedConnection` and run
    the callbacks of a node watch event at once (aiozk schedules each with
    ``call_soon``: one more event-loop pass between a release and the wake-up
    of the next waiter; our callbacks only resolve futures). A client the
    user gave us keeps aiozk's behaviour.
    """
    session = client.session

    def dispatch(event: Any) -> None:
        if not event.type:
            session.event_dispatch(event)  # session state events: aiozk's handling
            return
        for callback in list(session.watch_callbacks.get((event.type, event.path), ())):
            try:
                callback(event.path)
            except Exception:
                logger.exception("watch callback for %s failed", event.path)

    async def make_connection(host: str, port: Any) -> Any:
        conn = BufferedConnection(
            host, port, watch_handler=dispatch, read_timeout=session.read_timeout
        )
        try:
            await conn.connect()
        except Exception as exc:
            logger.debug("cannot connect to ZooKeeper %s:%s: %r", host, port, exc)
            return None
        return conn

    async def find_server(allow_read_only: bool) -> None:
        delay = 0.05
        cap = min(2.0, max(0.1, float(session.timeout or 10.0) / 4))
        conn = None
        while conn is None:
            for host, port in random.sample(session.hosts, len(session.hosts)):
                conn = await make_connection(host, port)
                if conn is None:
                    continue
                if conn.start_read_only and not allow_read_only:
                    conn.writer.close()  # a read-only server: not for locks
                    conn = None
                    continue
                break
            if conn is None:
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(cap, delay * 2)
        old_conn, session.conn = session.conn, conn
        if old_conn is not None:
            # Closing the old connection fails its pending requests (our
            # callers then retry or reconcile); owned by the driver's task set.
            tasks.spawn(old_conn.close(session.timeout), name="aiolocks-zk-close-old-conn")

    session.find_server = find_server

    async def establish_session() -> None:
        # aiozk declares the session LOST whenever the server closes the
        # handshake without an answer, which a server does while its
        # ensemble elects a leader (or when it is behind our zxid), and then
        # abandons a session the ensemble still keeps: every hold of it is
        # lost for nothing. Like the Java client, try the next server
        # instead. repair_loop bounds this by the session timeout; a server
        # that answers "no such session" (session id 0) still means LOST.
        while True:
            response = await session.conn.send_connect(
                protocol.ConnectRequest(
                    protocol_version=0,
                    last_seen_zxid=session.last_zxid or 0,
                    timeout=int((session.timeout or 0) * 1000),
                    session_id=session.session_id or 0,
                    password=session.password,
                    read_only=session.allow_read_only,
                )
            )
            if response is not None:
                break
            await asyncio.sleep(0.05 * random.uniform(0.8, 1.2))
            await find_server(session.allow_read_only)
        zxid, reply = response
        session.last_zxid = zxid
        if reply.session_id == 0:
            if session.state.current_state != States.LOST:
                session.state.transition_to(States.LOST)
            raise zk_exc.SessionLost()
        session.session_id = reply.session_id
        session.password = reply.password
        session.timeout = reply.timeout / 1000

    session.establish_session = establish_session

    async def set_existing_watches() -> None:
        # aiozk re-arms watches with Session.send, which waits for CONNECTED
        # without a bound. If the fresh connection drops before the reply
        # (another client took the session over, the server restarted), the
        # repair loop, the only thing that can reconnect, waits for itself
        # forever and the backend never reconnects. Send on the connection
        # itself, bounded; on failure suspend, so the loop repairs again.
        # Our waiters re-list after every reconnect, so a lost SetWatches
        # costs nothing.
        if not session.watch_callbacks:
            return
        request = protocol.SetWatchesRequest(
            relative_zxid=session.last_zxid or 0,
            data_watches=[],
            exist_watches=[],
            child_watches=[],
        )
        for event_type, path in list(session.watch_callbacks):
            if event_type == protocol.WatchEvent.CREATED:
                request.exist_watches.append(path)
            elif event_type == protocol.WatchEvent.DATA_CHANGED:
                request.data_watches.append(path)
            elif event_type == protocol.WatchEvent.CHILDREN_CHANGED:
                request.child_watches.append(path)
        conn = session.conn
        reply = conn.send(request, xid=next_xid(session))
        if (
            await wait_done(reply, float(session.timeout or 10.0) / 2)
            and not reply.cancelled()
            and reply.exception() is None
        ):
            return
        logger.debug("re-arming watches on %s:%s failed; reconnecting", conn.host, conn.port)
        if session.conn is conn and not session.closing:
            if session.state.current_state in (States.CONNECTED, States.READ_ONLY):
                with contextlib.suppress(zk_exc.InvalidStateTransition):
                    session.state.transition_to(States.SUSPENDED)
            conn.abort(zk_exc.ConnectError)
        if not reply.done():
            reply.cancel()

    session.set_existing_watches = set_existing_watches


async def _abort_client(client: Any) -> None:
    """Tear down an aiozk client that is not (or no longer) connected.

    ``ZKClient.close()`` first sends a CloseRequest and waits up to a whole
    session timeout for a connection; with no server that only delays and
    then raises. Stop its tasks and sockets directly instead.
    """
    session = client.session
    session.closing = True
    tasks = []
    if session.repair_loop_task is not None:
        session.repair_loop_task.cancel()
        tasks.append(session.repair_loop_task)
    if session.heartbeat_handle is not None:
        session.heartbeat_handle.cancel()
        session.heartbeat_handle = None
    if session.heartbeat_task is not None and not session.heartbeat_task.done():
        session.heartbeat_task.cancel()
        tasks.append(session.heartbeat_task)
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    conn = session.conn
    if conn is not None:
        conn.abort(zk_exc.ConnectError)
        if conn.read_loop_task is not None and not conn.read_loop_task.done():
            conn.read_loop_task.cancel()
            await asyncio.gather(conn.read_loop_task, return_exceptions=True)
        conn.closing = True
        if conn.writer is not None:
            conn.writer.close()
    session.started = False
    session.closing = False
