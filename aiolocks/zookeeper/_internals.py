"""Lock internals: Curator's ``LockInternals`` on asyncio, written once for every primitive.

The recipe (ZooKeeper's "Locks" recipe, as Apache Curator implements it in
``LockInternals`` + ``StandardLockInternalsDriver``)::

    /aiolocks/mutex/orders/42                   container parent (reaped when empty)
        _c_<uuid-A>-lock-0000000007   <- holder (lowest sequence)
        _c_<uuid-B>-lock-0000000008   -- watches ...07 (get_data + watch)
        _c_<uuid-C>-lock-0000000009   -- watches ...08

1. Create an ephemeral-sequential node whose name carries a fresh per-attempt
   uuid ("protected" mode): if the reply to the create is lost, list the
   parent and adopt the node with our uuid instead of creating a second one,
   but only if its ``ephemeralOwner`` is our current session.
2. List the children, sort by sequence. If the driver's predicate says we
   hold, done: the fencing token is our node's ``czxid`` (from ``create2``).
3. Otherwise watch only the node the predicate names (no herd): register the
   wake-up future for DELETED *and* DATA_CHANGED first, then ``get_data`` with
   a watch (not ``exists``: an ``exists`` watch on a vanished node stays
   registered on the server; DATA_CHANGED makes aiozk re-arm the watch after
   a reconnect). ``NoNode`` means it is already gone: re-list at once. Every
   wake-up, including a (re)connection, is only a hint to re-list.
4. Our own node missing from the listing means the session was lost: create
   a new node (a waiter keeps waiting across sessions, as in Curator).
5. One deadline bounds every request (CURATOR-559). The engine drives the
   steps (:meth:`LockInternals.try_take`, :meth:`LockInternals.wait`); on
   timeout, cancellation or error it calls :meth:`LockInternals.give_up`,
   which deletes our node, or sweeps for it by uid when the create's reply
   never came (``NoNode`` and "session gone" count as done).

6. While held, a node deleted behind our back is noticed at once (see
   :class:`HoldWatch`): the listing that tells us we hold also sets a child
   watch on the parent (same round trip, so an uncontended cycle stays at
   create, list, delete); the first change of the children while we hold
   makes us read our own node with a watch (one more request, only when the
   queue changes under a holder), after which its deletion is reported by
   the server directly. A hand-off (no re-listing) and a semaphore lease read
   their own node with a watch right away; for a hand-off that read is also
   the check that our node still exists.

Known gap: foreign children of a lock parent are ignored, so a lock name
whose last segment looks exactly like one of our node names confuses its
parent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiozk import exc as zk_exc
from aiozk import protocol

from .._core.driver import Grant
from .._core.errors import BackendUnavailableError
from ._layout import match_node, node_prefix
from ._protocol import CreateContainerRequest
from ._session import AmbiguousResult, SessionChanged, SessionMonitor, wait_future, wait_own

__all__ = [
    "HoldWatch",
    "LockInternals",
    "Node",
    "QueueEntry",
    "exclusive_predicate",
    "read_predicate",
    "sort_nodes",
]

logger = logging.getLogger("aiolocks.zookeeper")

_EPHEMERAL_SEQUENTIAL: Final = 1 | 2

@dataclass(frozen=True, slots=True)
class Node:
    """One of our lock nodes (or one listed from a parent)."""

    parent: str
    name: str
    kind: str
    uid: str
    seq: int
    anchor: int | None = None
    czxid: int | None = None
    session_id: int | None = None

    @property
    def path(self) -> str:
        """Path below the client's chroot."""
        return f"{self.parent}/{self.name}"

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """Queue order: by sequence; a downgrade read sits right after its write node."""
        if self.anchor is not None:
            return (self.anchor, 1, self.seq)
        return (self.seq, 0, 0)


@functools.lru_cache(maxsize=8192)
def parse_node(parent: str, name: str) -> Node | None:
    """Parse a child name; ``None`` for a foreign child (ignored, Curator does too)."""
    found = match_node(name)
    if found is None:
        return None
    kind, uid, seq, anchor = found
    return Node(parent=parent, name=name, kind=kind, uid=uid, seq=seq, anchor=anchor)


def sort_nodes(parent: str, children: Sequence[str]) -> list[Node]:
    """Our nodes among ``children``, in queue order."""
    nodes = [n for n in (parse_node(parent, c) for c in children) if n is not None]
    nodes.sort(key=lambda n: n.sort_key)
    return nodes


#: A predicate gets the sorted queue and our index, and returns
#: ``(holds, node_to_watch)`` (Curator's ``getsTheLock`` / ``PredicateResults``).
Predicate = Callable[[list[Node], int], tuple[bool, Node | None]]


def exclusive_predicate(nodes: list[Node], index: int) -> tuple[bool, Node | None]:
    """Mutex and write lock: hold when first; else watch the immediate predecessor."""
    if index == 0:
        return True, None
    return False, nodes[index - 1]


def read_predicate(nodes: list[Node], index: int) -> tuple[bool, Node | None]:
    """Read lock: hold when no writer is ahead; else watch the *last* writer ahead.

    A downgrade read (``anchor`` set) does not wait for the write node it was
    taken under: it sorts right after that node, so a writer queued behind
    the write node stays behind the read node too (CURATOR-621).
    """
    me = nodes[index]
    blocker: Node | None = None
    for node in nodes[:index]:
        if node.kind == "write" and node.seq != me.anchor:
            blocker = node
    return blocker is None, blocker


class _Vanished(Exception):
    """Our node is not in the listing: the session that held it is gone."""


class LockInternals:
    """The acquire/wait/delete algorithm over one :class:`SessionMonitor`."""

    def __init__(self, monitor: SessionMonitor) -> None:
        self.monitor = monitor
        self.link = monitor.link

    # -- small request helpers -------------------------------------------------

    def _abs(self, path: str) -> str:
        return self.link.normalize_path(path)

    async def list_children(
        self, parent: str, deadline: float | None, *, watch: bool = False
    ) -> list[str]:
        """Children of ``parent``; ``[]`` when it does not exist."""
        try:
            response = await self.monitor.call(
                protocol.GetChildrenRequest(path=self._abs(parent), watch=watch),
                deadline,
                retry=True,
            )
        except zk_exc.NoNode:
            return []
        return list(response.children)

    async def get_data(self, path: str, deadline: float | None) -> tuple[bytes, Any] | None:
        """``(data, stat)`` of ``path``, or ``None`` if it does not exist."""
        try:
            response = await self.monitor.call(
                protocol.GetDataRequest(path=self._abs(path), watch=False), deadline, retry=True
            )
        except zk_exc.NoNode:
            return None
        return bytes(response.data or b""), response.stat

    async def ensure_parents(self, path: str, deadline: float | None) -> None:
        """Create ``path`` and its missing ancestors as container nodes (top-down on NoNode).

        If even the chroot is missing (deleted behind our back), it is created
        again as plain persistent nodes, as ``ZKClient.start()`` does.
        """
        missing = [path]
        while missing:
            target = missing[-1]
            if not target:
                await self._ensure_chroot(deadline)
                missing.pop()
                continue
            try:
                # NodeExists on a re-send is success, so retrying is safe.
                await self.monitor.call(
                    CreateContainerRequest(
                        path=self._abs(target), data=b"", acl=self.link.default_acl
                    ),
                    deadline,
                    retry=True,
                )
            except zk_exc.NodeExists:
                pass
            except zk_exc.NoNode:
                parent = target.rsplit("/", 1)[0]
                if not parent and not self.link.chroot:
                    raise
                missing.append(parent)
                continue
            missing.pop()

    async def _ensure_chroot(self, deadline: float | None) -> None:
        chroot = self.link.chroot or ""
        prefix = ""
        for segment in [s for s in chroot.split("/") if s]:
            prefix = f"{prefix}/{segment}"
            try:
                await self.monitor.call(
                    protocol.CreateRequest(
                        path=prefix, data=b"", acl=self.link.default_acl, flags=0
                    ),
                    deadline,
                    retry=True,
                )
            except zk_exc.NodeExists:
                pass

    # -- protected create ------------------------------------------------------

    async def create(
        self,
        parent: str,
        kind: str,
        data: bytes,
        deadline: float | None,
        *,
        session_id: int | None = None,
    ) -> Node:
        """Create one ephemeral-sequential node, at most once (Curator's protected mode).

        :param session_id: create only in this session, else :class:`SessionChanged`
        :raises TimeoutError: the deadline passed (the caller's entry then
            knows what to sweep: see :meth:`give_up`)
        """
        entry = QueueEntry(parent, kind, data, exclusive_predicate)
        node, _ = await self.create_entry(entry, deadline, session_id=session_id, prefetch=False)
        return node

    async def create_entry(
        self,
        entry: QueueEntry,
        deadline: float | None,
        *,
        session_id: int | None = None,
        prefetch: bool = True,
    ) -> tuple[Node, list[str] | None]:
        """Create ``entry``'s node with its minted uid; with ``prefetch`` list in the same trip.

        The listing is sent right behind the create, without waiting for its
        reply; ZooKeeper answers a session's requests in order, so a listing
        that shows our node was taken after the create. ``None`` when it
        cannot be trusted (it failed, or does not show our node): list again.
        """
        parent = entry.parent
        prefix = node_prefix(entry.uid, entry.kind, entry.anchor)
        while True:
            request = protocol.Create2Request(
                path=self._abs(f"{parent}/{prefix}"),
                data=entry.data,
                acl=self.link.default_acl,
                flags=_EPHEMERAL_SEQUENTIAL,
            )
            sid = self.link.session_id
            # From here on the server may apply the create even if we never
            # see the reply (cancelled, deadline, broken connection): the
            # entry remembers it, so that give_up() sweeps by uid.
            entry.maybe_created = True
            entry.created_in = sid
            listing: list[asyncio.Future[Any]] = []
            then = None
            if prefetch:
                # watched: a holder learns of changes under it (see HoldWatch)
                then = protocol.GetChildrenRequest(path=self._abs(parent), watch=True)
                prefetch = False  # once: a retry lists the usual way
            answered = False
            try:
                response = await self.monitor.call(
                    request,
                    deadline,
                    retry=False,
                    session_id=session_id,
                    then=then,
                    then_reply=listing,
                )
                answered = True
            except zk_exc.NoNode:
                # Parent missing (first use, or the container was reaped
                # between our create and its recreation): make it, retry.
                await self.ensure_parents(parent, deadline)
                continue
            except AmbiguousResult:
                found = await self._created_after_all(entry, deadline)
                if found is not None:
                    return found, None
                continue
            except SessionChanged:
                if session_id is not None:
                    raise
                # The server said SESSION_EXPIRED; wait for aiozk to move on
                # to a new session rather than spin.
                await self._wait_state_change(sid, deadline)
                continue
            finally:
                if not answered:
                    _discard(listing)  # a pipelined listing we will not read
            node = self._created(entry, response)
            children: list[str] | None = None
            if listing:
                children = await self._listing_result(listing[0], deadline)
                if children is not None and node.name not in children:
                    children = None  # not taken after our create: list again
            return node, children

    def _created(self, entry: QueueEntry, response: Any) -> Node:
        """The node the server's reply to ``entry``'s create names (``entry.node`` from now on)."""
        name = self.link.denormalize_path(str(response.path)).rsplit("/", 1)[1]
        node = parse_node(entry.parent, name)
        assert node is not None, response.path
        node = _with_stat(node, response.stat)
        # Known now: give_up() deletes it by name.
        entry.node = node
        entry.maybe_created = False
        return node

    async def _created_after_all(self, entry: QueueEntry, deadline: float | None) -> Node | None:
        """After a create without a clear answer: ``entry``'s node if the server made it.

        ``None``: it did not (create again). :raises TimeoutError: past ``deadline``
        """
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("deadline passed during create") from None
        found = await self._find_protected(entry.parent, entry.uid, deadline)
        if found is not None:
            entry.node = found
            entry.maybe_created = False
        return found

    async def _listing_result(
        self, reply: asyncio.Future[Any], deadline: float | None
    ) -> list[str] | None:
        """The children from a pipelined listing; ``None`` if it failed (list again)."""
        if deadline is not None:
            # a sent request gets its answer even past the deadline (see call())
            deadline = max(deadline, time.monotonic() + self.monitor.reply_grace)
        try:
            done = await wait_future(reply, deadline)
        finally:
            if not reply.done():
                _discard([reply])
        if not done or reply.cancelled() or reply.exception() is not None:
            _discard([reply])
            return None
        zxid, response = reply.result()
        if zxid:
            self.link.saw_zxid(zxid)
        return list(response.children)

    async def _wait_state_change(self, sid: int | None, deadline: float | None) -> None:
        if self.link.session_id != sid:
            return
        waker = self.monitor.new_waker()
        try:
            if not await wait_future(waker, deadline):
                raise TimeoutError("deadline passed waiting for a new session")
        finally:
            self.monitor.drop_waker(waker)

    async def _find_protected(self, parent: str, uid: str, deadline: float | None) -> Node | None:
        """After a lost create reply: adopt our node if it exists in the current session."""
        for name in await self.list_children(parent, deadline):
            node = parse_node(parent, name)
            if node is None or node.uid != uid:
                continue
            found = await self.get_data(node.path, deadline)
            if found is None:
                return None
            stat = found[1]
            if stat.ephemeral_owner == self.link.session_id:
                return _with_stat(node, stat)
            # Created by an earlier connection's session that is still alive
            # (or being expired): not ours to use. Delete it and create anew.
            await self.delete(node)
            return None
        return None

    # -- one queue entry, step by step (driven by the engine) ---------------------

    async def try_take(self, entry: QueueEntry, deadline: float | None) -> bool:
        """One step of the lock recipe for ``entry``: ``True`` once it holds.

        Creates the node on the first call (and again after its session was
        lost), lists the queue, and when it does not hold yet, arms a watch
        on the node the predicate names; :meth:`wait` then waits for it.
        """
        self.unwatch(entry)
        try:
            return await self._try_take(entry, deadline)
        except (_Vanished, SessionChanged):
            # The session that held our node is gone (or someone deleted it):
            # queue again with a new node in the current session.
            entry.drop_guard()
            if entry.node is not None:
                logger.info("lock node %s vanished; queueing again", entry.node.path)
            entry.requeue()
            return False
        except TimeoutError:
            entry.drop_guard()
            return False  # the deadline passed; the engine gives the entry up
        except BaseException:
            entry.drop_guard()
            raise

    async def _try_take(self, entry: QueueEntry, deadline: float | None) -> bool:
        children: list[str] | None = None
        node = entry.node
        if entry.handoff:
            entry.handoff = False
            assert node is not None
            # CURATOR-696: hold only with a node of the current session.
            if node.session_id != self.link.session_id:
                raise _Vanished
            # The predecessor went, but our own node may have gone too
            # (deleted behind our back): read it with a watch, which both
            # checks that it still exists and reports its deletion while held.
            guard = entry.guard = HoldWatch(self, node)
            if not await guard.arm_own(deadline):
                raise _Vanished
            return True
        # The listing that may tell us we hold also watches the parent's
        # children (see HoldWatch); the callback exists before it is sent.
        guard = HoldWatch(self, node, parent=entry.parent)
        entry.guard = guard
        if node is None:
            node, children = await self.create_entry(entry, deadline)
            guard.node = node
        if children is None:
            children = await self.list_children(node.parent, deadline, watch=True)
        nodes = sort_nodes(node.parent, children)
        index = next((i for i, n in enumerate(nodes) if n.name == node.name), -1)
        if index < 0:
            raise _Vanished
        if any(n.uid == node.uid and n is not nodes[index] for n in nodes):
            nodes, index = await self._drop_twins(nodes, index)
        holds, watch = entry.predicate(nodes, index)
        if holds:
            if node.session_id != self.link.session_id:
                raise _Vanished
            return True
        entry.drop_guard()
        assert watch is not None
        # The wake-up future exists before the watched read is sent, so an
        # event that arrives with or right after the reply is not missed.
        entry.sole_blocker = _was_sole_blocker(nodes, index, entry.predicate)
        self._watch(entry, self._abs(watch.path))
        try:
            await self.monitor.call(
                protocol.GetDataRequest(path=entry.target, watch=True), deadline, retry=True
            )
        except zk_exc.NoNode:
            entry.retry = True  # predecessor already gone: list again at once
        return False

    async def _drop_twins(self, nodes: list[Node], index: int) -> tuple[list[Node], int]:
        """Delete other nodes with our uid: a create that a client sent twice.

        aiolocks never re-sends a create, but aiozk does after a dropped
        connection (a backend on an application's ``aiozk.ZKClient``): the
        first node would sit ahead of ours forever.
        """
        me = nodes[index]
        for twin in [n for n in nodes if n.uid == me.uid and n is not me]:
            logger.info("deleting %s: a second create of %s", twin.path, me.path)
            await self.delete(twin)
        kept = [n for n in nodes if n.uid != me.uid or n is me]
        return kept, kept.index(me)

    def _watch(self, entry: QueueEntry, target: str) -> None:
        entry.waker = self.monitor.new_waker()
        entry.target = target
        entry.deleted = False
        # bound methods, not closures: a third of the size, per waiting task
        wake, wake_deleted = entry.wake, entry.wake_deleted
        entry.callbacks = (wake, wake_deleted)
        link = self.link
        # DATA_CHANGED as well as DELETED: aiozk re-arms only data watches
        # after a reconnect (SetWatches), so the watch survives a blip.
        link.add_watch_callback(protocol.WatchEvent.DELETED, target, wake_deleted)
        link.add_watch_callback(protocol.WatchEvent.DATA_CHANGED, target, wake)

    def unwatch(self, entry: QueueEntry) -> None:
        """Drop ``entry``'s watch callbacks and wake-up future (no I/O)."""
        callbacks, entry.callbacks = entry.callbacks, None
        if callbacks is not None:
            wake, wake_deleted = callbacks
            link = self.link
            link.remove_watch_callback(protocol.WatchEvent.DELETED, entry.target, wake_deleted)
            link.remove_watch_callback(protocol.WatchEvent.DATA_CHANGED, entry.target, wake)
        waker, entry.waker = entry.waker, None
        if waker is not None:
            self.monitor.drop_waker(waker)

    async def wait(self, entry: QueueEntry, bound: float | None) -> None:
        """Wait for the watched node to change, a (re)connection, or ``bound`` seconds."""
        if entry.retry:
            entry.retry = False
            return
        waker = entry.waker
        if waker is None:
            return
        if bound is None:
            # the common case, awaited here: no timeout object, no frame more
            await waker
        else:
            await wait_own(waker, time.monotonic() + bound)
        if waker.done() and entry.deleted and entry.sole_blocker:
            # Handoff without a second listing: the node we watched was the
            # only one ahead of us, and a new node can only sort after ours
            # (mutex nodes carry no downgrade anchors).
            entry.handoff = True
        self.unwatch(entry)

    async def give_up(self, entry: QueueEntry) -> None:
        """Delete ``entry``'s node, or sweep for it by uid when its create went unanswered."""
        self.unwatch(entry)
        entry.drop_guard()
        node = entry.node
        if node is not None:
            await self.delete(node)
            entry.node = None
        if entry.maybe_created:
            await self._sweep(entry.parent, entry.uid, entry.created_in)
            entry.maybe_created = False

    # -- deletes -----------------------------------------------------------------

    async def delete(self, node: Node) -> bool:
        """Delete ``node`` until done: NoNode, or its session is gone, count as done.

        Returns False when the node was already gone (deleted behind our back,
        or with its session): the hold it stood for had been lost.
        """
        try:
            await self.monitor.call(
                protocol.DeleteRequest(path=self._abs(node.path), version=-1),
                None,
                retry=True,
                session_id=node.session_id,
                wait_for_connection=False,
            )
        except (zk_exc.NoNode, SessionChanged):
            return False  # already gone, or gone with its session
        except BackendUnavailableError:
            # The backend closed first: an owned session's close removes the
            # node with every other ephemeral; on a user's client it stays
            # until that session ends (logged, nothing else can be done).
            logger.warning("lock node %s not deleted: the backend closed first", node.path)
        return True

    async def _sweep(self, parent: str, uid: str, session_id: int | None) -> None:
        """Delete our node with ``uid`` under ``parent``, if it exists in ``session_id``."""
        if self.link.session_id != session_id:
            return  # that session is gone, and its ephemerals with it
        try:
            children = await self.monitor.call(
                protocol.GetChildrenRequest(path=self._abs(parent), watch=False),
                None,
                retry=True,
                session_id=session_id,
                wait_for_connection=False,
            )
        except (zk_exc.NoNode, SessionChanged, BackendUnavailableError):
            return
        for name in children.children:
            node = parse_node(parent, name)
            if node is not None and node.uid == uid:
                await self.delete(Node(**{**_fields(node), "session_id": session_id}))


#: loss reason when the server reports our held node gone
_DELETED_REASON: Final = "its lock node was already gone on the server (deleted behind our back)"


class HoldWatch:
    """Reports the deletion of a held node (behind our back) to its grant at once.

    Two stages. First a child watch on the parent, set by the very listing
    that told us we hold (no extra request). When the children change while
    we hold (a waiter queued, a node went), our own node is read with a
    watch, once: ``NoNode`` means it is gone; otherwise the server now
    reports its deletion directly and the child watch is no longer needed.
    A hand-off, which grants without a listing, and a semaphore lease start
    at the second stage. Callbacks are registered before the watching
    request is sent, so no event can slip between reply and registration.
    After a reconnection the session re-arms both watches (SetWatches), and
    a node deleted meanwhile is reported then.
    """

    __slots__ = (
        "_checking",
        "_closed",
        "_grant",
        "_internals",
        "_on_children",
        "_on_deleted",
        "_own_path",
        "_parent_path",
        "_pending",
        "_spawn",
        "node",
    )

    def __init__(
        self, internals: LockInternals, node: Node | None, *, parent: str | None = None
    ) -> None:
        self._internals = internals
        self.node = node
        self._grant: Grant | None = None
        self._spawn: Callable[[Coroutine[Any, Any, None]], object] | None = None
        self._closed = False
        self._checking = False
        #: the children changed before the grant was attached
        self._pending = False
        self._own_path: str | None = None
        self._on_deleted: Callable[[object], None] | None = None
        self._parent_path: str | None = None
        self._on_children: Callable[[object], None] | None = None
        if parent is not None:
            self._parent_path = internals._abs(parent)
            self._on_children = self._children_changed
            internals.link.add_watch_callback(
                protocol.WatchEvent.CHILDREN_CHANGED, self._parent_path, self._on_children
            )

    def attach(self, grant: Grant, spawn: Callable[[Coroutine[Any, Any, None]], object]) -> None:
        """The hold is granted: report losses to ``grant``; ``spawn`` runs the own-node read.

        Synchronous (the grant is recorded with no await in between).
        """
        self._grant = grant
        self._spawn = spawn
        if self._pending or (self._parent_path is None and self._own_path is None):
            self._start_check()

    def _children_changed(self, _path: object) -> None:
        if self._closed or self._own_path is not None:
            return
        if self._grant is None:
            self._pending = True
        else:
            self._start_check()

    def _start_check(self) -> None:
        if self._checking or self._closed or self._spawn is None:
            return
        self._checking = True
        self._spawn(self._check())

    async def _check(self) -> None:
        try:
            if not await self.arm_own(None):
                self._lost(_DELETED_REASON)
        except (SessionChanged, BackendUnavailableError):
            pass  # the session monitor reports a lost session
        except Exception:  # pragma: no cover - logged, the hold stays
            logger.warning("reading our lock node failed", exc_info=True)
        finally:
            self._checking = False

    async def arm_own(self, deadline: float | None) -> bool:
        """Watch our own node for deletion; ``False`` when it is already gone."""
        node = self.node
        assert node is not None
        if self._closed:
            return True  # released before the background read started
        internals = self._internals
        link = internals.link
        if self._own_path is None:
            self._own_path = internals._abs(node.path)
            self._on_deleted = self._deleted
            link.add_watch_callback(protocol.WatchEvent.DELETED, self._own_path, self._on_deleted)
        try:
            await internals.monitor.call(
                protocol.GetDataRequest(path=self._own_path, watch=True),
                deadline,
                retry=True,
                session_id=node.session_id,
            )
        except zk_exc.NoNode:
            return False
        self._drop_parent()
        return True

    def _deleted(self, _path: object) -> None:
        if not self._closed:
            self._lost(_DELETED_REASON)

    def _lost(self, reason: str) -> None:
        grant = self._grant
        if grant is not None and not self._closed:
            self.close()
            grant.mark_lost(reason)

    def _drop_parent(self) -> None:
        path, callback = self._parent_path, self._on_children
        self._on_children = None
        if path is not None and callback is not None:
            self._internals.link.remove_watch_callback(
                protocol.WatchEvent.CHILDREN_CHANGED, path, callback
            )

    def close(self) -> None:
        """Stop watching (before our own release deletes the node); no I/O."""
        if self._closed:
            return
        self._closed = True
        self._drop_parent()
        path, callback = self._own_path, self._on_deleted
        self._on_deleted = None
        if path is not None and callback is not None:
            self._internals.link.remove_watch_callback(protocol.WatchEvent.DELETED, path, callback)


class QueueEntry:
    """One place in one queue: what the recipe needs between the engine's steps."""

    __slots__ = (
        "anchor",
        "callbacks",
        "created_in",
        "data",
        "deleted",
        "guard",
        "handoff",
        "kind",
        "maybe_created",
        "node",
        "parent",
        "predicate",
        "retry",
        "sole_blocker",
        "target",
        "uid",
        "waker",
    )

    def __init__(
        self,
        parent: str,
        kind: str,
        data: bytes,
        predicate: Predicate,
        *,
        anchor: int | None = None,
    ) -> None:
        self.parent = parent
        self.kind = kind
        self.data = data
        self.predicate = predicate
        self.anchor = anchor
        #: minted before any I/O: a lost create reply can be found again by it
        self.uid = str(uuid.uuid4())
        self.node: Node | None = None
        #: a create with ``uid`` was sent and its node is not known
        self.maybe_created = False
        self.created_in: int | None = None
        self.waker: asyncio.Future[None] | None = None
        self.target = ""
        self.callbacks: tuple[Callable[[object], None], Callable[[object], None]] | None = None
        self.deleted = False
        self.sole_blocker = False
        self.handoff = False
        #: try again without waiting (the watched node was already gone)
        self.retry = False
        #: watches the node while it is (about to be) held; the grant takes it
        self.guard: HoldWatch | None = None

    def take_guard(self) -> HoldWatch | None:
        """Hand the hold's watch over to the grant (the entry forgets it)."""
        guard, self.guard = self.guard, None
        return guard

    def drop_guard(self) -> None:
        """Not holding: stop the hold's watch (no I/O)."""
        guard, self.guard = self.guard, None
        if guard is not None:
            guard.close()

    def wake(self, _path: object) -> None:
        """Watch callback: the watched node changed."""
        waker = self.waker
        if waker is not None and not waker.done():
            waker.set_result(None)

    def wake_deleted(self, _path: object) -> None:
        """Watch callback: the watched node is gone."""
        waker = self.waker
        if waker is not None and not waker.done():
            self.deleted = True
            waker.set_result(None)

    def requeue(self) -> None:
        """The node went with its session: the next try creates a new one (new uid)."""
        self.node = None
        self.maybe_created = False
        self.uid = str(uuid.uuid4())
        self.handoff = False
        self.retry = True


def _fields(node: Node) -> dict[str, Any]:
    return {name: getattr(node, name) for name in Node.__slots__}


def _with_stat(node: Node, stat: Any) -> Node:
    fields = _fields(node)
    fields["czxid"] = int(stat.created_zxid)
    fields["session_id"] = int(stat.ephemeral_owner)
    return Node(**fields)


def _was_sole_blocker(nodes: list[Node], index: int, predicate: Predicate) -> bool:
    """Deleting the node we watched certainly makes us the holder, no listing needed.

    Only for the exclusive predicate on plain ``lock`` nodes (mutex,
    semaphore turnstiles): sequence order is final there. Read/write nodes
    are excluded, because a downgrade read sorts right behind its write node
    and can appear ahead of us after we listed.
    """
    return (
        predicate is exclusive_predicate
        and index == 1  # so the watched node was nodes[0]
        and all(n.kind == "lock" for n in nodes[: index + 1])
    )


def _discard(replies: list[asyncio.Future[Any]]) -> None:
    """Forget pipelined replies we will not use (their errors do not matter)."""
    for fut in replies:
        if fut.done():
            if not fut.cancelled():
                fut.exception()
        else:
            fut.cancel()
