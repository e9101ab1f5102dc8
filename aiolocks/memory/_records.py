"""The record store of ``memory://`` (the contract of :mod:`aiolocks._core.records`).

One :class:`_Space` per (event loop, store name), like the lock store:
backends built with the same store name in one loop share records. Expiry
runs on the loop's clock; an ephemeral record belongs to the driver that
wrote it and goes when that driver closes (its "session"). A change wakes
the futures of the snapshots of the record's prefix; nothing polls.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from dataclasses import dataclass

from .._core.records import Entry, Record, Snapshot
from .._core.tasks import wait_done

__all__ = ["MemoryRecords"]


@dataclass(slots=True)
class _Stored:
    value: bytes
    version: int
    owner: MemoryRecords | None  # the writer of an ephemeral record
    expires: float | None  # loop time


class _Space:
    def __init__(self) -> None:
        self.records: dict[str, _Stored] = {}
        self.waiters: dict[str, set[asyncio.Future[None]]] = {}
        self.versions = itertools.count(1)

    def live(self, key: str) -> _Stored | None:
        stored = self.records.get(key)
        if stored is None:
            return None
        if stored.expires is not None and stored.expires <= asyncio.get_running_loop().time():
            del self.records[key]
            return None
        return stored

    def changed(self, key: str) -> None:
        prefix = key.rpartition("/")[0]
        for future in self.waiters.pop(prefix, ()):
            if not future.done():
                future.set_result(None)


_spaces: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Space]] = (
    weakref.WeakKeyDictionary()
)


def _space(name: str) -> _Space:
    spaces = _spaces.setdefault(asyncio.get_running_loop(), {})
    space = spaces.get(name)
    if space is None:
        space = spaces[name] = _Space()
    return space


class _MemorySnapshot(Snapshot):
    def __init__(self, space: _Space, prefix: str, records: dict[str, Record]) -> None:
        super().__init__(records)
        self._space = space
        self._prefix = prefix
        self._future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        space.waiters.setdefault(prefix, set()).add(self._future)
        expiries = [r.ttl for r in records.values() if r.ttl is not None]
        self._expires_in = min(expiries) if expiries else None

    async def changed(self, bound: float | None) -> None:
        if self._expires_in is not None:
            bound = self._expires_in if bound is None else min(bound, self._expires_in)
        if bound is not None and bound <= 0:
            return
        await wait_done(self._future, bound)

    def close(self) -> None:
        waiters = self._space.waiters.get(self._prefix)
        if waiters is not None:
            waiters.discard(self._future)
            if not waiters:
                del self._space.waiters[self._prefix]


class MemoryRecords:
    """Records of one ``memory://`` driver; ephemeral ones go when it closes."""

    def __init__(self, store: str) -> None:
        self._store = store
        self._entries: dict[str, Entry] = {}

    def _space(self) -> _Space:
        return _space(self._store)

    def _write(self, key: str, value: bytes, ttl: float | None, owner: MemoryRecords | None) -> int:
        space = self._space()
        version = next(space.versions)
        expires = None if ttl is None else asyncio.get_running_loop().time() + ttl
        space.records[key] = _Stored(value, version, owner, expires)
        space.changed(key)
        return version

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int | None:
        """Write a persistent or expiring record if absent."""
        if self._space().live(key) is not None:
            return None
        return self._write(key, value, ttl, None)

    async def join(self, key: str, value: bytes) -> Entry | None:
        """Write an ephemeral record if absent; it goes when this driver closes."""
        if self._space().live(key) is not None:
            return None
        entry = Entry(key, self._write(key, value, None, self))
        self._entries[key] = entry
        return entry

    async def update(
        self, key: str, value: bytes, *, version: int, ttl: float | None = None
    ) -> int | None:
        """Compare-and-set by version; an ephemeral record stays ephemeral."""
        stored = self._space().live(key)
        if stored is None or stored.version != version:
            return None
        if stored.owner is not None and ttl is not None:
            raise ValueError(f"record {key!r} is ephemeral: it takes no ttl")
        return self._write(key, value, ttl, stored.owner)

    async def delete(self, key: str, *, version: int | None = None) -> bool:
        """Delete (at ``version``, when given)."""
        space = self._space()
        stored = space.live(key)
        if stored is None or (version is not None and stored.version != version):
            return False
        del space.records[key]
        if stored.owner is not None:
            entry = stored.owner._entries.pop(key, None)
            if entry is not None and stored.owner is not self:
                entry.mark_lost(f"record {key!r} was deleted by another client")
        space.changed(key)
        return True

    async def read(self, key: str) -> Record | None:
        """The record, or ``None``."""
        stored = self._space().live(key)
        return None if stored is None else self._record(stored)

    async def snapshot(self, prefix: str) -> Snapshot:
        """The children of ``prefix`` and a future set by their next change."""
        space = self._space()
        start = prefix + "/"
        records = {
            key[len(start) :]: self._record(stored)
            for key in list(space.records)
            if key.startswith(start)
            and "/" not in key[len(start) :]
            and (stored := space.live(key)) is not None
        }
        return _MemorySnapshot(space, prefix, records)

    def _record(self, stored: _Stored) -> Record:
        ttl = None
        if stored.expires is not None:
            ttl = max(0.0, stored.expires - asyncio.get_running_loop().time())
        return Record(stored.value, stored.version, stored.owner is not None, ttl)

    def close(self) -> None:
        """The driver closed: its ephemeral records go (not a loss)."""
        space = self._space()
        entries, self._entries = self._entries, {}
        for key in entries:
            stored = space.records.get(key)
            if stored is not None and stored.owner is self:
                del space.records[key]
                space.changed(key)
