"""Records: the small keyed store under the coordination recipes.

Group membership, the partitioner, leader observation, count-down latches,
barriers and once-per-period jobs are built once in the core (like locks) on
top of this optional part of the driver contract. A driver offers it by
having a ``records()`` method (:class:`SupportsRecords`) that returns an
object with the methods of :class:`Records`.

The model
---------
A *record* is a key -> bytes value with a version. A key is
``<prefix>/<child>``: ``prefix`` is a canonical lock-style name (segments of
``[A-Za-z0-9._-]`` and more, joined by ``/``, as the core validates them);
``child`` matches ``[A-Za-z0-9_.-]{1,64}``. The core never writes a key
under another record's key, so "the children of a prefix" are exactly the
records whose key is ``prefix + "/" + child``. A driver keeps records apart
from its locks (its own node folder, key prefix, table, etc.).

A record is one of:

* *persistent*: lives until deleted (``create(..., ttl=None)``);
* *expiring*: ``create(..., ttl=S)`` or ``update(..., ttl=S)``: the **server**
  lets it go ``S`` seconds after the server took the write (Redis ``PX``, an
  etcd lease, PostgreSQL ``now() + interval``, a ZooKeeper node whose data
  carries the server's modification time). An expired record is absent for
  every method here, even before the server cleaned it up;
* *ephemeral* (:meth:`Records.join`): tied to this backend's session
  (a ZooKeeper ephemeral node, the etcd session lease, a Redis key renewed
  by the driver's watchdog, a PostgreSQL row owned by the driver's primary
  session). When the session ends (process killed, session expired, lease
  not renewed) the record goes, and the driver tells the :class:`Entry`
  (``mark_lost``) the moment it knows.

``version`` is an int that changes on every write of a key (ZooKeeper
``stat.version``/``czxid`` mix, etcd ``mod_revision``, a counter elsewhere);
compare-and-set takes it. Two different writes of one key never return the
same version, even across a delete and re-create.

Methods (all raise :class:`BackendUnavailableError` when the server cannot
be reached within the driver's retry policy, :class:`AccessDeniedError` when
refused):

``await create(key, value, *, ttl=None) -> int | None``
    Write a persistent (``ttl=None``) or expiring record if the key is absent
    (or expired). The new version, or ``None`` when the key exists.
``await join(key, value) -> Entry | None``
    Write an ephemeral record if the key is absent; ``None`` when it exists.
``await update(key, value, *, version, ttl=None) -> int | None``
    Compare-and-set: replace the value if the key's version is ``version``;
    the new version, or ``None`` when absent or changed. An ephemeral record
    stays ephemeral (``ttl`` must be ``None`` then); a persistent or expiring
    record gets the expiry ``ttl`` (``None``: no expiry) from this write on.
``await delete(key, *, version=None) -> bool``
    Delete (only if its version is ``version``, when given); ``True`` when
    this call deleted it. Deleting an ephemeral record also stops the
    driver's work for it (renewals) and does not mark its entry lost.
``await read(key) -> Record | None``
``await snapshot(prefix) -> Snapshot``
    The children of ``prefix`` now, and a way to wait for the next change.

Waiting
-------
:class:`Snapshot` holds ``records`` (child -> :class:`Record`) and an armed
change detector. ``await snapshot.changed(bound)`` returns when any child of
the prefix was created, updated or deleted after the snapshot was read,
including an ephemeral record that went with its session and an expiring
record that expired, or after ``bound`` seconds (``None``: no bound). It may
return early for no reason (callers read again), never later than ``bound``.
It is event-driven where the server has events (ZooKeeper watches, etcd
watch, Redis pub/sub published by every write, PostgreSQL ``NOTIFY``); for
what publishes nothing (an expiry, a session that died on a server without
events) a driver bounds its wait by the earliest expiry among the records it
read, so the change is seen within about half a second of the server
noticing. ``snapshot.close()`` (synchronous, idempotent) drops the watch;
callers always close it (``with snapshot:``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, final, runtime_checkable

from .lossflag import LossFlag

__all__ = [
    "CHILD",
    "Entry",
    "Record",
    "Records",
    "Snapshot",
    "SupportsRecords",
]

#: what a child segment of a record key may hold
CHILD = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@final
@dataclass(frozen=True, slots=True)
class Record:
    """One record as read: its value, version and kind."""

    value: bytes
    version: int
    #: tied to a session (:meth:`Records.join`)
    ephemeral: bool = False
    #: seconds left before the server lets it go, when it expires; else ``None``
    ttl: float | None = None


class Entry(LossFlag):
    """An ephemeral record this process wrote: its key, version and loss flag.

    The driver creates it in :meth:`Records.join`; the core keeps ``version``
    current after its own ``update`` calls and listens for loss.
    """

    __slots__ = ("handle", "key", "version")

    def __init__(self, key: str, version: int, handle: object = None) -> None:
        super().__init__()
        self.key = key
        self.version = version
        #: the driver's own state for this entry (lease id, renewal record)
        self.handle = handle

    def __repr__(self) -> str:
        state = f" lost={self.lost_reason!r}" if self.lost else ""
        return f"<Entry {self.key} v{self.version}{state}>"


class Snapshot:
    """The children of a prefix as read, with an armed change detector.

    Drivers subclass it and implement :meth:`changed` and :meth:`close`.
    """

    def __init__(self, records: Mapping[str, Record]) -> None:
        #: child -> record, as read
        self.records: dict[str, Record] = dict(records)

    async def changed(self, bound: float | None) -> None:
        """Return when a child changed after the read, or after ``bound`` seconds."""
        raise NotImplementedError

    def close(self) -> None:
        """Drop the watch; idempotent, no I/O."""

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Records(Protocol):
    """The keyed store of a backend; see the module docstring for the contract."""

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int | None:
        """Write a persistent or expiring record if absent; its version, or ``None``."""
        ...

    async def join(self, key: str, value: bytes) -> Entry | None:
        """Write an ephemeral (session-tied) record if absent; ``None`` when it exists."""
        ...

    async def update(
        self, key: str, value: bytes, *, version: int, ttl: float | None = None
    ) -> int | None:
        """Compare-and-set by version; the new version, or ``None``."""
        ...

    async def delete(self, key: str, *, version: int | None = None) -> bool:
        """Delete (if at ``version``); ``True`` when this call deleted it."""
        ...

    async def read(self, key: str) -> Record | None:
        """The record, or ``None`` when absent or expired."""
        ...

    async def snapshot(self, prefix: str) -> Snapshot:
        """The children of ``prefix`` and an armed change detector."""
        ...


@runtime_checkable
class SupportsRecords(Protocol):
    """A driver with the keyed store the coordination recipes need."""

    def records(self) -> Records:
        """This backend's record store (one per driver; no I/O)."""
        ...
