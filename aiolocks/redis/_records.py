"""The record store of the Redis driver (the contract of :mod:`aiolocks._core.records`).

Design note
-----------
Keys (``P`` = the backend's ``key_prefix``, ``p`` = a record prefix): every
record of one prefix shares the hash tag ``{records:p}``, so one Cluster
slot, and one script sees them all:

* ``P{records:p}`` -- the *index*: a hash, child -> ``1``, and field ``#``,
  the last version written under the prefix;
* ``P{records:p}/<child>`` -- one *record*: a hash with ``v`` (value), ``n``
  (version), ``w`` (the id of the write that wrote it) and, for an
  ephemeral record, ``o`` (its owner: the id of the ``join``); expiring and
  ephemeral records have a ``PEXPIRE``;
* ``P{records:p}!<op id>`` -- a short-lived *outcome* key (a few seconds):
  "this operation is settled" (a delete that ran, a create given up);
* channel ``P{records:p}`` -- every write ``PUBLISH``es the child's name.

Every write is one ``records.lua`` call (atomic; the index kept in step).
Versions are ``max(last version + 1, server time in microseconds)``: they
only grow while the index lives, and the index outlives the last write of
its children by a minute (``LINGER`` in the script), after which a new
version starts from the server's clock, past every earlier one. So a
version never comes back across a delete and re-create unless the
server's clock steps back by more than that minute while the prefix sits
empty.

Each operation carries an id minted before it is sent
(``<backend uuid>:r<serial>``, Curator's protected mode): the script
answers a resend of a create, join or update that already ran with the same
version, and a resend of a delete that ran with ``True``, so redis-py's and
our own retries on a connection error never turn a success into a "no".
When a create or join ends without its answer (cancelled, connection lost),
``abandon`` runs in the engine's task set: it deletes the record if that
operation wrote it, and leaves the outcome key, so that the script, if it
reaches Redis later on another connection, refuses to write.

Ephemeral records (``join``) are written with a ``PX`` of the backend's
``lease_time``; the driver's :class:`~aiolocks.redis._watchdog.Watchdog`
renews them every third of it, as it does locks. A renewal that finds the
key gone or owned by another join, or that Redis does not confirm before
the lease ends, marks the :class:`Entry` lost. Where the server publishes
keyspace events (the ``keyspace_events`` option, as for lock holds), the
entry also listens to its key's: a delete, expiry or eviction behind its
back makes it read the key's owner at once. ``delete`` of an ephemeral
record stops its renewal; closing the backend deletes its ephemeral records
(an orderly close is no loss).

Waiting: a snapshot subscribes to the prefix's channel (and waits for the
server's confirmation) *before* it reads, so no write falls between the read
and the wait. ``changed()`` returns on a message, on a pub/sub reconnect
(messages may have been lost), or at the earliest expiry among the children
it read (an expiry, or a dead process's ephemeral record lapsing, publishes
nothing). A snapshot also drops from the index the children it found gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from redis.exceptions import RedisError

from .._core.backoff import Backoff
from .._core.errors import AccessDeniedError, BackendUnavailableError
from .._core.records import CHILD, Entry, Record, Snapshot
from ._access import map_error, retry_after
from ._pubsub import PubSubHub
from ._watchdog import TRANSIENT, Renewal, RenewResult, Watchdog

if TYPE_CHECKING:
    from ._driver import RedisNode

__all__ = ["RecordKeys", "RedisRecords", "RedisSnapshot", "record_keys"]

logger = logging.getLogger("aiolocks.redis")

#: why a renewal of an ephemeral record failed
GONE = "its Redis key is gone or belongs to another session (deleted, expired or re-created)"
#: keyspace events on an ephemeral record that cannot take it from us: our own
#: renewals (``PEXPIRE``) and updates (``HSET``, which keeps the owner)
HARMLESS_EVENTS = frozenset({"expire", "hset"})
#: a snapshot's wait ends this long after the earliest expiry it read (s):
#: Redis has let the key go by then, so the next read does not see it again
EXPIRY_SLACK = 0.005


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


@final
@dataclass(frozen=True, slots=True)
class RecordKeys:
    """The keys and channel of one record (or, for a snapshot, of its prefix)."""

    index: str
    record: str
    child: str

    @property
    def channel(self) -> str:
        """The prefix's channel: every write publishes the child's name there."""
        return self.index

    def script_keys(self, op_id: str) -> list[str]:
        """``records.lua``'s KEYS: index, record, this operation's outcome key."""
        return [self.index, self.record, f"{self.index}!{op_id}"]


def record_keys(key_prefix: str, prefix: str, child: str = "") -> RecordKeys:
    """The keys of ``prefix/child`` under the backend's ``key_prefix`` (no I/O)."""
    index = f"{key_prefix}{{records:{prefix}}}"
    return RecordKeys(index, f"{index}/{child}" if child else index, child)


def _split(key: object) -> tuple[str, str]:
    """``(prefix, child)`` of a record key, or ``ValueError``."""
    if not isinstance(key, str):
        raise ValueError(f"record key must be a str, got {key!r}")
    prefix, sep, child = key.rpartition("/")
    if not sep or not _prefix_ok(prefix) or not CHILD.fullmatch(child):
        raise ValueError(
            f"record key {key!r} must be <prefix>/<child>, the child of 1 to 64 "
            "characters out of A-Z a-z 0-9 _ . -"
        )
    return prefix, child


def _prefix_ok(prefix: object) -> bool:
    return isinstance(prefix, str) and bool(prefix) and not prefix.startswith("/")


def _check_value(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError(f"a record's value must be bytes, got {type(value).__name__}")
    return value


def _ttl_ms(ttl: object) -> int:
    """``ttl`` seconds as ``PX`` milliseconds (0: no expiry), or ``ValueError``."""
    if ttl is None:
        return 0
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < 10**9:
        raise ValueError(f"ttl must be None or a number of seconds > 0, got {ttl!r}")
    return max(1, round(ttl * 1000))


def _version(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"version must be an int, got {value!r}")
    return value


def _record(value: object, version: object, ephemeral: object, pttl: object) -> Record:
    left = int(_text(pttl))
    is_ephemeral = int(_text(ephemeral)) == 1
    ttl = None if is_ephemeral or left < 0 else left / 1000
    return Record(_bytes(value), int(_text(version)), is_ephemeral, ttl)


@final
class _Member:
    """``Entry.handle`` of an ephemeral record of ours: its keys, owner id and renewal."""

    __slots__ = (
        "checking",
        "deleting",
        "entry",
        "keys",
        "on_lost",
        "on_stop",
        "owner",
        "pending",
        "recheck",
        "renewal",
        "valid_until",
    )

    def __init__(
        self,
        entry: Entry,
        keys: RecordKeys,
        owner: str,
        valid_until: float,
        on_lost: Callable[[_Member], None],
    ) -> None:
        self.entry = entry
        self.keys = keys
        self.owner = owner
        #: what the watchdog keeps current (:class:`~._watchdog.Vouched`)
        self.valid_until: float | None = valid_until
        self.on_lost = on_lost
        self.renewal: Renewal | None = None
        #: deletes of ours on the wire: a renewal finding the key gone then is
        #: no loss yet (``pending``), unless the delete turns out not to be ours
        self.deleting = 0
        self.pending: str | None = None
        #: undoes the keyspace-event subscription (``RedisRecords._watch``)
        self.on_stop: Callable[[], None] | None = None
        #: a check of the key is on the wire / another event came meanwhile
        self.checking = False
        self.recheck = False

    def mark_lost(self, reason: str) -> None:
        """The watchdog found the record gone (or could not renew it in time)."""
        if self.deleting:
            self.pending = reason
            return
        self.on_lost(self)
        self.entry.mark_lost(reason)

    def lose_now(self, reason: str) -> None:
        """A keyspace event's check found the record gone or another session's."""
        renewal = self.renewal
        if renewal is not None and not renewal.stopped:
            renewal.stop()
            self.mark_lost(reason)

    def stop(self) -> None:
        """Stop renewing and listening (deleted, lost, or the backend closes). No I/O."""
        if self.renewal is not None:
            self.renewal.stop()
        if self.on_stop is not None:
            on_stop, self.on_stop = self.on_stop, None
            on_stop()

    def note_renewed(self) -> None:
        """A renewal succeeded (records have no event hooks)."""


@final
class RedisSnapshot(Snapshot):
    """The children of a prefix as read, and a pub/sub subscription armed before the read."""

    def __init__(
        self,
        records: dict[str, Record],
        hub: PubSubHub,
        channel: str,
        listener: Callable[[str | None], None],
        event: asyncio.Event,
        expires_at: float | None,
    ) -> None:
        super().__init__(records)
        self._hub = hub
        self._channel = channel
        self._listener = listener
        #: set by a message on the channel, or a (re)subscription
        self._event = event
        #: ``time.monotonic()`` just past the earliest expiry among the children read
        self._expires_at = expires_at
        self._closed = False

    async def changed(self, bound: float | None) -> None:
        """Return on a write under the prefix, the earliest expiry read, or ``bound`` s."""
        wait = bound
        if self._expires_at is not None:
            left = max(0.0, self._expires_at - time.monotonic())
            wait = left if wait is None else min(wait, left)
        if self._closed or self._event.is_set() or (wait is not None and wait <= 0):
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._event.wait()

    def close(self) -> None:
        """Stop listening (the subscription lingers a while for the next snapshot)."""
        if not self._closed:
            self._closed = True
            self._hub.unwatch(self._channel, self._listener)


@final
class RedisRecords:
    """The record store of one Redis backend (see the module's design note).

    Built by ``RedisDriver.records()`` (no I/O); every method needs the
    backend open, and raises :class:`BackendUnavailableError` once it closed.
    """

    def __init__(
        self,
        node: RedisNode,
        *,
        key_prefix: str,
        lease_time: float,
        client_uuid: str,
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
        closed: Callable[[], bool],
    ) -> None:
        self._node = node
        self._key_prefix = key_prefix
        self._lease = lease_time
        self._uuid = client_uuid
        self._serial = itertools.count(1)
        self._spawn = spawn
        self._closed = closed
        #: our ephemeral records, by key
        self._entries: dict[str, _Member] = {}
        self._watchdog = Watchdog(
            self._renew_many, spawn, name=f"aiolocks-redis-records-watchdog:{node.describe}"
        )
        #: how long an outcome key lives: past any resend or late arrival of its operation
        self._outcome_ms = int(min(node.connect_timeout, 30.0) * 1000) + 2000

    def _keys(self, key: object) -> RecordKeys:
        prefix, child = _split(key)
        return record_keys(self._key_prefix, prefix, child)

    def _mint(self) -> str:
        return f"{self._uuid}:r{next(self._serial):x}"

    async def _call(
        self, keys: RecordKeys, op: str, op_id: str, extra: Sequence[object], what: str
    ) -> Any:
        """One ``records.lua`` call, retried through a short outage (every op is
        safe to resend: see the design note); errors mapped once."""
        node = self._node
        if self._closed() or node.client is None:
            raise BackendUnavailableError(f"the Redis backend {node.describe} is not open")
        args = [op, keys.child, keys.channel, op_id, self._outcome_ms, *extra]
        backoff: Backoff | None = None
        while True:
            try:
                return await node.evalsha("records", keys.script_keys(op_id), args)
            except TRANSIENT as exc:
                if backoff is None:
                    backoff = Backoff(time.monotonic() + node.connect_timeout)
                if not await retry_after(exc, backoff):
                    raise map_error(exc, what, node.describe) from exc
            except RedisError as exc:
                raise map_error(exc, what, node.describe) from exc

    async def _create(
        self, key: str, keys: RecordKeys, value: bytes, ttl_ms: int, op_id: str, owner: str
    ) -> int | None:
        """The ``create`` branch of the script; given up in the background if unanswered."""
        try:
            reply = await self._call(
                keys, "create", op_id, [value, ttl_ms, owner], f"creating record {key!r}"
            )
        except BaseException as exc:
            # Cancelled or failed with the script maybe run, or on the wire:
            # undo it / make it lose (no await here: the engine's task set).
            if not isinstance(exc, AccessDeniedError):
                self._abandon_later(keys, op_id, ttl_ms / 1000 or self._lease)
            raise
        return int(_text(reply[1])) if int(reply[0]) == 1 else None

    def _abandon_later(self, keys: RecordKeys, op_id: str, lapses_in: float) -> None:
        if not self._closed():
            self._spawn(
                self._abandon(keys, op_id, time.monotonic() + lapses_in),
                f"aiolocks-redis-records-abandon:{keys.record}",
            )

    async def _abandon(self, keys: RecordKeys, op_id: str, give_up: float) -> None:
        """Delete what the create/join ``op_id`` wrote, or make it lose if it
        arrives later; retried until what it left would lapse by itself."""
        backoff = Backoff(give_up)
        args = ["abandon", keys.child, keys.channel, op_id, self._outcome_ms]
        while not self._closed():
            try:
                await self._node.evalsha("records", keys.script_keys(op_id), args)
            except TRANSIENT as exc:
                if await retry_after(exc, backoff):
                    continue
                logger.warning("could not undo an unanswered write of %s: %s", keys.record, exc)
            except RedisError as exc:
                logger.warning("could not undo an unanswered write of %s: %s", keys.record, exc)
            return

    # -- the Records protocol -----------------------------------------------------

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int | None:
        """Write a persistent or expiring record if absent; its version, or ``None``."""
        keys, value, ttl_ms = self._keys(key), _check_value(value), _ttl_ms(ttl)
        return await self._create(key, keys, value, ttl_ms, self._mint(), "")

    async def join(self, key: str, value: bytes) -> Entry | None:
        """Write an ephemeral record (renewed by the watchdog) if absent; ``None`` if it exists."""
        keys, value = self._keys(key), _check_value(value)
        op_id = self._mint()
        lease = self._lease
        sent = time.monotonic()
        version = await self._create(key, keys, value, max(1, round(lease * 1000)), op_id, op_id)
        if version is None:
            return None
        # No await from here on: the entry and its renewal start together.
        entry = Entry(key, version)
        member = _Member(entry, keys, op_id, sent + lease, self._forget)
        entry.handle = member
        member.renewal = Renewal(
            member, member, lease=lease, valid_until=sent + lease, enabled=True, owner=None
        )
        old = self._entries.get(key)
        if old is not None:
            self._forget(old)
        self._entries[key] = member
        self._watchdog.watch(member.renewal)
        self._watch(member)
        return entry

    async def update(
        self, key: str, value: bytes, *, version: int, ttl: float | None = None
    ) -> int | None:
        """Compare-and-set by version; the new version, or ``None``."""
        keys, value, ttl_ms = self._keys(key), _check_value(value), _ttl_ms(ttl)
        expected = _version(version)
        reply = await self._call(
            keys, "update", self._mint(), [value, ttl_ms, expected], f"updating record {key!r}"
        )
        code = int(reply[0])
        if code == -2:
            raise ValueError(f"record {key!r} is ephemeral: it takes no ttl")
        return int(_text(reply[1])) if code == 1 else None

    async def delete(self, key: str, *, version: int | None = None) -> bool:
        """Delete (only at ``version``, when given); ``True`` when this call deleted it."""
        keys = self._keys(key)
        expected = "" if version is None else str(_version(version))
        member = self._entries.get(key)
        if member is not None:
            member.deleting += 1
        deleted = False
        try:
            reply = await self._call(
                keys, "delete", self._mint(), [expected, ""], f"deleting record {key!r}"
            )
            deleted = int(reply) == 1
        finally:
            if member is not None:
                member.deleting -= 1
                self._after_delete(member, deleted)
        return deleted

    def _after_delete(self, member: _Member, deleted: bool) -> None:
        """Our delete of an ephemeral record of ours ended: stop its renewal if
        it went, else report a loss a renewal found meanwhile. No I/O."""
        if deleted:
            self._forget(member)
        elif member.pending is not None and not member.deleting:
            reason, member.pending = member.pending, None
            member.mark_lost(reason)

    def _forget(self, member: _Member) -> None:
        member.stop()
        if self._entries.get(member.entry.key) is member:
            del self._entries[member.entry.key]

    def _watch(self, member: _Member) -> None:
        """Hear the record key's keyspace events where the server publishes them
        (the backend's ``keyspace_events`` option, as for lock holds): a delete or
        takeover behind our back is a loss at once, not at the next renewal. No I/O.

        Our own renewals (``expire``) and updates (``hset``) cost no check; any
        other event, and the subscription's confirmation (events before it went
        unheard), read the key's owner."""
        node = self._node
        where = node.keyspace_watch(member.keys.record)
        if where is None:
            return
        hub, channel = where
        node.ensure_loss_events(self._spawn)

        def changed(event: str | None) -> None:
            if event in HARMLESS_EVENTS or member.on_stop is None:
                return
            if member.checking:
                member.recheck = True
                return
            member.checking = True
            self._spawn(self._check(member), f"aiolocks-redis-records-check:{member.keys.record}")

        hub.watch(channel, changed)
        member.on_stop = functools.partial(hub.unwatch, channel, changed)

    async def _check(self, member: _Member) -> None:
        """Read the record's owner; lost when the key is gone or another session's."""
        client = self._node.client
        assert client is not None  # a record is watched only after open()
        try:
            while member.on_stop is not None:
                member.recheck = False
                try:
                    owner = await client.hget(member.keys.record, "o")
                except TRANSIENT:
                    return  # the connection is down: renewal timing decides
                except RedisError as exc:  # WRONGTYPE: overwritten with another type
                    member.lose_now(f"its Redis key was overwritten ({exc})")
                    return
                if owner is None or _text(owner) != member.owner:
                    member.lose_now(GONE)
                    return
                if not member.recheck:
                    return
        finally:
            member.checking = False

    async def read(self, key: str) -> Record | None:
        """The record, or ``None`` when absent or expired."""
        keys = self._keys(key)
        reply = await self._call(keys, "read", "", [], f"reading record {key!r}")
        return _record(*reply) if reply else None

    async def snapshot(self, prefix: str) -> RedisSnapshot:
        """Subscribe to the prefix's channel (confirmed), then read its children."""
        if not _prefix_ok(prefix):
            raise ValueError(f"record prefix {prefix!r} must be a non-empty name")
        keys = record_keys(self._key_prefix, prefix)
        hub = self._node.hub
        if hub is None or self._closed():
            raise BackendUnavailableError(f"the Redis backend {self._node.describe} is not open")
        event = asyncio.Event()

        def listener(payload: str | None) -> None:
            event.set()  # a write, or a (re)subscription: messages may have been lost

        hub.watch(keys.channel, listener)
        try:
            await hub.confirmed(keys.channel)
            # The confirmation rang it (as after a reconnect): what happened
            # before this point the read below sees.
            event.clear()
            reply = await self._call(keys, "snapshot", "", [], f"reading records {prefix!r}/")
        except BaseException:
            hub.unwatch(keys.channel, listener)
            raise
        records: dict[str, Record] = {}
        earliest: int | None = None
        for i in range(0, len(reply), 5):
            record = _record(*reply[i + 1 : i + 5])
            records[_text(reply[i])] = record
            left = int(_text(reply[i + 4]))
            if left >= 0 and (earliest is None or left < earliest):
                earliest = left
        expires_at = None
        if earliest is not None:
            expires_at = time.monotonic() + earliest / 1000 + EXPIRY_SLACK
        return RedisSnapshot(records, hub, keys.channel, listener, event, expires_at)

    # -- renewals and close ----------------------------------------------------------

    async def _renew_many(self, renewals: Sequence[Renewal]) -> list[RenewResult]:
        """``renew`` for each ephemeral record due, concurrently (one slot each)."""
        lease_ms = max(1, round(self._lease * 1000))

        async def renew(member: _Member) -> RenewResult:
            keys = member.keys
            args = ["renew", keys.child, "", "", self._outcome_ms, lease_ms, member.owner]
            reply = await self._node.evalsha("records", keys.script_keys(""), args)
            return None if int(reply) == 1 else GONE

        results = await asyncio.gather(
            *(renew(r.payload) for r in renewals), return_exceptions=True
        )
        return list(results)

    async def close(self) -> None:
        """The backend closes: stop renewing and delete our ephemeral records
        (no loss); what cannot be deleted within ``connect_timeout`` lapses
        with its lease."""
        self._watchdog.close()
        members, self._entries = list(self._entries.values()), {}
        for member in members:
            member.stop()
        node = self._node
        if not members or node.client is None:
            return
        try:
            async with asyncio.timeout(node.connect_timeout):
                for member in members:
                    # only if still ours (owner); no resend, so a 1 ms outcome key
                    keys, op_id = member.keys, self._mint()
                    args = ["delete", keys.child, keys.channel, op_id, 1, "", member.owner]
                    await node.evalsha("records", keys.script_keys(op_id), args)
        except (TimeoutError, RedisError, OSError) as exc:
            logger.warning(
                "could not delete the ephemeral records of %s on close (%s): "
                "they lapse within lease_time=%g s",
                node.describe,
                exc,
                self._lease,
            )
