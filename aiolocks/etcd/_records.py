"""The record store of ``etcd://`` (the contract of :mod:`aiolocks._core.records`).

Layout
------
A record ``<prefix>/<child>`` is the etcd key
``<root>\\x00records\\x00<prefix>/<child>`` (``<root>`` is the backend's key
prefix, ``prefix/``): inside the range the backend's role may already write,
and outside every lock queue (queues start with a family name, and lock
names hold no control characters). Its value is one kind byte (``p``:
persistent or expiring, ``e``: ephemeral), eight random bytes that make
every write's value unique, then the record's value. The unique write lets
a write be sent again to another member after a timeout (a write whose
compare failed reads the key back: finding its own bytes there means an
earlier send went through) and lets a cancelled write be taken back
without touching anybody else's.

Versions and leases
-------------------
* ``version`` is the key's ``mod_revision``: the store revision of its last
  write, unique across every write of the cluster, so it never comes back
  after a delete and re-create. Create is a transaction on
  ``create_revision == 0``; update and delete compare ``mod_revision``.
* An *expiring* record has a lease of its own, granted with the ttl rounded
  up to whole seconds (etcd leases count whole seconds; the server may raise
  a TTL to its own minimum, 2 s with etcd's default election timeout). etcd
  deletes the key when it revokes the ended lease (its sweep runs every half
  second), and its watchers see the deletion. A lease etcd already reports
  gone (a sweep lagging a second or more) counts as expired: the record is
  absent, and a create or join takes its key. ``Record.ttl`` is an upper
  bound in whole seconds (etcd answers the seconds left rounded down). An
  update or delete revokes the record's old lease, so leases never pile up.
* An *ephemeral* record (``join``) is attached to the backend's session
  lease, the one its lock keys use: it goes when the lease ends. The entry
  is marked lost when the driver learns the lease ended (the same path that
  marks lock holds lost) or when a watch on the key sees it deleted behind
  the backend's back.

A snapshot reads the prefix's keys at one revision ``R`` (keys deeper than
a direct child are left out) and watches the prefix from ``R + 1``, so no
change falls between the read and the watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final

from .._core.backoff import Backoff
from .._core.errors import BackendUnavailableError
from .._core.records import CHILD, Entry, Record, Snapshot
from ._client import (
    CompactedError,
    Compare,
    DeleteOp,
    EventType,
    KeyValue,
    LeaseNotFoundError,
    PutOp,
    RangeOp,
    RangeResult,
    TxnResult,
    Watch,
)

if TYPE_CHECKING:
    from ._driver import EtcdDriver

__all__ = ["EtcdRecords"]

_log = logging.getLogger("aiolocks.etcd")

#: the folder of records under the backend's root
FOLDER: Final = b"\x00records\x00"
_PLAIN: Final = b"p"
_EPHEMERAL: Final = b"e"
#: kind byte + 8 random bytes
_HEADER: Final = 9


def _encode(kind: bytes, value: bytes) -> bytes:
    return kind + os.urandom(_HEADER - 1) + value


def _decode(raw: bytes) -> tuple[bytes, bool]:
    """``(value, ephemeral)`` of a stored value (one written by hand: all value)."""
    if len(raw) >= _HEADER and raw[:1] in (_PLAIN, _EPHEMERAL):
        return raw[_HEADER:], raw[:1] == _EPHEMERAL
    return raw, False


def _lease_ttl(ttl: float | None) -> int | None:
    """The whole seconds of an expiring record's lease; ``ValueError`` on a bad ttl."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise ValueError(f"a record ttl is a number of seconds, not {ttl!r}")
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"a record ttl must be a finite number of seconds > 0, not {ttl!r}")
    return max(1, math.ceil(ttl))


def _check_value(value: bytes) -> None:
    if not isinstance(value, bytes):
        raise ValueError(f"a record value is bytes, not {type(value).__name__}")


def _check_version(version: int | None) -> None:
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise ValueError(f"a record version is an int, not {version!r}")


def _found(result: TxnResult, index: int = 0) -> KeyValue | None:
    """The key read by a write's transaction (its ``RangeOp`` at ``index``)."""
    found = result.responses[index] if len(result.responses) > index else None
    if isinstance(found, RangeResult) and found.kvs:
        return found.kvs[0]
    return None


class _Member:
    """The driver's state of an :class:`Entry` (its ``handle``)."""

    __slots__ = ("create_revision", "full_key", "lease", "leaving", "task", "written")

    def __init__(self, full_key: bytes, lease: int, create_revision: int, written: int) -> None:
        self.full_key = full_key
        self.lease = lease
        #: the key's create revision: "our key" (a put after an expired one keeps it)
        self.create_revision = create_revision
        #: the revision of our write: the watch for deletes starts after it
        self.written = written
        #: a ``delete`` of ours is under way: its answer decides, not the watch
        self.leaving = False
        self.task: asyncio.Task[None] | None = None


class _EtcdSnapshot(Snapshot):
    """Children read at revision ``R``, and a watch of the prefix from ``R + 1``."""

    def __init__(self, records: Mapping[str, Record], watch: Watch, start: int) -> None:
        super().__init__(records)
        self._watch = watch
        self._start = start  # length of the watched prefix

    def _is_child(self, key: bytes) -> bool:
        return b"/" not in key[self._start :]

    async def changed(self, bound: float | None) -> None:
        """Return on the first change of a child (lease expiries too), or after ``bound``."""
        watch = self._watch
        if watch.closed or (bound is not None and bound <= 0):
            return
        try:
            async with asyncio.timeout(bound):
                async for response in watch:
                    if any(self._is_child(event.kv.key) for event in response.events):
                        return
        except TimeoutError:
            return
        except (BackendUnavailableError, CompactedError):
            return  # the caller reads again (and learns then whether etcd answers)

    def close(self) -> None:
        """Cancel the watch (idempotent, no I/O)."""
        self._watch.close()


class EtcdRecords:
    """The records of one etcd driver; ephemeral ones live on its session lease."""

    def __init__(self, driver: EtcdDriver) -> None:
        self._driver = driver
        self._client = driver.client
        self._base = driver.root + FOLDER
        #: the ephemeral records this driver wrote, by key
        self._entries: dict[str, Entry] = {}
        self._closed = False

    # -- keys and helpers

    def _key(self, key: str) -> bytes:
        if not isinstance(key, str):
            raise ValueError(f"a record key is a str, not {type(key).__name__}")
        prefix, _, child = key.rpartition("/")
        if not prefix or CHILD.fullmatch(child) is None:
            raise ValueError(
                f"a record key is '<prefix>/<child>' with a child of [A-Za-z0-9_.-]{{1,64}},"
                f" not {key!r}"
            )
        return self._base + key.encode()

    def _folder(self, prefix: str) -> bytes:
        if not isinstance(prefix, str) or not prefix or prefix.endswith("/"):
            raise ValueError(f"a record prefix is a name not ending in '/', not {prefix!r}")
        return self._base + prefix.encode() + b"/"

    def _later(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run clean-up work in the background (the engine's task set once open)."""
        self._driver._spawn(coro, name)

    async def _grant(self, ttl: int) -> int:
        """Grant a lease of our own id, so that a cancelled grant can be revoked."""
        lease = secrets.randbits(62) + 1
        try:
            await self._client.lease_grant(ttl, lease_id=lease)
        except BaseException:
            self._later(self._revoke_quietly(lease), "aiolocks-etcd-record-revoke")
            raise
        return lease

    async def _revoke(self, lease: int) -> bool:
        """Revoke a record's own lease; ``False`` when it had ended already."""
        try:
            await self._client.lease_revoke(lease)
        except LeaseNotFoundError:
            return False
        except BackendUnavailableError as exc:
            _log.info("etcd record lease %x not revoked (it ends at its TTL): %s", lease, exc)
        except BaseException:
            self._later(self._revoke_quietly(lease), "aiolocks-etcd-record-revoke")
            raise
        return True

    async def _revoke_quietly(self, lease: int) -> None:
        with contextlib.suppress(LeaseNotFoundError, BackendUnavailableError):
            await self._client.lease_revoke(lease)

    async def _lease_ended(self, lease: int) -> bool:
        try:
            info = await self._client.lease_time_to_live(lease)
        except LeaseNotFoundError:
            return True
        return info.ttl < 0

    async def _record(self, kv: KeyValue) -> Record | None:
        """The record a key holds, ``None`` when its own lease ended (expired, not swept yet)."""
        value, ephemeral = _decode(kv.value)
        ttl: float | None = None
        if kv.lease and not ephemeral:
            try:
                info = await self._client.lease_time_to_live(kv.lease)
            except LeaseNotFoundError:
                return None
            if info.ttl < 0:
                return None
            # etcd rounds the seconds left down: the lease ends within a second after
            ttl = float(min(info.ttl + 1, max(info.granted_ttl, 1)))
        return Record(value, kv.mod_revision, ephemeral, ttl)

    # -- writes

    async def _put_new(self, full: bytes, stored: bytes, lease: int) -> tuple[int, int] | None:
        """Create the key if absent (or on a lease that ended).

        ``(version, create revision)``, or ``None`` when the key exists.
        """
        try:
            result = await self._client.txn(
                [Compare.create_revision(full, "==", 0)],
                [PutOp.of(full, stored, lease=lease)],
                [RangeOp.of(full)],
                retry=True,
            )
            if result.succeeded:
                return result.revision, result.revision
            kv = _found(result)
            if kv is not None and kv.value == stored:  # an earlier send went through
                return kv.mod_revision, kv.create_revision
            if kv is None or not kv.lease or not await self._lease_ended(kv.lease):
                return None
            # expired (or its session ended), not swept yet: take its place (the
            # key keeps its create revision: read it back in the same transaction)
            result = await self._client.txn(
                [Compare.mod_revision(full, "==", kv.mod_revision)],
                [PutOp.of(full, stored, lease=lease), RangeOp.of(full)],
                [RangeOp.of(full)],
                retry=True,
            )
            kv = _found(result, 1 if result.succeeded else 0)
            if kv is not None and kv.value == stored:
                return kv.mod_revision, kv.create_revision
            return None
        except LeaseNotFoundError:
            raise
        except BaseException:
            self._later(self._drop_if_ours(full, stored), "aiolocks-etcd-record-drop")
            raise

    async def _drop_if_ours(self, full: bytes, stored: bytes) -> None:
        """Delete the key if it still holds the bytes of a write whose answer never came."""
        with contextlib.suppress(BackendUnavailableError):
            await self._client.txn(
                [Compare.value_of(full, "==", stored)], [DeleteOp.of(full)], [], retry=True
            )

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int | None:
        """Write a persistent or expiring (own lease) record if absent; its version, or ``None``."""
        full = self._key(key)
        _check_value(value)
        lease_ttl = _lease_ttl(ttl)
        stored = _encode(_PLAIN, value)
        if lease_ttl is None:
            written = await self._put_new(full, stored, 0)
            return None if written is None else written[0]
        lease = await self._grant(lease_ttl)
        try:
            written = await self._put_new(full, stored, lease)
        except BaseException:
            self._later(self._revoke_quietly(lease), "aiolocks-etcd-record-revoke")
            raise
        if written is None:
            await self._revoke(lease)
            return None
        return written[0]

    async def join(self, key: str, value: bytes) -> Entry | None:
        """Write an ephemeral record on the session lease if absent; ``None`` when it exists."""
        full = self._key(key)
        _check_value(value)
        stored = _encode(_EPHEMERAL, value)
        driver = self._driver
        for _ in range(3):
            session = await driver._live_session()
            try:
                written = await self._put_new(full, stored, session.lease_id)
            except LeaseNotFoundError:
                driver._session_lost(session, "etcd said the lease does not exist")
                continue
            if written is None:
                return None
            version, created = written
            member = _Member(full, session.lease_id, created, version)
            entry = Entry(key, version, member)
            if session.lost.is_set():
                entry.mark_lost(f"the etcd session lease {session.lease_id:x} ended")
                return entry
            self._entries[key] = entry
            member.task = driver._watcher(self._watch_entry(entry, member), "aiolocks-etcd-member")
            return entry
        raise BackendUnavailableError("etcd: no session lease lived long enough to join")

    async def update(
        self, key: str, value: bytes, *, version: int, ttl: float | None = None
    ) -> int | None:
        """Compare-and-set on ``mod_revision``; a ttl gets a new lease, the old one is revoked."""
        full = self._key(key)
        _check_value(value)
        _check_version(version)
        lease_ttl = _lease_ttl(ttl)
        found = await self._client.range(RangeOp.of(full))
        kv = found.kvs[0] if found.kvs else None
        if kv is None or kv.mod_revision != version:
            return None
        ephemeral = _decode(kv.value)[1]
        if ephemeral and ttl is not None:
            raise ValueError(f"record {key!r} is ephemeral: it takes no ttl")
        old = 0 if ephemeral else kv.lease  # a lease of the record's own
        if old and await self._lease_ended(old):
            return None  # expired
        lease = kv.lease if ephemeral else 0
        if lease_ttl is not None:
            lease = await self._grant(lease_ttl)
        stored = _encode(_EPHEMERAL if ephemeral else _PLAIN, value)
        new = 0 if ephemeral else lease
        try:
            result = await self._client.txn(
                [Compare.mod_revision(full, "==", version)],
                [PutOp.of(full, stored, lease=lease)],
                [RangeOp.of(full)],
                retry=True,
            )
        except LeaseNotFoundError:
            return None  # the ephemeral record's session lease ended: it is gone
        except BaseException:
            self._later(self._settle(full, stored, old, new), "aiolocks-etcd-record-settle")
            raise
        now = _found(result)
        ours = result.succeeded or (now is not None and now.value == stored)
        unused = old if ours else new
        if unused:
            await self._revoke(unused)
        if result.succeeded:
            return result.revision
        return now.mod_revision if ours and now is not None else None

    async def _settle(self, full: bytes, stored: bytes, old: int, new: int) -> None:
        """After a write whose answer never came: revoke the lease it left unused.

        ``stored`` went through if the key holds it (a delete: if the key is
        gone or not on ``old`` any more); then ``old`` is unused, else ``new``.
        """
        with contextlib.suppress(BackendUnavailableError):
            found = await self._client.range(RangeOp.of(full))
            kv = found.kvs[0] if found.kvs else None
            if stored:
                ours = kv is not None and kv.value == stored
            else:
                ours = kv is None or kv.lease != old
            unused = old if ours else new
            if unused:
                await self._revoke_quietly(unused)

    async def delete(self, key: str, *, version: int | None = None) -> bool:
        """Delete (if ``mod_revision`` is ``version``); revoke an expiring record's lease.

        The key is read first: its lease must be known before the delete, so
        that a delete cancelled after etcd applied it still revokes the lease.
        """
        full = self._key(key)
        _check_version(version)
        for _ in range(3):
            found = await self._client.range(RangeOp.of(full))
            kv = found.kvs[0] if found.kvs else None
            if kv is None or (version is not None and kv.mod_revision != version):
                self._check_member(key, kv)
                return False
            deleted = await self._delete_at(key, full, kv)
            if deleted is not None or version is not None:
                return bool(deleted)
        return False  # written again and again meanwhile: not deleted by this call

    async def _delete_at(self, key: str, full: bytes, kv: KeyValue) -> bool | None:
        """Delete ``kv`` if it is still at its ``mod_revision``; ``None`` when it changed."""
        own = 0 if _decode(kv.value)[1] else kv.lease  # an expiring record's own lease
        entry = self._entries.get(key)
        member = entry.handle if entry is not None else None
        assert member is None or isinstance(member, _Member)
        if member is not None:
            member.leaving = True
        try:
            result = await self._client.txn(
                [Compare.mod_revision(full, "==", kv.mod_revision)],
                [DeleteOp.of(full)],
                [RangeOp.of(full)],
                retry=False,
            )
        except BaseException:
            if member is not None and entry is not None:
                # still leaving: the recheck decides, not a delete event of our own
                self._later(self._recheck(entry, member), "aiolocks-etcd-member-recheck")
            if own:
                self._later(self._settle(full, b"", own, 0), "aiolocks-etcd-record-settle")
            raise
        if member is not None:
            member.leaving = False
        if not result.succeeded:
            self._check_member(key, _found(result))
            return None
        if entry is not None and member is not None:
            if kv.create_revision == member.create_revision:
                self._forget(entry)  # our own delete: not a loss
            else:
                self._check_member(key, None)
        if own:
            return await self._revoke(own)  # ended already: it had expired
        return True

    def _check_member(self, key: str, kv: KeyValue | None) -> None:
        """Our entry of ``key`` is lost if the key read is not its key any more."""
        entry = self._entries.get(key)
        member = entry.handle if entry is not None else None
        if entry is None or not isinstance(member, _Member):
            return
        if kv is None or kv.create_revision != member.create_revision:
            self._lose(entry, f"etcd key {member.full_key!r} was deleted behind our back")

    async def _recheck(self, entry: Entry, member: _Member) -> None:
        """After a delete whose answer never came: forget the entry if its key went.

        Our own delete is no loss, even cancelled. Until this read answers, the
        entry's watch ignores deletes (the entry is ``leaving``); a watch that
        ended on one leaves nothing to watch, and the entry goes with it.
        """
        try:
            found = await self._client.range(RangeOp.of(member.full_key))
        except BackendUnavailableError:
            gone = member.task is None or member.task.done()
        else:
            gone = not found.kvs or found.kvs[0].create_revision != member.create_revision
        member.leaving = False
        if gone:
            self._forget(entry)

    # -- reads

    async def read(self, key: str) -> Record | None:
        """The record, or ``None`` when absent or expired."""
        found = await self._client.range(RangeOp.of(self._key(key)))
        return await self._record(found.kvs[0]) if found.kvs else None

    async def snapshot(self, prefix: str) -> Snapshot:
        """The children of ``prefix`` at one revision, and a watch from the next one."""
        folder = self._folder(prefix)
        found = await self._client.range(RangeOp.of(folder, prefix=True))
        watch = await self._client.watch(folder, prefix=True, start_revision=found.revision + 1)
        try:
            kvs = [kv for kv in found.kvs if b"/" not in kv.key[len(folder) :]]
            records = [await self._record(kv) for kv in kvs]  # a ttl read per expiring one
        except BaseException:
            watch.close()
            raise
        children = {
            kv.key[len(folder) :].decode("utf-8", "replace"): record
            for kv, record in zip(kvs, records, strict=True)
            if record is not None
        }
        return _EtcdSnapshot(children, watch, len(folder))

    # -- ephemeral entries

    def _forget(self, entry: Entry) -> None:
        """Stop watching an entry (deleted by us, lost, or the driver closed)."""
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        member = entry.handle
        if isinstance(member, _Member):
            task, member.task = member.task, None
            if task is not None and task is not asyncio.current_task():
                task.cancel()

    def _lose(self, entry: Entry, reason: str) -> None:
        self._forget(entry)
        entry.mark_lost(reason)

    def session_lost(self, lease: int, reason: str) -> None:
        """The driver's session lease ``lease`` ended: its entries are lost."""
        if self._closed:
            return
        for entry in list(self._entries.values()):
            member = entry.handle
            if isinstance(member, _Member) and member.lease == lease:
                self._lose(entry, f"the etcd session lease {lease:x} ended: {reason}")

    async def _watch_entry(self, entry: Entry, member: _Member) -> None:
        """Mark the entry lost when its key is deleted behind our back."""
        start = member.written + 1
        backoff = Backoff(math.inf, first=0.1, cap=2.0)  # the session deadline bounds it
        while self._entries.get(entry.key) is entry:
            try:
                watch = await self._client.watch(member.full_key, start_revision=start, no_put=True)
            except BackendUnavailableError:
                await backoff.wait()
                continue
            try:
                start = await self._follow(entry, member, watch)
            finally:
                watch.close()
            if not start:
                return

    async def _follow(self, entry: Entry, member: _Member, watch: Watch) -> int:
        """Follow one watch; the revision to watch from again, 0 when done."""
        while True:
            try:
                response = await anext(watch)
            except BackendUnavailableError:
                continue  # the stream keeps trying; the session deadline bounds the entry
            except StopAsyncIteration:
                return 0
            except CompactedError:
                return await self._compacted(entry, member)
            if any(event.type is EventType.DELETE for event in response.events):
                if not member.leaving:  # else our delete's answer decides
                    self._lose(entry, f"etcd key {member.full_key!r} was deleted behind our back")
                return 0

    async def _compacted(self, entry: Entry, member: _Member) -> int:
        """The history the watch started from is gone: is the key still ours?"""
        try:
            found = await self._client.range(RangeOp.of(member.full_key))
        except BackendUnavailableError:
            return member.written + 1  # compacted again: this branch once more
        if not found.kvs or found.kvs[0].create_revision != member.create_revision:
            if not member.leaving:
                self._lose(entry, "its etcd key was gone when its watch was compacted")
            return 0
        return found.revision + 1

    def close(self) -> None:
        """The driver closes: stop watching entries (their keys go with the session lease)."""
        self._closed = True
        for entry in list(self._entries.values()):
            self._forget(entry)
