"""The ZooKeeper driver: families mapped to node layouts over :mod:`._internals`.

Layout (below the client's chroot; every parent is a container node; the
names and ordering are Curator 5.x's, see :mod:`._layout`)::

    /aiolocks/mutex/<name>/_c_<uuid>-lock-<seq>              Mutex (InterProcessMutex)
    /aiolocks/semaphore-mutex/<name>/locks/..., /leases/...  SemaphoreMutex (a semaphore
                                                             with one lease, as in Curator)
    /aiolocks/rwlock/<name>/_c_<uuid>-__READ__<seq>          ReadWriteLock: one queue,
    /aiolocks/rwlock/<name>/_c_<uuid>-__WRIT__<seq>            read and write nodes
    /aiolocks/rwlock/<name>/_c_<uuid>-__READ__<wseq>-<seq>     downgrade read (CURATOR-621)
    /aiolocks/semaphore/<name>/locks/_c_<uuid>-lock-<seq>    Semaphore turnstile
    /aiolocks/semaphore/<name>/leases/_c_<uuid>-lease-<seq>  the leases
    /aiolocks/leader/<name>/_c_<uuid>-latch-<seq>            LeaderLatch

With ``layout=curator`` the folder is ``/<name>`` itself, as in Curator.

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
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from aiozk import protocol

from .._core.doctor import Diagnosis
from .._core.driver import Attempt, Capabilities, Family, Grant, Mode, Request
from .._core.errors import BackendUnavailableError
from .._core.options import check_portable_options
from .._core.participants import Participant
from .._core.tasks import TaskSet
from ._client import AiozkLink, Link, OwnLink, ZooKeeperClient
from ._connection import Credential, Session, parse_hosts
from ._internals import (
    HoldWatch,
    LockInternals,
    Node,
    QueueEntry,
    exclusive_predicate,
    read_predicate,
    sort_nodes,
)
from ._layout import DEFAULT_LAYOUT, ROOT, check_curator_name, lock_path
from ._records import ZooKeeperRecords
from ._session import ConnectionState, SessionChanged, SessionMonitor, wait_own

if TYPE_CHECKING:
    from ._admin import ZooKeeperAdmin

__all__ = ["ZooKeeperDriver", "lock_path"]

logger = logging.getLogger("aiolocks.zookeeper")

#: Part of the session timeout the event loop may be blocked before a hold is
#: reported lost when its body ends: pings stop with the loop, and the server
#: expires a session that was silent for the whole timeout.
STALL_FRACTION: Final = 0.8

_KIND: Final = {
    Family.MUTEX: "lock",
    Family.LEADER: "latch",
}

#: the families kept as Curator's InterProcessSemaphoreV2 (turnstile + leases)
_LEASED: Final = (Family.SEMAPHORE, Family.SEMAPHORE_MUTEX)


class ZooKeeperDriver:
    """Driver protocol implementation for ZooKeeper (see :mod:`aiolocks._core.driver`)."""

    capabilities = Capabilities(fair=True, queue_visible=True, can_lose=True)

    def __init__(
        self,
        *,
        given: AiozkLink | None,
        servers: str,
        chroot: str | None,
        session_timeout: float,
        connect_timeout: float,
        suspended_is_lost: bool,
        description: str,
        layout: str = DEFAULT_LAYOUT,
        credentials: Sequence[Credential] = (),
        acl: list[Any] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        #: the session of an ``aiozk.ZKClient`` the application gave us
        self._given = given
        #: the session the recipe runs on; set by ``open()``
        self._link: Link | None = None
        #: ``backend.client`` of a URL-built backend; set by ``open()``
        self._client: ZooKeeperClient | None = None
        self._servers = servers
        self._chroot = chroot
        self._session_timeout = session_timeout
        self._connect_timeout = connect_timeout
        self._suspended_is_lost = suspended_is_lost
        self._description = description
        #: where names map to paths (see :mod:`._layout`)
        self._layout = layout
        #: ``addauth`` on every connection of our own session (see :mod:`._auth`)
        self._credentials = tuple(credentials)
        #: the ACL of every node we create (None: world-writable)
        self._acl = acl
        #: TLS to the ensemble's secureClientPort
        self._ssl_context = ssl_context
        #: the engine's owned task set (given to open())
        self._tasks: TaskSet | None = None
        #: held grants and the watch that reports their node's deletion
        self._grants: dict[Grant, HoldWatch | None] = {}
        self._ticker: asyncio.TimerHandle | None = None
        self._monitor: SessionMonitor | None = None
        self._internals: LockInternals | None = None
        self._listeners: list[Callable[[ConnectionState], object]] = []
        #: the record store (groups, latches, ``once``); used after ``open()``
        self._records = ZooKeeperRecords(
            lambda: self.monitor,
            lambda: self.internals,
            self._spawn,
        )

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

    def check_name(self, name: str) -> None:
        """Refuse, before any I/O, a name the layout cannot map to a path.

        :raises InvalidLockNameError: on ``layout=curator``, a name ZooKeeper
            cannot hold as a path (the default layout escapes instead)
        """
        if self._layout == "curator":
            check_curator_name(name)

    @property
    def layout(self) -> str:
        """``"aiolocks"`` or ``"curator"`` (see :mod:`._layout`)."""
        return self._layout

    def path_of(self, family: Family, name: str) -> str:
        """The folder of lock ``name`` in this backend's layout (below the chroot)."""
        return lock_path(family, name, self._layout)

    def records(self) -> ZooKeeperRecords:
        """The record store under the coordination recipes (see :mod:`._records`)."""
        return self._records

    @property
    def client(self) -> Any:
        """The ``aiozk.ZKClient`` given, else our :class:`ZooKeeperClient` (after ``open()``)."""
        return self._given.client if self._given is not None else self._client

    @property
    def link(self) -> Link | None:
        """The session the recipe runs on (``None`` before ``open()``)."""
        return self._link

    @property
    def session(self) -> Session | None:
        """The backend's own session (``None`` before ``open()`` and on a given client)."""
        link = self._link
        return link.session if isinstance(link, OwnLink) else None

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

    async def open(self, tasks: TaskSet) -> None:
        """Start the backend's own session, or wait for the given client's to be connected."""
        self._tasks = tasks
        if self._link is not None:
            return
        link: Link
        if self._given is not None:
            link = self._given
        else:
            session = Session(
                parse_hosts(self._servers),
                timeout=self._session_timeout,
                events=None,
                credentials=self._credentials,
                ssl_context=self._ssl_context,
            )
            link = OwnLink(session, chroot=self._chroot, default_acl=self._acl)
        try:
            await link.start(self._connect_timeout)
        except TimeoutError as exc:
            what = "the given aiozk client is not connected" if self._given else "cannot connect"
            raise BackendUnavailableError(
                f"{what} to ZooKeeper at {self._description} within "
                f"{self._connect_timeout:g} s (connect_timeout)"
            ) from exc
        self._link = link
        monitor = SessionMonitor(
            link,
            connect_timeout=self._connect_timeout,
            suspended_is_lost=self._suspended_is_lost,
            on_lost=self._on_lost,
        )
        for listener in self._listeners:
            monitor.add_listener(listener)
        self._monitor = monitor
        if self._given is None:
            self._client = ZooKeeperClient(monitor)
        self._internals = LockInternals(monitor)
        monitor.start()

    def _horizon(self) -> float:
        """How long from now our holds are vouched for while the loop keeps running."""
        link = self._link
        timeout = link.timeout if link else 0.0
        return time.monotonic() + STALL_FRACTION * (timeout or self._session_timeout)

    def _keep_grants_valid(self) -> None:
        """Move every grant's ``valid_until`` on while the event loop runs.

        Heartbeats run in this loop too: if it is blocked for most of the
        session timeout, the server may expire the session before we could
        hear about it. This timer stops with the loop, so when a body ends
        after such a stall the core finds ``valid_until`` passed and reports
        the hold lost instead of letting it pass silently. A timer callback,
        not a task: it runs only while there are grants.
        """
        self._ticker = None
        if not self._grants:
            return
        horizon = self._horizon()
        for grant in self._grants:
            grant.valid_until = horizon
        link = self._link
        timeout = link.timeout if link else 0.0
        self._ticker = asyncio.get_running_loop().call_later(
            (timeout or self._session_timeout) / 8, self._keep_grants_valid
        )

    async def close(self) -> None:
        """Stop background work; close the session only if it is our own."""
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
        if self._monitor is not None:
            # an owned session's close removes the ephemeral records; a given
            # client's session stays, so they are deleted here
            await self._records.close(delete=self._given is not None, timeout=self._connect_timeout)
        monitor, self._monitor = self._monitor, None
        # The engine has finished its tasks (deletes included); an owned
        # session's close removes every ephemeral node anyway.
        if monitor is not None:
            await monitor.stop()
        self._client = None
        link, self._link = self._link, None
        if link is not None:
            await link.close(self._connect_timeout)

    async def diagnose(self) -> Diagnosis:
        """``backend.doctor()``'s findings for this ensemble (see :mod:`._doctor`)."""
        from ._doctor import diagnose_zookeeper

        return await diagnose_zookeeper(self, ROOT)

    # -- loss -------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Background work (cleanups, watch reads) in the engine's task set (given to ``open``)."""
        tasks = self._tasks
        if tasks is None:
            coro.close()
            raise RuntimeError("the ZooKeeper driver was not opened")
        return tasks.spawn(coro, name=name)

    def _spawn_check(self, coro: Coroutine[Any, Any, None]) -> object:
        return self._spawn(coro, "aiolocks-zk-watch-own-node")

    def _on_lost(self, session_id: int | None, reason: str) -> None:
        self._records.session_lost(session_id, reason, all_entries=self._suspended_is_lost)
        for grant in list(self._grants):
            node = grant.handle
            assert isinstance(node, Node)
            if session_id is None or node.session_id == session_id or self._suspended_is_lost:
                grant.mark_lost(reason)

    def _grant(self, request: Request, node: Node, guard: HoldWatch | None) -> Grant:
        assert node.czxid is not None
        grant = Grant(request, node.czxid, node)
        grant.valid_until = self._horizon()
        self._grants[grant] = guard
        if guard is not None:
            guard.attach(grant, self._spawn_check)
        if self._ticker is None:
            # Runs while there are grants to vouch for; a new one starts it again.
            self._keep_grants_valid()
        return grant

    # -- acquire / release --------------------------------------------------------------

    def begin(self, request: Request) -> Attempt:
        """A queue entry with a fresh uid (Curator's protected mode); no I/O."""
        data = request.participant.encode("utf-8", "surrogatepass")
        parent = self.path_of(request.family, request.name)
        if request.family in _LEASED:
            entry = QueueEntry(f"{parent}/locks", "lock", data, exclusive_predicate)
            return _ZkAttempt(request, entry, leases_dir=f"{parent}/leases", data=data)
        if request.family is Family.READ_WRITE:
            if request.mode is Mode.READ:
                anchor = None
                if request.downgrade_of is not None:
                    held = request.downgrade_of.handle
                    assert isinstance(held, Node)
                    anchor = held.seq
                entry = QueueEntry(parent, "read", data, read_predicate, anchor=anchor)
            else:
                entry = QueueEntry(parent, "write", data, exclusive_predicate)
        else:
            entry = QueueEntry(parent, _KIND[request.family], data, exclusive_predicate)
        return _ZkAttempt(request, entry)

    async def try_once(self, attempt: Attempt) -> list[Grant] | None:
        """One step of the recipe; for a semaphore, the turnstile then the leases."""
        a = cast(_ZkAttempt, attempt)
        internals = self.internals
        if a.leases_dir is not None:
            return await self._try_leases(a)
        if not await internals.try_take(a.entry, a.deadline):
            return None
        node = a.entry.node
        assert node is not None
        a.entry.node = None  # the grant owns it now
        # No await between the grant and its return: the engine records it at once.
        return [self._grant(a.request, node, a.entry.take_guard())]

    async def _try_leases(self, a: _ZkAttempt) -> list[Grant] | None:
        """Semaphore (InterProcessSemaphoreV2): hold the turnstile, create leases, let go."""
        internals = self.internals
        assert a.leases_dir is not None
        if not a.turnstile_held:
            if not await internals.try_take(a.entry, a.deadline):
                return None
            # The turnstile is let go within this attempt: no loss watch on it.
            a.entry.drop_guard()
            a.turnstile_held = True
        turnstile = a.entry.node
        assert turnstile is not None
        request = a.request
        try:
            # InterProcessSemaphoreMutex is InterProcessSemaphoreV2 with one lease.
            max_leases = 1 if request.family is Family.SEMAPHORE_MUTEX else request.max_leases
            while len(a.leases) < request.count:
                if not await self._room(a, max_leases):
                    return None
                pending = a.pending = QueueEntry(a.leases_dir, "lease", a.data, exclusive_predicate)
                node, _ = await internals.create_entry(
                    pending, a.deadline, session_id=turnstile.session_id, prefetch=False
                )
                a.pending = None
                a.leases.append(node)
        except SessionChanged:
            # The turnstile's session is gone, its partial leases with it:
            # queue again for the turnstile.
            a.leases.clear()
            a.pending = None
            a.turnstile_held = False
            a.entry.requeue()
            return None
        except TimeoutError:
            return None  # the deadline passed; abandon() gives back what we took
        # Let go of the turnstile before returning, so a caller sees it gone.
        await internals.delete(turnstile)
        a.entry.node = None
        leases, a.leases = a.leases, []
        # Each lease reads its own node with a watch (in the background), so
        # that its deletion behind our back is reported while held.
        return [self._grant(request, node, HoldWatch(internals, node)) for node in leases]

    async def _room(self, a: _ZkAttempt, max_leases: int) -> bool:
        """As turnstile holder: fewer than ``max_leases`` leases exist now.

        When full, a child watch is armed first (only the turnstile holder
        ever watches ``leases/``, so no herd) and :meth:`wait_for_change`
        waits for it.
        """
        internals = self.internals
        assert a.leases_dir is not None
        self._unwatch_room(a)
        children = await internals.list_children(a.leases_dir, a.deadline)
        if len(sort_nodes(a.leases_dir, children)) < max_leases:
            return True
        waker = self.monitor.new_waker()
        target = internals._abs(a.leases_dir)

        def wake(_path: object) -> None:
            if not waker.done():
                waker.set_result(None)

        a.room = (waker, target, wake)
        internals.link.add_watch_callback(protocol.WatchEvent.CHILDREN_CHANGED, target, wake)
        children = await internals.list_children(a.leases_dir, a.deadline, watch=True)
        if len(sort_nodes(a.leases_dir, children)) < max_leases:
            self._unwatch_room(a)
            return True
        return False

    def _unwatch_room(self, a: _ZkAttempt) -> None:
        room, a.room = a.room, None
        if room is not None:
            waker, target, wake = room
            if self._link is not None:
                self._link.remove_watch_callback(protocol.WatchEvent.CHILDREN_CHANGED, target, wake)
            if self._monitor is not None:
                self._monitor.drop_waker(waker)
            else:
                waker.cancel()

    def wait_for_change(self, attempt: Attempt, bound: float | None) -> Coroutine[Any, Any, None]:
        """Wait on the watched predecessor (or the leases' child watch).

        Hands back the recipe's wait itself for a queued entry: one
        coroutine frame less per waiting task.
        """
        a = cast(_ZkAttempt, attempt)
        if a.room is None and not a.turnstile_held:
            return self.internals.wait(a.entry, bound)
        return self._wait_room(a, bound)

    async def _wait_room(self, a: _ZkAttempt, bound: float | None) -> None:
        if a.room is not None:
            waker = a.room[0]
            await wait_own(waker, None if bound is None else time.monotonic() + bound)
            self._unwatch_room(a)
            return
        # a turnstile holder between two tries: no wait

    async def abandon(self, attempt: Attempt) -> None:
        """Delete every node the attempt made (or sweep for one whose create went unanswered).

        Without a connection (now, or within ``connect_timeout``) the deletes
        go on in the background (the engine's task set) until the session is
        back or gone, taking its ephemeral nodes with it; the caller does not
        wait for a reconnection.
        """
        a = cast(_ZkAttempt, attempt)
        self._unwatch_room(a)
        link = self._link
        if link is None or not link.connected:
            self._spawn(self._abandon_now(a), f"aiolocks-zk-abandon:{a.entry.parent}")
            return
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._abandon_now(a)
        except TimeoutError:
            self._spawn(self._abandon_now(a), f"aiolocks-zk-abandon:{a.entry.parent}")

    async def _abandon_now(self, a: _ZkAttempt) -> None:
        internals = self.internals
        while a.leases:
            await internals.delete(a.leases[0])
            a.leases.pop(0)
        if a.pending is not None:
            await internals.give_up(a.pending)
            a.pending = None
        await internals.give_up(a.entry)
        a.turnstile_held = False

    def finish(self, attempt: Attempt) -> None:
        """Drop watch callbacks and wake-up futures."""
        a = cast(_ZkAttempt, attempt)
        self._unwatch_room(a)
        a.entry.drop_guard()
        if self._internals is not None:
            self._internals.unwatch(a.entry)

    async def release(self, grant: Grant) -> bool:
        """Delete the grant's node; ``False`` when it was already gone."""
        guard = self._grants.pop(grant, None)
        if guard is not None:
            guard.close()  # our own delete is no loss
        if not self._grants and self._ticker is not None:
            self._ticker.cancel()  # nothing left to vouch for
            self._ticker = None
        node = grant.handle
        assert isinstance(node, Node)
        internals = self.internals
        if grant.lost:
            # The hold is already gone as far as the user is concerned; the
            # node (if the session survived after all) is deleted without
            # making the caller wait for a reconnection.
            self._spawn(internals.delete(node), f"aiolocks-zk-delete:{node.path}")
            return True
        try:
            async with asyncio.timeout(self._connect_timeout):
                return await internals.delete(node)
        except TimeoutError:
            # No connection: the delete goes on until the session is back or gone.
            self._spawn(internals.delete(node), f"aiolocks-zk-delete:{node.path}")
            return True

    # -- inspection -----------------------------------------------------------------------

    def admin(self) -> ZooKeeperAdmin:
        """Listing and force-release (``aiolocks list``/``break``)."""
        from ._admin import ZooKeeperAdmin

        return ZooKeeperAdmin(self, self._connect_timeout)

    async def participants(self, name: str, family: Family) -> list[Participant]:
        """Holders first, then waiters in queue order, each with its node's data."""
        internals = self.internals
        parent = self.path_of(family, name)
        deadline = time.monotonic() + self._connect_timeout
        if family in _LEASED:
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
            elif family is Family.SEMAPHORE_MUTEX:
                mode = "exclusive"
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
                self._monitor.remove_listener(listener)

        return remove

    def states(self) -> AsyncIterator[ConnectionState]:
        """Async iterator over connection-state changes (after ``open()``)."""
        return self.monitor.states()


class _ZkAttempt(Attempt):
    """One acquire: its queue entry and, for a semaphore, the leases taken so far."""

    __slots__ = ("data", "entry", "leases", "leases_dir", "pending", "room", "turnstile_held")

    def __init__(
        self,
        request: Request,
        entry: QueueEntry,
        *,
        leases_dir: str | None = None,
        data: bytes = b"",
    ) -> None:
        super().__init__(request)
        self.entry = entry
        self.leases_dir = leases_dir
        self.data = data
        self.leases: list[Node] = []
        #: a lease being created (its uid, to sweep for it if the reply is lost)
        self.pending: QueueEntry | None = None
        self.turnstile_held = False
        self.room: tuple[asyncio.Future[None], str, Callable[[object], None]] | None = None
