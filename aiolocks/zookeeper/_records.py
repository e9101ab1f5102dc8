"""The record store of ``zk://`` (the contract of :mod:`aiolocks._core.records`).

Every record is one znode, ``/aiolocks/records/<prefix>/<child>`` below the
chroot, in both layouts (:data:`._layout.RECORDS_ROOT`); the folders above
it are container nodes, reaped by the server once empty. A node's data is a
28-byte header (``b"alr1"``, the 16-byte id of the write, the ttl in ms or
0) and then the value; a node without that header (a folder of a deeper
prefix, a foreign node) is no record.

* *version* = the node's ``mzxid``: a global transaction id, so it changes
  with every write and never comes back, even across a delete and re-create.
  Compare-and-set reads the node, compares its ``mzxid`` and writes (or
  deletes) at the data version it read, so a concurrent writer makes it fail.
* *expiring* records are persistent nodes whose header carries the ttl; one
  is expired once the server's time is past its ``mtime + ttl`` (both the
  leader's clock). The server's "now" is the ``mtime`` a write of the root
  folder returns (one write, only in calls that meet an expiring record).
  An expired node is absent for every method; ``create`` takes it over with
  a ``set_data`` at its version (so of two creators exactly one wins), other
  calls delete it in the background at the version they read.
* *ephemeral* records (``join``) are ephemeral nodes of the backend's
  session. Their :class:`Entry` is marked lost when the session monitor
  declares that session lost, and when the node is deleted behind our back
  (a data watch on it, re-armed after each change of its data). The entry
  knows its node by ``czxid`` (an update writes another write id).
* Every write carries a fresh id in its header: a write whose reply was lost
  (connection broken) is resolved by reading the node back, and a
  ``create``/``join`` cancelled in flight has its node removed in the
  background only if the node still carries that id.
* A snapshot lists the prefix folder with a child watch (an exists watch
  while the folder is missing) and reads every child with a data watch; all
  of them, and the next (re)connection of the session, resolve one future.
  ``changed()`` also stops at the earliest expiry among the children read.
* A child's node as read is kept (:class:`_DataCache`) while the data watch
  that read set has not fired: the next snapshot reads only the children
  that are new or changed. The server sends a watch event before any reply
  that shows the change, and aiolocks' own session runs the callbacks as it
  reads the event, so a kept node is never older than the listing; on a
  client given by the application (aiozk, whose callbacks run later) nothing
  is kept. A disconnection, a reconnection or a lost session drops
  everything kept (watches may have been missed).
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from aiozk import exc as zk_exc
from aiozk import protocol

from .._core.errors import BackendUnavailableError
from .._core.records import CHILD, Entry, Record, Snapshot
from .._core.states import ConnectionState
from ._client import OwnLink
from ._layout import RECORDS_ROOT, record_path
from ._session import AmbiguousResult, SessionChanged, SessionMonitor, wait_future

if TYPE_CHECKING:
    from ._internals import LockInternals

__all__ = ["ZooKeeperRecords"]

logger = logging.getLogger("aiolocks.zookeeper")

_MAGIC: Final = b"alr1"
_HEADER: Final = struct.Struct(">4s16sQ")
_EPHEMERAL: Final = 1
_DELETED_REASON: Final = "its record node was deleted on the server (behind our back)"

Spawn = Callable[[Coroutine[Any, Any, None], str], object]


@dataclass(frozen=True, slots=True)
class _Node:
    """A record node as read: header fields, value and ``Stat``."""

    uid: bytes
    ttl_ms: int
    value: bytes
    stat: Any

    @property
    def version(self) -> int:
        return int(self.stat.last_modified_zxid)

    @property
    def ephemeral(self) -> bool:
        return int(self.stat.ephemeral_owner) != 0

    @property
    def expires_ms(self) -> int | None:
        return int(self.stat.modified) + self.ttl_ms if self.ttl_ms else None

    def dead(self, now_ms: int | None) -> bool:
        """Expired at the server's ``now_ms``."""
        expires = self.expires_ms
        return expires is not None and now_ms is not None and now_ms >= expires

    def record(self, now_ms: int | None) -> Record:
        expires = self.expires_ms
        ttl = None
        if expires is not None and now_ms is not None:
            ttl = max(0.0, (expires - now_ms) / 1000)
        return Record(self.value, self.version, self.ephemeral, ttl)


def _encode(uid: bytes, ttl: float | None, value: bytes) -> bytes:
    ttl_ms = 0 if ttl is None else max(1, math.ceil(ttl * 1000))
    return _HEADER.pack(_MAGIC, uid, ttl_ms) + value


def _decode(data: bytes, stat: Any) -> _Node | None:
    """The record in a node's data; ``None`` for a node without our header."""
    if len(data) < _HEADER.size or not data.startswith(_MAGIC):
        return None
    _magic, uid, ttl_ms = _HEADER.unpack_from(data)
    return _Node(uid, ttl_ms, data[_HEADER.size :], stat)


def _check_key(key: str) -> None:
    prefix, _, child = key.rpartition("/")
    _check_prefix(prefix, what=f"record key {key!r}")
    if not CHILD.fullmatch(child):
        raise ValueError(f"record key {key!r}: its last segment must match {CHILD.pattern}")


def _check_prefix(prefix: str, *, what: str = "") -> None:
    if not prefix or prefix.startswith("/") or prefix.endswith("/") or "//" in prefix:
        raise ValueError(f"{what or 'record prefix ' + repr(prefix)}: needs a prefix like 'a/b'")


def _check_ttl(ttl: float | None) -> None:
    if ttl is not None and not (math.isfinite(ttl) and ttl > 0):
        raise ValueError(f"record ttl must be a positive number of seconds, got {ttl!r}")


class _Member:
    """The driver's state of one :class:`Entry`: its node, session and watches."""

    __slots__ = ("callbacks", "czxid", "leaving", "path", "session_id", "uid")

    def __init__(self, path: str, uid: bytes, stat: Any) -> None:
        self.path = path  # absolute (as the server sees it)
        #: the id of the join's write (names this member; updates write other ids)
        self.uid = uid
        #: the node's ``czxid``: tells our node from a later one on the same key
        self.czxid = int(stat.created_zxid)
        self.session_id = int(stat.ephemeral_owner)
        #: our own delete is in flight: its DELETED event is no loss
        self.leaving = False
        self.callbacks: list[tuple[int, Callable[[str], object]]] = []


class _ZkSnapshot(Snapshot):
    """Children as read; every watch it set resolves one waker of the session monitor."""

    def __init__(self, monitor: SessionMonitor) -> None:
        super().__init__({})
        self._monitor = monitor
        self._waker = monitor.new_waker()
        self._watches: list[tuple[int, str]] = []
        self._expires_at: float | None = None
        self._closed = False

    def watch(self, types: Sequence[int], path: str) -> None:
        """Resolve the waker on these events of ``path`` (absolute); before the request."""
        for event_type in types:
            self._monitor.link.add_watch_callback(event_type, path, self._fire)
            self._watches.append((event_type, path))

    def fire(self) -> None:
        """Something changed already (wake at once)."""
        self._fire("")

    def _fire(self, _path: str) -> None:
        if not self._waker.done():
            self._waker.set_result(None)

    def expire_in(self, seconds: float) -> None:
        """``changed()`` returns by then: the earliest expiry among the children read."""
        self._expires_at = time.monotonic() + seconds

    async def changed(self, bound: float | None) -> None:
        """Return on a watch event, a (re)connection, the earliest expiry, or ``bound``."""
        deadline = None if bound is None else time.monotonic() + bound
        if self._expires_at is not None:
            deadline = self._expires_at if deadline is None else min(deadline, self._expires_at)
        if deadline is not None and deadline <= time.monotonic():
            return
        await wait_future(self._waker, deadline)

    def close(self) -> None:
        """Forget the watch callbacks and the waker (the server's one-shot watches lapse)."""
        if self._closed:
            return
        self._closed = True
        link = self._monitor.link
        watches, self._watches = self._watches, []
        for event_type, path in watches:
            link.remove_watch_callback(event_type, path, self._fire)
        self._monitor.drop_waker(self._waker)


_DATA_EVENTS: Final = (protocol.WatchEvent.DATA_CHANGED, protocol.WatchEvent.DELETED)


class _DataCache:
    """Child nodes as read by snapshots, each kept until the data watch its read set fires.

    A path is hooked (a callback on its data events) while it is cached or
    being read; an event drops it, and so does a read that an event
    overtook (kept only if nothing fired between the request and its reply).
    """

    def __init__(self) -> None:
        self._monitor: SessionMonitor | None = None
        self._remove_listener: Callable[[], None] | None = None
        #: folder path -> child name -> its record (``None``: a node without our header)
        self._folders: dict[str, dict[str, _Node | None]] = {}
        #: path -> token of the read in flight that may fill its entry
        self._reading: dict[str, object] = {}

    def attach(self, monitor: SessionMonitor) -> bool:
        """Follow ``monitor``'s session; ``False``: its link cannot keep a cache."""
        if monitor is not self._monitor:
            self.close()
            self._monitor = monitor
            self._remove_listener = monitor.add_listener(self._on_state)
        return isinstance(monitor.link, OwnLink)

    def _on_state(self, state: ConnectionState) -> None:
        if state is not ConnectionState.CONNECTED:
            self.clear()  # SUSPENDED, RECONNECTED, LOST: events may have been missed

    def cached(self, folder: str, names: Sequence[str]) -> dict[str, _Node | None]:
        """The kept nodes of ``folder`` among ``names``; the others are dropped."""
        entries = self._folders.get(folder)
        if not entries:
            return {}
        listed = set(names)
        for name in [name for name in entries if name not in listed]:
            del entries[name]
            self._release(f"{folder}/{name}")
        return dict(entries)

    async def read(
        self, get: Callable[[str], Awaitable[tuple[_Node | None, Any] | None]], path: str
    ) -> tuple[_Node | None, Any] | None:
        """``get(path)`` (a read that sets a data watch), kept unless an event overtook it."""
        token = object()
        self._reading[path] = token
        self._hook(path)
        stored = False
        try:
            found = await get(path)
            if found is not None and self._reading.get(path) is token:
                folder, _, name = path.rpartition("/")
                self._folders.setdefault(folder, {})[name] = found[0]
                stored = True
            return found
        finally:
            if self._reading.get(path) is token:
                del self._reading[path]
            if not stored:
                self._release(path)

    def _fired(self, path: str) -> None:
        """A data watch event (change or deletion): drop the path's entry."""
        folder, _, name = path.rpartition("/")
        entries = self._folders.get(folder)
        if entries is not None:
            entries.pop(name, None)
            if not entries:
                del self._folders[folder]
        self._reading.pop(path, None)
        self._unhook(path)

    def _release(self, path: str) -> None:
        folder, _, name = path.rpartition("/")
        if path not in self._reading and name not in self._folders.get(folder, {}):
            self._unhook(path)

    def _hook(self, path: str) -> None:
        assert self._monitor is not None
        for event_type in _DATA_EVENTS:
            self._monitor.link.add_watch_callback(event_type, path, self._fired)

    def _unhook(self, path: str) -> None:
        if self._monitor is not None:
            for event_type in _DATA_EVENTS:
                self._monitor.link.remove_watch_callback(event_type, path, self._fired)

    def clear(self) -> None:
        """Drop every entry (and every read in flight's right to fill one)."""
        paths = set(self._reading)
        for folder, entries in self._folders.items():
            paths.update(f"{folder}/{name}" for name in entries)
        self._folders = {}
        self._reading = {}
        for path in paths:
            self._unhook(path)

    def close(self) -> None:
        """Clear and stop following the session."""
        self.clear()
        remove, self._remove_listener = self._remove_listener, None
        if remove is not None:
            remove()
        self._monitor = None


class ZooKeeperRecords:
    """The record store of one ZooKeeper driver (see the module doc).

    :param monitor: the driver's session monitor, once open (raises
        :class:`BackendUnavailableError` before)
    :param internals: the lock recipe (its container-parent creation)
    :param spawn: runs a coroutine in the engine's task set (cleanups)
    """

    def __init__(
        self,
        monitor: Callable[[], SessionMonitor],
        internals: Callable[[], LockInternals],
        spawn: Spawn,
    ) -> None:
        self._monitor = monitor
        self._internals = internals
        self._spawn = spawn
        self._members: dict[str, tuple[Entry, _Member]] = {}
        #: snapshots' reads of child nodes, kept while their data watch holds
        self._cache = _DataCache()

    # -- requests --------------------------------------------------------------------

    def _abs(self, key: str) -> str:
        return self._monitor().link.normalize_path(record_path(key))

    async def _call(
        self, request: Any, *, retry: bool, session_id: int | None = None, patient: bool = False
    ) -> Any:
        """One request; ``patient``: wait for a connection until the backend closes."""
        return await self._monitor().call(
            request, None, retry=retry, session_id=session_id, wait_for_connection=not patient
        )

    async def _get(
        self,
        path: str,
        *,
        watch: bool = False,
        session_id: int | None = None,
        patient: bool = False,
    ) -> tuple[_Node | None, Any] | None:
        """``(record or None for a foreign node, stat)``; ``None`` when absent."""
        request = protocol.GetDataRequest(path=path, watch=watch)
        try:
            reply = await self._call(request, retry=True, session_id=session_id, patient=patient)
        except zk_exc.NoNode:
            return None
        return _decode(bytes(reply.data or b""), reply.stat), reply.stat

    async def _record_at(self, path: str) -> _Node | None:
        """The record at ``path`` (expired or not); ``None`` when absent or no record."""
        found = await self._get(path)
        return None if found is None else found[0]

    async def _server_now(self) -> int:
        """The server's time in ms: the ``mtime`` of a write of the records folder."""
        folder = self._monitor().link.normalize_path(RECORDS_ROOT)
        while True:
            try:
                reply = await self._call(
                    protocol.SetDataRequest(path=folder, data=b"", version=-1), retry=True
                )
            except zk_exc.NoNode:
                await self._internals().ensure_parents(RECORDS_ROOT, None)
                continue
            return int(reply.stat.modified)

    async def _now_for(self, nodes: Sequence[_Node]) -> int | None:
        """The server's time if any of ``nodes`` expires (read after them), else ``None``."""
        return await self._server_now() if any(n.ttl_ms for n in nodes) else None

    async def _create_node(self, path: str, data: bytes, flags: int, key: str) -> Any:
        """``create2``; the folders are made on ``NoNode``. Its ``Stat``."""
        while True:
            try:
                reply = await self._call(
                    protocol.Create2Request(
                        path=path, data=data, acl=self._monitor().link.default_acl, flags=flags
                    ),
                    retry=False,
                )
            except zk_exc.NoNode:
                await self._internals().ensure_parents(record_path(key).rpartition("/")[0], None)
                continue
            return reply.stat

    def _remove_later(self, path: str, node: _Node) -> None:
        """Delete an expired node in the background, at the version read."""
        name = f"aiolocks-zk-record-expired:{path}"
        self._spawn(self._remove(path, int(node.stat.version)), name)

    async def _remove(self, path: str, version: int) -> None:
        try:
            await self._call(protocol.DeleteRequest(path=path, version=version), retry=True)
        except (zk_exc.NoNode, zk_exc.BadVersion, zk_exc.NotEmpty, BackendUnavailableError):
            pass  # gone, taken over, a folder now (not ours to delete), or closed

    async def _discard(
        self,
        path: str,
        uid: bytes | None,
        session_id: int | None = None,
        *,
        czxid: int | None = None,
        patient: bool = True,
    ) -> None:
        """Delete ``path`` if it still carries write ``uid`` (a cancelled or lost write), or
        (with ``czxid``) if it is still that node (an entry's, updated since).

        ``patient``: without a connection, wait for one until the backend closes.
        """
        try:
            found = await self._get(path, session_id=session_id, patient=patient)
            if found is None or found[0] is None:
                return
            if found[0].uid != uid and int(found[1].created_zxid) != czxid:
                return
            await self._call(
                protocol.DeleteRequest(path=path, version=int(found[1].version)),
                retry=True,
                session_id=session_id,
                patient=patient,
            )
        except (zk_exc.NoNode, zk_exc.BadVersion, zk_exc.NotEmpty, SessionChanged):
            pass  # gone (with its session), or written since: not ours
        except BackendUnavailableError:
            pass  # closed first: an owned session's close removed it

    def _discard_later(
        self, path: str, uid: bytes | None, session_id: int | None = None, czxid: int | None = None
    ) -> None:
        self._spawn(
            self._discard(path, uid, session_id, czxid=czxid), f"aiolocks-zk-record-discard:{path}"
        )

    # -- the contract -------------------------------------------------------------------

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int | None:
        """Write a persistent or expiring record if absent (or expired); its version."""
        _check_key(key)
        _check_ttl(ttl)
        path = self._abs(key)
        uid = uuid.uuid4().bytes
        data = _encode(uid, ttl, value)
        try:
            return await self._create(key, path, uid, data)
        except BaseException:
            # the server may have applied a create or take-over we never heard of
            self._discard_later(path, uid)
            raise

    async def _create(self, key: str, path: str, uid: bytes, data: bytes) -> int | None:
        while True:
            try:
                stat = await self._create_node(path, data, 0, key)
                return int(stat.last_modified_zxid)
            except zk_exc.NodeExists:
                pass
            except AmbiguousResult:
                pass  # read back below: ours if it carries our write id
            found = await self._get(path)
            if found is None:
                continue  # deleted meanwhile: create again
            node, stat = found
            if node is not None and node.uid == uid:
                return node.version
            if node is None or not node.dead(await self._now_for([node])):
                return None
            try:
                # expired: take it over at the version read (one of two creators wins)
                reply = await self._call(
                    protocol.SetDataRequest(path=path, data=data, version=int(stat.version)),
                    retry=False,
                )
            except (zk_exc.BadVersion, zk_exc.NoNode, AmbiguousResult):
                continue
            return int(reply.stat.last_modified_zxid)

    async def join(self, key: str, value: bytes) -> Entry | None:
        """Write an ephemeral record (a node of this backend's session) if absent."""
        _check_key(key)
        path = self._abs(key)
        uid = uuid.uuid4().bytes
        try:
            return await self._join(key, path, uid, _encode(uid, None, value))
        except BaseException:
            self._forget(key, uid)
            self._discard_later(path, uid)
            raise

    async def _join(self, key: str, path: str, uid: bytes, data: bytes) -> Entry | None:
        monitor = self._monitor()
        while True:
            try:
                stat = await self._create_node(path, data, _EPHEMERAL, key)
                return await self._enter(key, path, uid, stat)
            except zk_exc.NodeExists:
                pass
            except AmbiguousResult:
                pass
            found = await self._get(path)
            if found is None:
                continue
            node, stat = found
            if node is not None and node.uid == uid:
                if int(stat.ephemeral_owner) == monitor.link.session_id:
                    return await self._enter(key, path, uid, stat)
                # made in an earlier session that is not gone yet: not ours to use
                await self._remove(path, int(stat.version))
                continue
            if node is None or not node.dead(await self._now_for([node])):
                return None
            await self._remove(path, int(stat.version))  # expired: remove, then join

    async def _enter(self, key: str, path: str, uid: bytes, stat: Any) -> Entry:
        """The new entry; its node's deletion (behind our back) will mark it lost."""
        member = _Member(path, uid, stat)
        entry = Entry(key, int(stat.last_modified_zxid), member)
        self._members[key] = (entry, member)
        link = self._monitor().link

        def deleted(_path: str) -> None:
            if not member.leaving:
                self._lose(key, member, _DELETED_REASON)

        def changed(_path: str) -> None:
            # the server's data watch fired (an update): watch again
            held = self._members.get(key)
            if held is not None and held[1] is member:
                self._spawn(self._arm(key, member), f"aiolocks-zk-record-watch:{path}")

        member.callbacks = [
            (protocol.WatchEvent.DELETED, deleted),
            (protocol.WatchEvent.DATA_CHANGED, changed),
        ]
        for event_type, callback in member.callbacks:
            link.add_watch_callback(event_type, path, callback)
        await self._arm(key, member)
        return entry

    async def _arm(self, key: str, member: _Member) -> None:
        """Read the member's node with a watch; gone already: the entry is lost."""
        try:
            found = await self._get(member.path, watch=True, session_id=member.session_id)
        except SessionChanged:
            found = None  # the session monitor reports it too
        except BackendUnavailableError:
            return  # closed, or no connection: the session monitor decides
        if found is None and not member.leaving:
            self._lose(key, member, _DELETED_REASON)

    def _unwatch(self, member: _Member) -> None:
        link = self._monitor().link
        callbacks, member.callbacks = member.callbacks, []
        for event_type, callback in callbacks:
            link.remove_watch_callback(event_type, member.path, callback)

    def _forget(self, key: str, uid: bytes) -> None:
        """Drop the entry of ``key`` written with ``uid`` (if any): no loss, no I/O."""
        held = self._members.get(key)
        if held is not None and held[1].uid == uid:
            del self._members[key]
            self._unwatch(held[1])

    def _lose(self, key: str, member: _Member, reason: str) -> None:
        held = self._members.get(key)
        if held is None or held[1] is not member:
            return
        del self._members[key]
        self._unwatch(member)
        # the node may outlive the loss (a session declared lost locally that
        # comes back): remove it, only in its own session
        self._discard_later(member.path, None, member.session_id, member.czxid)
        held[0].mark_lost(reason)

    def session_lost(self, session_id: int | None, reason: str, *, all_entries: bool) -> None:
        """The monitor declared ``session_id`` lost: its entries are (all, with ``all_entries``)."""
        self._cache.clear()
        for key, (_entry, member) in list(self._members.items()):
            if all_entries or session_id is None or member.session_id == session_id:
                self._lose(key, member, reason)

    async def update(
        self, key: str, value: bytes, *, version: int, ttl: float | None = None
    ) -> int | None:
        """Compare-and-set by ``mzxid``, written at the data version read."""
        _check_key(key)
        _check_ttl(ttl)
        path = self._abs(key)
        node = await self._record_at(path)
        if node is None or node.version != version:
            return None
        stat = node.stat
        if node.ephemeral and ttl is not None:
            raise ValueError(f"record {key!r} is ephemeral: it takes no ttl")
        if node.dead(await self._now_for([node])):
            self._remove_later(path, node)
            return None
        uid = uuid.uuid4().bytes
        request = protocol.SetDataRequest(
            path=path, data=_encode(uid, ttl, value), version=int(stat.version)
        )
        try:
            reply = await self._call(request, retry=False)
        except (zk_exc.BadVersion, zk_exc.NoNode):
            return None
        except AmbiguousResult:
            again = await self._get(path)
            if again is None or again[0] is None or again[0].uid != uid:
                return None
            return again[0].version
        return int(reply.stat.last_modified_zxid)

    async def delete(self, key: str, *, version: int | None = None) -> bool:
        """Delete (only at ``version``, when given); ``True`` when this call deleted it."""
        _check_key(key)
        path = self._abs(key)
        node = await self._record_at(path)
        if node is None:
            return False
        stat = node.stat
        if version is not None and node.version != version:
            return False
        if node.dead(await self._now_for([node])):
            self._remove_later(path, node)
            return False
        held = self._members.get(key)
        member = None
        if held is not None and held[1].czxid == int(stat.created_zxid):
            member = held[1]
        if member is not None:
            member.leaving = True  # our delete's event is no loss
        try:
            request = protocol.DeleteRequest(path=path, version=int(stat.version))
            await self._call(request, retry=False)
        except (zk_exc.BadVersion, zk_exc.NoNode):
            return self._not_deleted(key, member)
        except AmbiguousResult:
            if await self._get(path) is not None:
                return self._not_deleted(key, member)
        except BaseException:
            if member is not None:
                # cancelled (or failed) with the delete maybe applied: find out
                name = f"aiolocks-zk-record-watch:{member.path}"
                self._spawn(self._after_delete(key, member), name)
            raise
        if member is not None:
            self._forget(key, member.uid)
        return True

    async def _after_delete(self, key: str, member: _Member) -> None:
        """Our delete's outcome is unknown: forget the entry if the node is gone, else watch."""
        try:
            found = await self._get(member.path, watch=True, session_id=member.session_id)
        except (SessionChanged, BackendUnavailableError):
            return  # the session monitor reports a lost session
        if found is None:
            self._forget(key, member.uid)  # most likely our own delete: no loss
        else:
            member.leaving = False  # watched again by this read

    def _not_deleted(self, key: str, member: _Member | None) -> bool:
        if member is not None:
            member.leaving = False
            self._spawn(self._arm(key, member), f"aiolocks-zk-record-watch:{member.path}")
        return False

    async def read(self, key: str) -> Record | None:
        """The record, or ``None`` when absent or expired."""
        _check_key(key)
        path = self._abs(key)
        node = await self._record_at(path)
        if node is None:
            return None
        now = await self._now_for([node])
        if node.dead(now):
            self._remove_later(path, node)
            return None
        return node.record(now)

    async def snapshot(self, prefix: str) -> Snapshot:
        """The children of ``prefix`` (child and data watches armed first)."""
        _check_prefix(prefix)
        monitor = self._monitor()
        folder = monitor.link.normalize_path(record_path(prefix))
        snap = _ZkSnapshot(monitor)
        try:
            children = await self._watched_children(snap, folder)
            names = [c for c in children if CHILD.fullmatch(c)]
            paths = [f"{folder}/{name}" for name in names]
            for path in paths:
                snap.watch(_DATA_EVENTS, path)
            found = await self._read_children(monitor, folder, names)
            nodes = {
                name: (f"{folder}/{name}", node) for name, node in found.items() if node is not None
            }
            now = await self._now_for([node for _path, node in nodes.values()])
            self._fill(snap, nodes, now)
        except BaseException:
            snap.close()
            raise
        return snap

    async def _read_children(
        self, monitor: SessionMonitor, folder: str, names: Sequence[str]
    ) -> dict[str, _Node | None]:
        """The listed children's nodes: read with a data watch unless kept; absent ones left out."""

        async def get(path: str) -> tuple[_Node | None, Any] | None:
            return await self._get(path, watch=True)

        caching = self._cache.attach(monitor)
        kept = self._cache.cached(folder, names) if caching else {}
        missing = [name for name in names if name not in kept]
        found = await asyncio.gather(
            *(
                self._cache.read(get, f"{folder}/{name}") if caching else get(f"{folder}/{name}")
                for name in missing
            )
        )
        for name, got in zip(missing, found, strict=True):
            if got is not None:
                kept[name] = got[0]
        return {name: kept[name] for name in names if name in kept}

    def _fill(
        self, snap: _ZkSnapshot, nodes: dict[str, tuple[str, _Node]], now: int | None
    ) -> None:
        earliest: int | None = None
        for name, (path, node) in nodes.items():
            if node.dead(now):
                self._remove_later(path, node)
                continue
            snap.records[name] = node.record(now)
            expires = node.expires_ms
            if expires is not None:
                earliest = expires if earliest is None else min(earliest, expires)
        if earliest is not None and now is not None:
            snap.expire_in((earliest - now) / 1000)

    async def _watched_children(self, snap: _ZkSnapshot, folder: str) -> list[str]:
        """The folder's children with a child watch; an exists watch while it is missing."""
        snap.watch((protocol.WatchEvent.CHILDREN_CHANGED, protocol.WatchEvent.DELETED), folder)
        try:
            reply = await self._call(
                protocol.GetChildrenRequest(path=folder, watch=True), retry=True
            )
            return list(reply.children)
        except zk_exc.NoNode:
            pass
        snap.watch((protocol.WatchEvent.CREATED,), folder)
        try:
            await self._call(protocol.ExistsRequest(path=folder, watch=True), retry=True)
        except zk_exc.NoNode:
            return []  # the server keeps the exists watch: its creation wakes us
        snap.fire()  # created meanwhile: read again
        return []

    async def close(self, *, delete: bool, timeout: float) -> None:
        """The driver closes: its entries end without a loss.

        :param delete: delete their nodes (a session the backend does not
            own, whose close would not remove them)
        """
        self._cache.close()
        members, self._members = self._members, {}
        for _entry, member in members.values():
            member.leaving = True
            self._unwatch(member)
        if not delete:
            return
        for _entry, member in members.values():
            try:
                async with asyncio.timeout(timeout):
                    await self._discard(
                        member.path, None, member.session_id, czxid=member.czxid, patient=False
                    )
            except Exception:
                logger.warning("record node %s not deleted at close", member.path, exc_info=True)
