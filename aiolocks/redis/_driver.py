"""The Redis driver: Redisson's locks on ``redis.asyncio``, one hash per lock.

Design note
-----------
Algorithm (Redisson RLock / RPermitExpirableSemaphore / RReadWriteLock /
RedissonFairLock ideas, re-derived; see ``docs/redis.md``):

* Every lock is one hash ``<key_prefix>{<family>:<name>}``. Each hold is one
  field ``<client-uuid>:<per-acquisition id>`` whose value carries its own
  expiry (server ``TIME``), fencing token, mode and participant. The hash
  has a PEXPIRE covering its longest hold, so a crashed client's holds lapse.
  The core keeps per-task reentrancy locally, so each grant is one field
  and re-entry never reaches Redis.
* ``acquire.lua`` reclaims lapsed holds, decides by mode (exclusive, lease,
  read, write, optional FIFO queue) and either writes the fields and returns
  the fencing tokens, or returns how long the blocking hold has left.
* ``release.lua`` is a compare-and-delete of our own fields plus PUBLISH on
  the lock's channel: naturally idempotent, so a retried release can never
  decrement twice or remove somebody else's hold.
* An unfair mutex's hold is passed to another task of the same process
  that waits for it with one small script (same field, watchdog and
  keyspace watch; the next fencing token of the block of 16 its grant from
  Redis reserved), which rewrites the field to name the new holder and
  its token, so that everybody reads the true holder: see
  ``RedisDriver._pass_on``.
* Waiting: try; on failure subscribe (confirmed) to the channel; try again;
  wait for a message or the blocking hold's remaining TTL (expiry publishes
  nothing) or the deadline; repeat.
* The engine drives each acquire (see :mod:`aiolocks._core.driver`): the
  field ids are minted in ``begin``, before the first send, so ``abandon``
  can always clean up with ``release.lua`` for our ids. When a script of
  the attempt went unanswered (cancelled, connection error), it may reach
  Redis after the cleanup (another connection): the cleanup then leaves a
  short tombstone for our ids, and ``acquire.lua`` refuses to grant a
  tombstoned id. ``acquire.lua`` answers a resend with the same grant, so
  redis-py's own retries on a connection error cannot double a hold either.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast, final

from redis.exceptions import (
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
)

from .._core.backoff import Backoff
from .._core.doctor import Diagnosis
from .._core.driver import Attempt, Capabilities, Family, Grant, Mode, Request
from .._core.errors import AccessDeniedError, BackendUnavailableError, LockError
from .._core.participants import Participant
from .._core.tasks import TaskSet
from .._core.timeouts import LEASE_TIME_RANGE, check_seconds
from ._access import COMMAND_ERRORS, UNREACHABLE, denied, is_refusal, map_error, retry_after
from ._client import RedisClusterCommands, RedisCommands, RedisServerCommands
from ._keys import LockKeys, lock_keys
from ._pubsub import PubSubHub, Wake
from ._scripts import Scripts, source
from ._tls_probe import certificate_refusal, probe_target, was_reset
from ._watchdog import Renewal, RenewResult, Watchdog

if TYPE_CHECKING:
    from ._admin import RedisAdmin
    from ._records import RedisRecords

__all__ = ["LockKeys", "RedisAttempt", "RedisDriver", "RedisHold", "RedisNode", "lock_keys"]

logger = logging.getLogger("aiolocks.redis")

T = TypeVar("T")

MODE_CODES = {Mode.EXCLUSIVE: "x", Mode.LEASE: "l", Mode.READ: "r", Mode.WRITE: "w"}
MODE_NAMES = {"x": "exclusive", "l": "lease", "r": "read", "w": "write"}

DEFAULT_LEASE_TIME = 30.0
DEFAULT_KEY_PREFIX = "aiolocks:"
DEFAULT_CONNECT_TIMEOUT = 10.0
#: how long ``WAIT`` waits for ``min_replicas`` acknowledgements after a lock write
REPLICA_WAIT_MS = 1000
#: how long a cleanup's tombstone keeps a late acquire script from granting
TOMBSTONE_MS = 2000
#: longest a waiter's queue entry outlives its last try: how long a dead
#: waiter at the queue head can hold up the next one (live waiters refresh
#: their entry at least three times per period)
QUEUE_TIMEOUT = 5.0
#: how long after one of our releases handed a lock to a waiter of another
#: process our next waiter of that lock may join its queue with plain
#: commands (``RedisNode.join``, no script), in s
QUEUE_HINT = 1.0
#: chances skipped between looks once plain joins of a lock keep missing
JOIN_PROBE = 16
#: ``acquire.lua``'s ARGV[5] (0-based 4): '0' no queue, '1' fair FIFO, 'q' waiter queue
QUEUE_ARG = 4
#: ``acquire.lua``'s ARGV[8] (0-based 7): the queue member
MEMBER_ARG = 7
#: the channel a release hands the lock over on: one per backend (process),
#: ``<key prefix>grant:<client uuid>``; see ``release.lua``
GRANT_CHANNEL = "{prefix}grant:{uuid}"
#: ``notify-keyspace-events`` flags a hold's loss needs: keyspace channel,
#: generic (DEL, RENAME, EXPIRE...), hash, expired, evicted
LOSS_EVENT_FLAGS = "Kghxe"
#: keyspace events that cannot remove our field (our own acquires and renewals
#: cause them); an HSET overwriting our very field is left to the renewal
HARMLESS_EVENTS = frozenset({"hset", "expire", "persist", "hincrby", "hincrbyfloat"})
#: most local hand-offs of one lock in a row (a release passing the lock to a
#: waiter of its own process) before one goes to the queue head, so the
#: waiters of other processes are not starved
LOCAL_HANDOFFS = 16
#: fencing tokens one exclusive grant from Redis reserves (its own and the
#: next ``TOKEN_BLOCK - 1``): the process may pass the hold on to its own
#: waiting tasks, each with the next token of the block, in one script that
#: rewrites the hold's field to name the new holder (``RedisDriver._pass_on``);
#: the fence counter in Redis is advanced past the block, so the next grant
#: from Redis is larger still. Mirrored in ``acquire.lua`` and ``release.lua``.
TOKEN_BLOCK = 16
#: how long after a grant a hold starts listening to its key's events (s):
#: shorter holds never subscribe (see ``RedisDriver._start_watch``)
LOSS_WATCH_DELAY = 0.05
#: why a renewal found no hold to extend
GONE = "its Redis field is gone (deleted, overwritten or expired)"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def validate_lease_time(value: object, what: str = "lease_time") -> float:
    """Seconds in :data:`LEASE_TIME_RANGE` (the watchdog renews every third)."""
    return check_seconds(value, what, LEASE_TIME_RANGE)


#: values of the ``keyspace_events`` option
KEYSPACE_EVENTS = ("auto", "listen", "off")


def validate_keyspace_events(value: object) -> str:
    """``keyspace_events``: one of ``auto``, ``listen``, ``off``; ``ValueError`` otherwise."""
    if not isinstance(value, str) or value not in KEYSPACE_EVENTS:
        raise ValueError(
            f"keyspace_events must be one of {', '.join(KEYSPACE_EVENTS)}, got {value!r}"
        )
    return value


def validate_key_prefix(value: object) -> str:
    """Any text without ``{``/``}`` (they would steal the hash tag)."""
    if not isinstance(value, str):
        raise ValueError(f"key_prefix must be a str, got {value!r}")
    if "{" in value or "}" in value:
        raise ValueError(f"key_prefix={value!r} must not contain '{{' or '}}'")
    return value


@final
class RedisHold:
    """The driver handle of one grant (``Grant.handle``)."""

    __slots__ = (
        "block_end",
        "checking",
        "field",
        "grant",
        "keys",
        "lease",
        "leave",
        "on_stop",
        "recheck",
        "released",
        "renewing",
        "watchdog",
    )

    def __init__(self, keys: LockKeys, field: str, lease: float) -> None:
        self.keys = keys
        self.field = field
        self.lease = lease
        self.released = False
        #: the grant that holds our field now: a hold passed on to another
        #: task of this process (``pass_on.lua``) keeps its field, watchdog and
        #: loss watch, and gets the next grant (see ``RedisDriver._pass_on``)
        self.grant: Grant | None = None
        #: the last fencing token of the block the grant from Redis reserved
        #: (its own token when it reserved none)
        self.block_end = 0
        #: queue members of ours this hold was passed to while they waited
        #: in the lock's queue: their entries go with the release to Redis
        self.leave: list[str] = []
        #: the watchdog renews it (started with the keyspace watch, see
        #: ``RedisDriver._start_watch``)
        self.renewing = False
        self.watchdog: Renewal | None = None
        #: undoes the keyspace-event subscription (see ``RedisDriver._watch_key``)
        self.on_stop: Callable[[], None] | None = None
        #: a check of our field is on the wire / another event came meanwhile
        self.checking = False
        self.recheck = False

    def stop(self) -> None:
        """Mark released and stop renewing, synchronously (before any unlock is sent)."""
        self.released = True
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.on_stop is not None:
            on_stop, self.on_stop = self.on_stop, None
            on_stop()


@final
class JoinOdds:
    """How often a plain queue join (``RedisDriver._join``) of one lock found
    the queue, as a moving average: below one half, joins stop but for one
    in ``JOIN_PROBE`` chances, which keeps the average current."""

    __slots__ = ("hits", "skipped")

    def __init__(self) -> None:
        self.hits = 1.0
        self.skipped = 0

    def worth_it(self) -> bool:
        """Whether to join with plain commands this time."""
        if self.hits >= 0.5 or self.skipped >= JOIN_PROBE:
            self.skipped = 0
            return True
        self.skipped += 1
        return False

    def note(self, found: bool) -> None:
        """A join found the queue (``found``) or did not."""
        self.hits = 0.75 * self.hits + (0.25 if found else 0.0)


class RedisAttempt(Attempt):
    """One acquire: the ids it may own, its arguments, and what is on the wire."""

    __slots__ = (
        "args",
        "ended",
        "fair",
        "fields",
        "granted",
        "handed",
        "join_unsure",
        "keys",
        "lease",
        "listening",
        "local",
        "local_waits",
        "maybe_written",
        "member",
        "queue_timeout",
        "send_lost",
        "sent",
        "unanswered",
        "unheard",
        "wait_ms",
        "wake",
    )

    def __init__(
        self,
        request: Request,
        keys: LockKeys,
        fields: list[str],
        member: str,
        lease: float,
        fair: bool,
        args: list[object],
    ) -> None:
        super().__init__(request)
        self.keys = keys
        self.fields = fields
        self.member = member
        self.lease = lease
        self.fair = fair
        self.args = args
        #: something of this attempt may be on the server (a field, a queue entry)
        self.maybe_written = False
        #: a script of this attempt is on the wire, its answer not read yet
        self.unanswered = False
        #: a send of this attempt failed on the connection: it may still reach Redis
        self.send_lost = False
        #: from the last "no": how long the blocking hold has left (ms, -1 unknown)
        self.wait_ms = -1
        self.wake: Wake | None = None
        #: how long our queue entry lasts unrefreshed (s)
        self.queue_timeout = min(lease, QUEUE_TIMEOUT)
        #: the fencing token of a hand-off (release.lua wrote our field), not taken yet
        self.granted: int | None = None
        #: a hold of this process passed on to us (``pass_on.lua``), not taken yet
        self.handed: Grant | None = None
        #: a plain queue join (``RedisDriver._join``) was sent, its reply not read
        self.join_unsure = False
        #: when the last try was sent: a hand-off came after it ran
        self.sent = 0.0
        #: queued while our process's grant channel was not confirmed yet: a
        #: hand-off may have gone unheard, so look at our field once listening
        self.unheard = False
        #: waiting on our process's grant channel
        self.listening = False
        #: waiting in this process only, not in the lock's queue: another
        #: attempt of ours on the lock is queued there (see ``_wait_locally``)
        self.local = False
        #: local waits that ended unrung: past the first, it stops waiting here
        self.local_waits = 0
        #: given up (its clean-up started): no longer anybody's place in the queue
        self.ended = False

    @property
    def queued(self) -> bool:
        """Our tries keep an entry in the lock's waiter queue (fair, or subscribed exclusive)."""
        return self.args[QUEUE_ARG] != "0"


class RedisNode:
    """One Redis endpoint (a server, a Sentinel master, a cluster): client, scripts, pub/sub.

    ``make_client`` builds a redis-py client (typed ``Any``: redis-py's
    command types cannot be matched to the protocols statically, see
    :mod:`._client`). The recipe uses :attr:`client` through
    :class:`~._client.RedisCommands` only; a cluster's client also through
    :class:`~._client.RedisClusterCommands` (its slot map: ``open()`` and
    the keyspace watches), a single server's through
    :class:`~._client.RedisServerCommands` (the ``db`` of its keyspace
    channels).
    """

    def __init__(
        self,
        make_client: Callable[[], Any],
        *,
        owns_client: bool,
        describe: str,
        connect_timeout: float,
        min_replicas: int = 0,
        cluster: bool = False,
        on_close: Callable[[], Awaitable[None]] | None = None,
        keyspace_events: str = "auto",
    ) -> None:
        self._make_client = make_client
        self._on_close = on_close
        self._owns_client = owns_client
        self.describe = describe
        self.connect_timeout = connect_timeout
        self.min_replicas = min_replicas
        self.cluster = cluster
        #: the client, built by ``open()`` (None before)
        self.client: RedisCommands | None = None
        self.scripts: Scripts | None = None
        self.hub: PubSubHub | None = None
        #: ``auto``: turn keyspace notifications on (CONFIG); ``listen``: use
        #: them as the server is configured; ``off``: renewal timing only
        self.keyspace_events = validate_keyspace_events(keyspace_events)
        #: keyspace notifications: None not checked yet, True on, False refused/off
        self.loss_events: bool | None = False if self.keyspace_events == "off" else None
        self._loss_events_task: asyncio.Task[None] | None = None
        #: scripts on the wire (close() lets them finish before closing the client)
        self._busy = 0
        self._idle: asyncio.Event | None = None
        #: on a cluster: one pub/sub hub per master that owns a held key
        #: (keyspace events are published on the key's node only), by node name
        self._keyspace_hubs: dict[str, PubSubHub] = {}
        #: lock key -> (server time ms, ``time.monotonic()``) of our last
        #: release there that handed the lock to the head of its queue
        #: (``release.lua``'s ``{removed, -1, ms}``): the lock is busy and
        #: its queue in use, so our next waiter may ``join`` it
        self.handed_at: dict[str, tuple[int, float]] = {}

    # -- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        """Build the client and preload the scripts, within ``connect_timeout``.

        A failed open closes the connections its helpers made (the engine
        closes only a driver that opened): a Sentinel connection left open
        after a refused password was a socket nobody closed. The clients stay
        usable (a Redlock master that failed to open is tried again later).
        """
        try:
            await self._load()
        except BaseException:
            if self._on_close is not None:
                await self._on_close()
            raise

    async def _load(self) -> None:
        if self.client is None:
            self.client = self._make_client()
            self.scripts = Scripts.register(self.client)
            self.hub = PubSubHub(
                self.client.pubsub, describe=self.describe, timeout=self.connect_timeout
            )
        client, scripts = self.client, self.scripts
        assert scripts is not None
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.cluster:
                    await cast(RedisClusterCommands, client).initialize()
                await scripts.load(client)
        except TimeoutError as exc:
            # redis-py may have retried a refusal until the deadline (Sentinel discovery)
            refused = denied(exc, self.describe)
            if refused is not None:
                raise refused from exc
            raise BackendUnavailableError(
                f"Redis {self.describe} did not answer within "
                f"connect_timeout={self.connect_timeout:g} s"
            ) from None
        except (RedisError, RedisClusterException, OSError) as exc:
            # RedisClusterException (no node answered the cluster's start-up)
            # is no RedisError; its cause says why (e.g. a TLS refusal).
            refused = denied(exc, self.describe) or await self._certificate_refused(exc)
            if refused is not None:
                raise refused from exc
            raise BackendUnavailableError(f"cannot reach Redis {self.describe}: {exc}") from exc

    async def _certificate_refused(self, exc: BaseException) -> AccessDeniedError | None:
        """A reset at connect over TLS: ask again whether the server refused our certificate."""
        if not was_reset(exc):
            return None
        target = probe_target(self.client)
        if target is None:
            return None
        alert = await certificate_refusal(*target, timeout=self.connect_timeout)
        return None if alert is None else denied(alert, self.describe)

    async def close(self) -> None:
        """Let scripts on the wire finish, stop pub/sub, close the client if we made it.

        A release still running in a holder's task (its block was ended by
        the close) would otherwise take a connection, or make one, after the
        client closed its pool: a socket nobody closes.
        """
        if self._busy:
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.connect_timeout):
                    await self._idle.wait()
        hubs = [*self._keyspace_hubs.values()]
        self._keyspace_hubs.clear()
        if self.hub is not None:
            hubs.append(self.hub)
        for hub in hubs:
            await hub.close()
        if self._owns_client and self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.aclose()
        if self._on_close is not None:
            await self._on_close()

    # -- keyspace events (prompt loss) ------------------------------------------

    def keyspace_channel(self, key: str) -> str | None:
        """The keyspace channel of ``key`` on the backend's own pub/sub connection, or None.

        None on a cluster: there the events of a key are published only on the
        node that owns its slot (see :meth:`keyspace_watch`), which the shared
        connection need not be on.
        """
        if self.cluster or self.loss_events is False or self.client is None:
            return None
        db = cast(RedisServerCommands, self.client).connection_pool.connection_kwargs.get("db", 0)
        return f"__keyspace@{db}__:{key}"

    def keyspace_watch(self, key: str) -> tuple[PubSubHub, str] | None:
        """Where to hear ``key``'s keyspace events: a hub and a channel, or None. No I/O.

        A single server or Sentinel master: the backend's pub/sub connection.
        A cluster: a pub/sub connection to the master that owns ``key``'s
        slot (one per master, made at its first hold), as redis-py's slot
        map knows it now; a MOVED reply or a failover updates that map, and
        the hold moves its subscription at the next reconnect or check.
        """
        if self.loss_events is False or self.client is None or self.hub is None:
            return None
        if not self.cluster:
            channel = self.keyspace_channel(key)
            return None if channel is None else (self.hub, channel)
        client = cast(RedisClusterCommands, self.client)
        try:
            owner = client.get_node_from_key(key)
        except (RedisError, LookupError, AttributeError):
            return None  # no slot map yet: renewal timing
        if owner is None:
            return None
        hub = self._keyspace_hubs.get(owner.name)
        if hub is None:
            hub = self._keyspace_hubs[owner.name] = PubSubHub(
                functools.partial(client.pubsub, node=owner),
                describe=f"{self.describe} node {owner.name}",
                timeout=self.connect_timeout,
            )
        return hub, f"__keyspace@0__:{key}"

    def ensure_loss_events(self, spawn: Callable[[Coroutine[Any, Any, None], str], Any]) -> None:
        """Once per node: make sure the server publishes the events we listen to."""
        if self.loss_events is None and self.keyspace_events == "listen":
            self.loss_events = True  # configured by the operator: no CONFIG call
        if self.loss_events is None and self._loss_events_task is None:
            self._loss_events_task = spawn(
                self._enable_loss_events(), f"aiolocks-redis-keyspace-events:{self.describe}"
            )

    async def _enable_loss_events(self) -> None:
        """Add ``K`` (keyspace channel) and ``g h x e`` (generic, hash, expired,
        evicted) to ``notify-keyspace-events``, keeping what is there; warn once
        and fall back to renewal timing if the server will not have it.

        On a cluster every node (replicas too, so that a promoted replica
        publishes as well) is configured on its own."""
        try:
            changed = False
            if self.cluster:
                for node in cast(RedisClusterCommands, self.client).get_nodes():
                    changed = await self._enable_on(target_nodes=node) or changed
            else:
                changed = await self._enable_on()
        except (RedisError, OSError) as exc:
            self.loss_events = False
            logger.warning(
                "Redis %s will not publish keyspace events (%s): a hold deleted or "
                "overwritten behind our back is noticed at its next renewal (a third "
                "of lease_time), not at once (keyspace_events=listen or off skips "
                "the CONFIG call)",
                self.describe,
                exc,
            )
            return
        self.loss_events = True
        if changed:
            # A key changed before the server published its events would go
            # unnoticed until the renewal: the holds watching now look once.
            for hub in (self.hub, *self._keyspace_hubs.values()):
                if hub is not None:
                    hub.nudge_listeners()

    async def _enable_on(self, **target: Any) -> bool:
        """Add the missing flags on one server; True if it had to be changed."""
        client = self.client
        assert client is not None  # only after open()
        current = await client.config_get("notify-keyspace-events", **target)
        flags = _text(next(iter(current.values()), "")) if current else ""
        have = set(flags.replace("A", "g$lshzxetd"))
        missing = [c for c in LOSS_EVENT_FLAGS if c not in have]
        if missing:
            wanted = flags + "".join(missing)
            await client.config_set("notify-keyspace-events", wanted, **target)
            logger.warning(
                "aiolocks changed notify-keyspace-events on the Redis server %s from %r to %r "
                "with CONFIG SET (keyspace_events=auto); configure it on the server and "
                "connect with keyspace_events=listen to leave a shared server's settings alone",
                self.describe,
                flags,
                wanted,
            )
        return bool(missing)

    # -- commands ------------------------------------------------------------

    async def evalsha(self, script: str, keys: Sequence[str], args: Sequence[object]) -> Any:
        """``EVALSHA`` of ``scripts/<script>.lua``; on ``NOSCRIPT`` send it whole (``EVAL``).

        ``NOSCRIPT`` (a restart, ``SCRIPT FLUSH``, a replica promoted on a
        cluster: scripts are not replicated) means the script did not run,
        so sending it again is safe for every script. ``EVAL`` runs it where
        its keys live and caches it there for the next ``EVALSHA``; a
        ``SCRIPT LOAD`` then ``EVALSHA`` could miss on a cluster, where the
        load goes to the primaries the client knows of and the run to the
        slot's owner, which may have changed in between (found by the cluster
        fault runs: a bare ``LockError`` "No matching script").
        """
        client = self.client
        assert self.scripts is not None
        assert client is not None
        sha = getattr(self.scripts, script).sha
        with self._on_the_wire():
            try:
                return await client.evalsha(sha, len(keys), *keys, *args)
            except NoScriptError:
                return await client.eval(source(script), len(keys), *keys, *args)

    @contextlib.contextmanager
    def _on_the_wire(self) -> Iterator[None]:
        """Count a command on the wire, so that ``close()`` lets it finish."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            if not self._busy and self._idle is not None:
                self._idle.set()

    async def try_acquire(self, keys: LockKeys, args: Sequence[object]) -> tuple[list[Any], int]:
        """Run ``acquire.lua`` (and ``WAIT`` when ``min_replicas``); returns (reply, acked)."""
        client = self.client
        assert self.scripts is not None
        assert client is not None
        if not self.min_replicas:
            return list(await self.evalsha("acquire", keys.acquire_keys, args)), 0
        # WAIT counts the writes of *this connection*, so it must follow the
        # script on the same one: a non-transactional pipeline. NOSCRIPT means
        # the script did not run, so loading it and sending again is safe.
        for first in (True, False):
            pipe = client.pipeline(transaction=False)
            acquire_keys = keys.acquire_keys
            pipe.evalsha(self.scripts.acquire.sha, len(acquire_keys), *acquire_keys, *args)
            # stay well inside the socket timeout (= connect_timeout)
            wait_ms = min(REPLICA_WAIT_MS, int(self.connect_timeout * 500))
            pipe.execute_command("WAIT", self.min_replicas, max(wait_ms, 1))
            try:
                reply, acked = await pipe.execute()
            except NoScriptError:
                if not first:
                    raise
                await client.script_load(source("acquire"))
                continue
            break
        return list(reply), int(acked)

    async def release(
        self,
        keys: LockKeys,
        member: str,
        fields: Sequence[str],
        tombstone_ms: int = 0,
        publish: bool = True,
    ) -> int:
        """Run ``release.lua``: delete our fields / queue entry, publish if anything went.

        ``tombstone_ms`` > 0 (cleanup of an acquire whose script may still be
        on the wire): a field not found is marked as given up for that long,
        so that script cannot grant it if it arrives after this one.
        ``publish=False``: nobody listens on the lock's channel (an exclusive
        hold: its waiters are queued and handed the lock directly), so a
        release with nobody queued publishes nothing.
        """
        args = [keys.channel if publish else "", member, tombstone_ms, "", *fields]
        return self._released(keys, await self.evalsha("release", keys.acquire_keys, args))[0]

    async def release_to(
        self,
        keys: LockKeys,
        field: str,
        successor: str,
        publish: bool,
        leave: Sequence[str] = (),
    ) -> tuple[int, int | None]:
        """``release.lua`` for our ``field``, handing the lock to ``successor``
        (a queue member of this process) if it is still queued and live;
        ``leave``: queue members of ours to take out of the queue first.

        Returns (holds and entries removed, the successor's fencing token or
        None when the lock went the usual way: the queue head, or nobody).
        """
        args = [keys.channel if publish else "", "", 0, successor, field, *leave]
        return self._released(keys, await self.evalsha("release", keys.acquire_keys, args))

    def _released(self, keys: LockKeys, reply: Any) -> tuple[int, int | None]:
        """(removed, the local successor's token) from a ``release.lua`` reply;
        notes when the lock went to the head of its queue (``handed_at``)."""
        if not isinstance(reply, list):
            return int(reply), None
        if int(reply[1]) != -1:
            return int(reply[0]), int(_text(reply[1]))
        if len(self.handed_at) >= 256:
            stale = time.monotonic() - QUEUE_HINT
            self.handed_at = {k: v for k, v in self.handed_at.items() if v[1] > stale}
        self.handed_at[keys.holders] = (int(_text(reply[2])), time.monotonic())
        return int(reply[0]), None

    async def join(self, keys: LockKeys, member: str) -> int:
        """Queue ``member`` with plain commands, if the lock's queue exists:
        ``RPUSHX`` (and the queue's TTL set to ``QUEUE_TIMEOUT``, which no
        entry outlives), one round trip. Returns the queue's length after
        the push; 0: there was no queue, nothing was written.

        No atomic look at the lock is needed: a queue exists only while a
        hold has waiters (a release that empties it deletes it), so each
        release after the push sees the entry, and the hold it is queued
        behind can only end in a release or a lapse (the waiter's bounded
        wait covers a lapse). See ``scripts/queue.lua`` for its deadline.
        """
        client = self.client
        assert client is not None  # only after open()
        pipe = client.pipeline(transaction=False)
        pipe.rpushx(keys.queue, member)
        pipe.pexpire(keys.queue, int(QUEUE_TIMEOUT * 1000))
        with self._on_the_wire():
            length, _ = await pipe.execute()
        return int(length)

    async def pass_hold(
        self, keys: LockKeys, field: str, token: int, to: Request, new_token: int, member: str
    ) -> bool:
        """Run ``pass_on.lua``: our exclusive ``field`` (of fencing ``token``)
        now names ``to``'s participant and ``new_token``; ``member``: its
        queue entry to take out of the queue, or ''. False when the field was
        gone, lapsed or not of that token (nothing written)."""
        args = [field, token, new_token, to.participant, member]
        return bool(await self.evalsha("pass_on", keys.acquire_keys, args))

    async def renew(self, keys: LockKeys, field: str, lease: float) -> bool:
        """Run ``renew.lua``; False when the field is gone."""
        args = [int(lease * 1000), field]
        return bool(await self.evalsha("renew", (keys.holders,), args))

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewResult]:
        """``renew.lua`` for each hold (payload: :class:`RedisHold`), in one round trip.

        One hold: one ``EVALSHA``. More: a non-transactional pipeline, whose
        per-command errors come back as values. On a cluster the holds live
        on different nodes: one call each, concurrently.
        """
        client = self.client
        assert self.scripts is not None
        assert client is not None
        holds: list[RedisHold] = [r.payload for r in renewals]
        if len(holds) == 1:
            hold = holds[0]
            return [None if await self.renew(hold.keys, hold.field, hold.lease) else GONE]
        if self.cluster:
            replies: list[Any] = await asyncio.gather(
                *(self.renew(h.keys, h.field, h.lease) for h in holds), return_exceptions=True
            )
        else:
            sha = self.scripts.renew.sha
            for first in (True, False):
                pipe = client.pipeline(transaction=False)
                for hold in holds:
                    pipe.evalsha(sha, 1, hold.keys.holders, int(hold.lease * 1000), hold.field)
                replies = await pipe.execute(raise_on_error=False)
                if first and any(isinstance(r, NoScriptError) for r in replies):
                    # Flushed or restarted: load it and send again (renewing
                    # twice only moves an expiry to the same place).
                    await client.script_load(source("renew"))
                    continue
                break
        return [
            r if isinstance(r, BaseException) else (None if int(r) == 1 else GONE) for r in replies
        ]

    async def inspect(self, keys: LockKeys) -> list[Any]:
        """Run ``inspect.lua``."""
        return list(
            await self.evalsha("inspect", (keys.holders, keys.queue, keys.queue_timeouts), ())
        )

    async def abandon(self, attempt: RedisAttempt) -> None:
        """Delete whatever ``attempt`` may have written here, retried through a short outage.

        If a script of the attempt went unanswered, it may reach Redis after
        this cleanup (another connection): ``release.lua`` then leaves a
        tombstone for our ids that makes that script refuse to grant
        (``TOMBSTONE_MS``). Gives up, with a warning, once the lease would
        have lapsed anyway.
        """
        if not attempt.maybe_written:
            return
        tombstone = attempt.unanswered or attempt.send_lost
        if await self.cleanup(
            attempt.keys, attempt.member, attempt.fields, attempt.lease, tombstone=tombstone
        ):
            attempt.maybe_written = False

    async def cleanup(
        self,
        keys: LockKeys,
        member: str,
        fields: Sequence[str],
        lease: float,
        *,
        tombstone: bool,
    ) -> bool:
        """``release.lua`` for our ids, retried until the lease would have lapsed; True if done."""
        tombstone_ms = min(int(lease * 1000), TOMBSTONE_MS) if tombstone else 0
        backoff = Backoff(time.monotonic() + lease)
        while True:
            try:
                await self.release(keys, member, fields, tombstone_ms)
            except UNREACHABLE as exc:
                if await retry_after(exc, backoff):
                    continue
                # after a refusal the caller was told already (AccessDeniedError)
                logger.log(
                    logging.INFO if is_refusal(exc) else logging.WARNING,
                    "could not clean up an abandoned acquire of %s on %s (%s); "
                    "it lapses with its lease",
                    keys.holders,
                    self.describe,
                    exc,
                )
                return False
            except RedisError as exc:
                logger.warning("cleaning up %s failed: %s", keys.holders, exc)
                return False
            return True


def refused_before_running(exc: NoPermissionError) -> bool:
    """The ACL refused a script's command or key arguments, so none of it ran.

    Redis checks the command (``EVALSHA``) and the keys it is given against
    the user's ACL before running anything; a command refused inside a
    running script (which may have written already) says ``script`` instead.
    """
    text = str(exc)
    return "script" not in text and ("keys used as arguments" in text or "to run the" in text)


def refused_unrun(exc: BaseException) -> bool:
    """``exc`` says the server refused the script before it wrote anything.

    A master demoted to a replica answers a write with ``READONLY``; redis-py's
    Sentinel connection turns that into ``ConnectionError("The previous
    master is now a slave")`` raised while handling the ``ReadOnlyError``.
    A script without flags fails at its first write on a replica, and each
    of ours reads before it writes, so nothing of it took effect. Any other
    connection error leaves it open whether the script ran.
    """
    return isinstance(exc, ReadOnlyError) or isinstance(exc.__context__, ReadOnlyError)


def check_lock_options(
    family: Family, options: Mapping[str, object], *, allow_fair: bool = True
) -> dict[str, object]:
    """Validate ``lease_time=``, ``watchdog=`` and (MUTEX only) ``fair=``."""
    out: dict[str, object] = {}
    for key, value in options.items():
        if key == "lease_time":
            out[key] = None if value is None else validate_lease_time(value)
        elif key == "watchdog":
            if not isinstance(value, bool):
                raise ValueError(f"watchdog must be True or False, got {value!r}")
            out[key] = value
        elif key == "fair" and family is Family.MUTEX and allow_fair:
            if not isinstance(value, bool):
                raise ValueError(f"fair must be True or False, got {value!r}")
            out[key] = value
        else:
            allowed = "lease_time, watchdog" + (
                ", fair" if family is Family.MUTEX and allow_fair else ""
            )
            raise ValueError(
                f"unknown option {key!r} for a Redis {family.value} (allowed: {allowed})"
            )
    return out


def parse_participants(reply: Sequence[Any]) -> list[Participant]:
    """Turn an ``inspect.lua`` reply into participants: holders by token, then the queue."""
    now = int(_text(reply[0]))
    flat = [_text(x) for x in reply[1]]
    holders: list[Participant] = []
    for i in range(0, len(flat), 2):
        field, value = flat[i], flat[i + 1]
        parts = value.split("|", 3)
        if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        expiry = int(parts[0])
        if expiry <= now:
            continue
        holders.append(
            Participant(
                id=parts[3],
                is_holder=True,
                fencing_token=int(parts[1]),
                mode=MODE_NAMES.get(parts[2], parts[2]),
                node=field,
                ttl=(expiry - now) / 1000,
            )
        )
    holders.sort(key=lambda p: p.fencing_token or 0)
    timeouts_flat = [_text(x) for x in reply[3]]
    timeouts = {
        timeouts_flat[i]: float(timeouts_flat[i + 1]) for i in range(0, len(timeouts_flat), 2)
    }
    waiters: list[Participant] = []
    for raw in reply[2]:
        member = _text(raw)
        # "<field>|<lease ms>|<participant>|<deadline or 0>" (scripts/queue.lua;
        # an entry written by hand may lack the lease or the deadline)
        field, _, who = member.partition("|")
        lease_ms, sep, rest = who.partition("|")
        own = 0
        if sep and lease_ms.isdigit():
            who, sep, deadline = rest.rpartition("|")
            if not sep or not deadline.isdigit():
                who = rest
            else:
                own = int(deadline)
        expiry_ms = max(timeouts.get(member, 0.0), float(own))
        if expiry_ms <= now:
            continue
        waiters.append(
            Participant(id=who, is_holder=False, node=field, ttl=(expiry_ms - now) / 1000)
        )
    return holders + waiters


@final
class RedisDriver:
    """The :class:`~aiolocks._core.driver.Driver` for one Redis endpoint."""

    capabilities = Capabilities(fair=False, queue_visible=False, can_lose=True)

    def __init__(
        self,
        node: RedisNode,
        *,
        lease_time: float = DEFAULT_LEASE_TIME,
        key_prefix: str = DEFAULT_KEY_PREFIX,
    ) -> None:
        self.node = node
        self.lease_time = validate_lease_time(lease_time)
        self.key_prefix = validate_key_prefix(key_prefix)
        #: one uuid per backend: the first half of every field we write
        self.client_uuid = uuid.uuid4().hex
        #: the second half of every field id we write (see ``begin``)
        self._serial = itertools.count(1)
        self._holds: set[RedisHold] = set()
        self._closed = False
        self._tasks: TaskSet | None = None
        #: our process's hand-off channel (``release.lua`` publishes grants there)
        self.grant_channel = GRANT_CHANNEL.format(prefix=self.key_prefix, uuid=self.client_uuid)
        #: queued exclusive attempts by queue member: who a hand-off is for
        self._queued: dict[str, RedisAttempt] = {}
        #: how plain queue joins have fared, by holders key (``_plain_join_member``)
        self._join_odds: dict[str, JoinOdds] = {}
        #: False once the server refused one (then every try is a script)
        self._plain_joins = True
        #: local hand-offs in a row, by holders key (absent: none)
        self._local_streak: dict[str, int] = {}
        #: queue members of attempts that took a hold passed on while they
        #: waited in the lock's queue: (keys, until when their entry may
        #: linger there). Only if our hold was lost meanwhile can Redis hand
        #: the lock to such an entry; ``_on_grant`` then gives it back.
        self._left: dict[str, tuple[LockKeys, float]] = {}
        #: our Redis hold of an unfair mutex that can be passed on, by holders
        #: key: while there is one, a new waiter here waits in the process
        #: (no try: the lock is busy, and the hold is passed to it, ``_pass_on``)
        self._owned: dict[str, RedisHold] = {}
        self.watchdog = Watchdog(
            node.renew_many, self._spawn, name=f"aiolocks-redis-watchdog:{node.describe}"
        )
        #: the record store (``records()``), built at its first use
        self._records: RedisRecords | None = None

    def describe(self) -> str:
        return self.node.describe

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        return check_lock_options(family, options)

    async def open(self, tasks: TaskSet) -> None:
        self._tasks = tasks
        await self.node.open()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Background work (the watchdog's sender, checks) runs in the engine's task set."""
        if self._tasks is None:
            coro.close()
            raise RuntimeError("the Redis driver was not opened")
        return self._tasks.spawn(coro, name=name)

    async def diagnose(self) -> Diagnosis:
        """``backend.doctor()``'s findings for this server (see :mod:`._doctor`)."""
        from ._doctor import diagnose_redis

        return await diagnose_redis(self)

    def records(self) -> RedisRecords:
        """This backend's record store (one per driver; no I/O): see :mod:`._records`."""
        if self._records is None:
            from ._records import RedisRecords

            self._records = RedisRecords(
                self.node,
                key_prefix=self.key_prefix,
                lease_time=self.lease_time,
                client_uuid=self.client_uuid,
                spawn=self._spawn,
                closed=lambda: self._closed,
            )
        return self._records

    async def close(self) -> None:
        if self._records is not None:
            # Our ephemeral records go with the backend (deleted, not lost).
            await self._records.close()
        self._closed = True
        for hold in list(self._holds):
            # Holds still here were not released through the core; stop
            # renewing and let their leases lapse rather than block close().
            hold.stop()
        self._holds.clear()
        self._owned.clear()
        self.watchdog.close()
        await self.node.close()

    def keys(self, request: Request) -> LockKeys:
        """The keys of the lock a request is for."""
        return lock_keys(self.key_prefix, request.family, request.name)

    def _lease(self, request: Request) -> float:
        lease = request.options.get("lease_time")
        return self.lease_time if lease is None else float(lease)  # type: ignore[arg-type]

    # -- acquire ---------------------------------------------------------------

    def begin(self, request: Request) -> Attempt:
        """Mint the field ids (Curator's protected mode) and build the script arguments."""
        lease = self._lease(request)
        fair = bool(request.options.get("fair", False))
        # <random backend uuid>:<serial>: unique, and no system call per acquire
        fields = [f"{self.client_uuid}:{next(self._serial):x}" for _ in range(request.count)]
        # An exclusive waiter queues up (fair: FIFO; unfair: only for its
        # wake-up), so a release wakes the queue head and nobody else.
        queues = fair or (request.mode is Mode.EXCLUSIVE and request.count == 1)
        # (the trailing 0: no deadline of its own, see scripts/queue.lua)
        member = f"{fields[0]}|{int(lease * 1000)}|{request.participant}|0" if queues else ""
        queue_ms = int(min(lease, QUEUE_TIMEOUT) * 1000)
        downgrade = ""
        if request.downgrade_of is not None and isinstance(request.downgrade_of.handle, RedisHold):
            downgrade = request.downgrade_of.handle.field
        max_holders = request.max_leases if request.mode is Mode.LEASE else 1
        args: list[object] = [
            MODE_CODES[request.mode],
            max_holders,
            int(lease * 1000),
            request.participant,
            "1" if fair else ("Q" if queues else "0"),
            max(queue_ms, 1),
            downgrade,
            member,
            *fields,
        ]
        return RedisAttempt(request, self.keys(request), fields, member, lease, fair, args)

    async def try_once(self, attempt: Attempt) -> list[Grant] | None:
        """One ``acquire.lua`` (retried through a short outage); grants or ``None``."""
        if self._closed:
            raise BackendUnavailableError(f"the Redis backend {self.describe()} is closed")
        a = cast(RedisAttempt, attempt)
        if a.handed is not None:
            # A task of ours passed its hold on to us: no I/O, no await.
            handed, a.handed = a.handed, None
            if not handed.lost:
                return [handed]
            # Lost on its way to us: its field is gone (or not to be
            # trusted): send its release in the background, and try as usual.
            self._spawn(self._drop(handed), f"aiolocks-redis-drop:{a.keys.holders}")
        if a.granted is not None:
            # A release handed us the lock (release.lua wrote our field) after
            # our last try ran: nothing to send. No await before the return.
            token, a.granted = a.granted, None
            return self._grants(a, [1, token], a.sent)
        plain = False
        if a.member:
            if self._wait_locally(a):
                return None
            plain = self._plain_join_member(a)
            self._prepare_queued(a)
        if a.wake is not None:
            a.wake.clear()  # forget rings from before this try
        if plain and await self._join(a):
            a.wait_ms = -1
            return None
        try:
            granted, reply, sent = await self._try(a)
        except COMMAND_ERRORS as exc:
            raise map_error(exc, f"acquiring {a.request.name!r}", self.describe()) from exc
        if granted:
            # No await from here to the return: the grants go straight to the engine.
            if a.wake is not None:
                a.wake.won = True
            return self._grants(a, reply, sent)
        a.wait_ms = int(reply[1])
        return None

    async def _try(self, a: RedisAttempt) -> tuple[bool, list[Any], float]:
        """One acquire script, retried through a short outage; (granted, reply, sent at).

        A connection error is retried with backoff for up to
        ``connect_timeout``; then it raises. Resending is safe: ``acquire.lua``
        answers a resend of a granted attempt with the same grant, and a
        definite "no" proves that no earlier send of this attempt was granted.
        """
        backoff: Backoff | None = None
        earlier = a.maybe_written  # an earlier try of this attempt may have written
        while True:
            a.maybe_written = True
            a.unanswered = True
            # The lease runs from when the script ran, at or after this send:
            # the watchdog may trust the hold until sent + lease, no longer.
            sent = a.sent = time.monotonic()
            try:
                reply, acked = await self.node.try_acquire(a.keys, a.args)
            except NoPermissionError as exc:
                if refused_before_running(exc) and not (earlier or a.send_lost):
                    # The ACL refused the script itself, and no earlier try
                    # wrote: there is nothing to give back.
                    a.maybe_written = a.unanswered = False
                raise
            except UNREACHABLE as exc:
                # That send may still arrive: the cleanup must leave a tombstone.
                a.send_lost = True
                if a.args[QUEUE_ARG] == "Q":
                    a.args[QUEUE_ARG] = "q"  # it may have queued us
                if backoff is None:
                    backoff = Backoff(time.monotonic() + self.node.connect_timeout)
                if not await retry_after(exc, backoff):
                    raise
                continue
            break
        granted = int(reply[0]) == 1
        if granted and self.node.min_replicas and acked < self.node.min_replicas:
            raise BackendUnavailableError(
                f"only {acked} of min_replicas={self.node.min_replicas} replicas of "
                f"{self.describe()} acknowledged the lock write; released it"
            )
        a.unanswered = False
        if a.args[QUEUE_ARG] == "Q":
            a.args[QUEUE_ARG] = "q"  # queued now (or granted): later tries refresh the entry
        if not granted and not a.queued and not a.send_lost:
            a.maybe_written = False  # a definite "no" wrote nothing, and nothing else is coming
        return granted, reply, sent

    def _plain_join_member(self, a: RedisAttempt) -> bool:
        """Whether ``a``'s first try joins the lock's queue with plain commands
        (``_join``) instead of ``acquire.lua``; if so, give its queue member
        its own deadline (``scripts/queue.lua``). No I/O.

        Only right after one of our releases handed the lock to the head of
        its queue (``QUEUE_HINT``): the lock is busy, and its queue is in
        use unless that head was the last waiter. A lock whose queue keeps
        running empty (two processes taking turns) stops being joined this
        way, except for a look now and then (``JoinOdds``).
        """
        if (
            a.fair
            or a.args[QUEUE_ARG] != "Q"
            or a.send_lost
            or self.node.min_replicas
            or not self._plain_joins
        ):
            return False
        now = time.monotonic()
        if a.deadline is not None and a.deadline <= now:
            return False
        key = a.keys.holders
        seen = self.node.handed_at.get(key)
        if seen is None or now - seen[1] > QUEUE_HINT:
            return False
        odds = self._join_odds.get(key)
        if odds is None:
            if len(self._join_odds) >= 256:
                self._join_odds.clear()
            odds = self._join_odds[key] = JoinOdds()
        if not odds.worth_it():
            return False
        server_ms, at = seen
        deadline = server_ms + int((now - at) * 1000) + int(a.queue_timeout * 1000)
        member = f"{a.member.rpartition('|')[0]}|{deadline}"
        if self._queued.get(a.member) is a:
            del self._queued[a.member]
        a.member = a.args[MEMBER_ARG] = member
        return True

    async def _join(self, a: RedisAttempt) -> bool:
        """Queue ``a`` with plain commands (``RedisNode.join``); True if queued.

        False: the queue was gone (nothing written), or the send failed
        (then it may still arrive, so the attempt is treated as possibly
        queued); either way the try goes on with ``acquire.lua``.
        """
        odds = self._join_odds.get(a.keys.holders)
        a.maybe_written = True
        a.unanswered = True
        a.join_unsure = True
        a.sent = time.monotonic()
        try:
            length = await self.node.join(a.keys, a.member)
        except UNREACHABLE:
            a.send_lost = True  # the cleanup leaves a tombstone, which release.lua heeds
            a.args[QUEUE_ARG] = "q"  # it may have queued us: acquire.lua looks first
            return False
        except RedisError as exc:
            # Refused (an ACL without RPUSHX, say): the script's way works
            # wherever the scripts do, so this backend stops joining this way.
            logger.debug("plain queue joins off on %s: %s", self.describe(), exc)
            self._plain_joins = False
            a.unanswered = False
            a.join_unsure = False
            a.maybe_written = False
            return False
        a.unanswered = False
        a.join_unsure = False
        if odds is not None:
            odds.note(length > 0)
        if not length:
            a.maybe_written = False
            return False
        a.args[QUEUE_ARG] = "q"
        return True

    def _wait_locally(self, a: RedisAttempt) -> bool:
        """Wait in this process, without a try, if another attempt of ours is
        queued on the same unfair mutex. No I/O.

        One waiter per process and lock is enough in the lock's queue: the
        others are handed the lock by the releases of this process
        (``release.lua``'s local hand-off) and need not try. Each look
        decides again: with no attempt of ours queued there any more (it
        got the lock or left), the waiter tries, and so joins the queue.
        """
        a.local = False
        if (
            a.fair
            or a.args[QUEUE_ARG] != "Q"
            or a.send_lost
            or a.local_waits > 1
            or self.node.min_replicas
            or (a.deadline is not None and a.deadline <= time.monotonic())
        ):
            return False
        key = a.keys.holders
        if key not in self._owned and not any(
            o is not a and (self._in_queue(o, key) or self._coming(o, key))
            for o in self._queued.values()
        ):
            return False
        a.local = True
        if a.wake is None:
            a.wake = Wake()
        a.wake.clear()
        a.wait_ms = -1
        self._queued[a.member] = a
        return True

    @staticmethod
    def _in_queue(o: RedisAttempt, key: str) -> bool:
        """``o`` holds this process's place in ``key``'s queue, or is about
        to: queued, or its first try is on the wire (it queues, or takes
        the lock and hands it on here), or handed the lock; not given up.
        Whatever it comes to, it leaves through ``abandon`` or ``finish``,
        and both let a local waiter take its place (``_promote``)."""
        return (
            o.keys.holders == key
            and o.args[QUEUE_ARG] in ("q", "Q")
            and not o.local
            and not o.ended
            and not o.send_lost
        )

    @staticmethod
    def _coming(o: RedisAttempt, key: str) -> bool:
        """``o`` was handed ``key``'s lock (by a release here or by Redis)
        and has not taken it yet: our process is about to hold it."""
        return (
            o.keys.holders == key
            and not o.ended
            and (o.granted is not None or o.handed is not None)
        )

    def _promote(self, key: str) -> None:
        """No attempt of ours is queued on ``key`` any more: one waiting
        locally looks (and joins the queue). No I/O.

        The newest one: local hand-offs go to the oldest first, so the one
        that queues keeps that place while the others are served here.
        """
        last: RedisAttempt | None = None
        if key in self._owned:
            return  # we hold it: it is passed on here, or a release promotes
        for o in self._queued.values():
            if self._in_queue(o, key) or self._coming(o, key):
                return
            if (
                o.keys.holders == key
                and o.local
                and o.granted is None
                and o.handed is None
                and not o.ended
            ):
                # (not one given up: ringing it would wake nobody, and the
                # waiters behind it would sit out a whole bounded wait)
                last = o
        if last is not None and last.wake is not None:
            last.wake.ring()

    def _prepare_queued(self, a: RedisAttempt) -> None:
        """Before a try that may queue us: be ready for a hand-off. No I/O.

        A release may hand the lock over as soon as the try has run, before
        its reply is read, so the attempt is findable by its queue member
        first. A try-lock (deadline already passed) does not queue at all:
        it would only have to leave the queue again.
        """
        if a.args[QUEUE_ARG] == "Q" and a.deadline is not None and a.deadline <= time.monotonic():
            a.args[QUEUE_ARG] = "0"
            return
        if a.wake is None:
            a.wake = Wake()
        self._queued[a.member] = a
        hub = self.node.hub
        if not a.listening and (hub is None or not hub.is_confirmed(self.grant_channel)):
            a.unheard = True

    def _on_grant(self, payload: str | None) -> None:
        """A message on our process's grant channel: ``<token> <member>`` (the lock
        is that waiter's now) or ``- <member>`` (it should look). ``None``: the
        channel was (re)subscribed, messages may have been lost: every queued
        waiter looks again (a try finds a hand-off it missed: ``acquire.lua``
        answers with the grant)."""
        if payload is None:
            for waiting in self._queued.values():
                if waiting.wake is not None:
                    waiting.wake.ring()
            return
        token, _, member = payload.partition(" ")
        a = self._queued.get(member)
        if (a is None or a.ended) and token.isdigit() and member in self._left:
            # Handed to an entry of an attempt that took a hold passed on
            # (ours was lost meanwhile), or that gave up while its entry was
            # on the wire (see ``abandon``): nobody waits for it, give it back.
            keys, _ = self._left.pop(member)
            field = member.partition("|")[0]
            self._spawn(
                self._give_back(keys, field, member), f"aiolocks-redis-give-back:{keys.holders}"
            )
            return
        if a is None or a.wake is None:
            return  # that attempt ended: its abandon gives the hold back
        if token.isdigit():
            a.granted = int(token)
        a.wake.ring()

    async def _handed_over_unheard(self, a: RedisAttempt) -> bool:
        """Our field exists: a release handed us the lock before we listened."""
        client = self.node.client
        assert client is not None  # an attempt runs only after open()
        try:
            value = await client.hget(a.keys.holders, a.fields[0])
        except (RedisError, OSError):
            return True  # look with a try (it has the retries and the error mapping)
        if value is None:
            return False
        parts = _text(value).split("|")
        if len(parts) > 1 and parts[1].isdigit():
            a.granted = int(parts[1])
        return True

    async def wait_for_change(self, attempt: Attempt, bound: float | None) -> None:
        """Wait for a hand-off (queued exclusive waiters) or an unlock.

        An exclusive waiter (a mutex, fair or not) is in the lock's waiter
        queue from its first try on, and listens on its process's grant
        channel (subscribed once per backend, kept): a release hands the lock
        to the queue head directly and tells that process alone, so the
        waiter takes it without another try. If it queued before that
        channel was confirmed, it reads its own field once (a hand-off may
        have come unheard). The wait is bounded by a third of the queue
        entry's timeout (each try refreshes the entry) and the blocking
        hold's TTL (expiry publishes nothing).

        Other waiters subscribe (confirmed) to the lock's channel in their
        first call and return (try again: an unlock published before the
        subscription would be lost), then wait for ``released``.
        """
        a = cast(RedisAttempt, attempt)
        hub = self.node.hub
        assert hub is not None
        if a.local:
            # waiting in this process: a local hand-off, or a ring to look
            # again; bounded all the same, as a queued waiter's wait is
            assert a.wake is not None
            if a.granted is not None:
                return
            if a.handed is not None:
                return
            wait = a.queue_timeout / 3 if bound is None else min(bound, a.queue_timeout / 3)
            await _wait_for_ring(a.wake, wait)
            if not a.wake.is_set():
                # Nobody handed it the lock nor rang it for a whole wait:
                # a safety net, so that a waiter here never depends on this
                # process's bookkeeping alone; after the second such wait
                # it tries, and so queues in the lock's queue itself.
                a.local_waits += 1
            return
        if a.member and a.queued:
            assert a.wake is not None
            if not a.listening:
                self._listen(a)
                await hub.confirmed(self.grant_channel)
                if a.unheard:
                    a.unheard = False
                    if await self._handed_over_unheard(a):
                        return
            if a.granted is not None or a.handed is not None:
                return
        elif a.wake is None:
            # Shared modes: one unlock may let several in. On ``released``
            # every reader of the lock here looks (all of them can proceed
            # when no writer holds), but one writer only (at most one can):
            # a writer that leaves without the lock passes its turn on.
            # One-lease waiters are rung only as many as holds were freed.
            counted = a.request.mode is Mode.LEASE and a.request.count == 1
            a.wake = Wake(exclusive=a.request.mode is Mode.WRITE, counted=counted)
            # the keyspace channel the hold will watch, in the same SUBSCRIBE
            companion = self.node.keyspace_channel(a.keys.holders)
            hub.attach(a.keys.channel, a.wake, companion)
            await hub.confirmed(a.keys.channel)
            return
        wait = a.lease if a.wait_ms < 0 else a.wait_ms / 1000
        if a.queued:
            wait = min(wait, a.queue_timeout / 3)
        if bound is not None:
            wait = min(wait, bound)
        await _wait_for_ring(a.wake, wait)

    def _listen(self, a: RedisAttempt) -> None:
        """A queued waiter starts listening on our process's grant channel. No I/O."""
        hub = self.node.hub
        assert hub is not None
        a.listening = True
        hub.watch(self.grant_channel, self._on_grant)
        companion = self.node.keyspace_channel(a.keys.holders)
        if companion is not None:
            # A waiting process need not hear the lock's keyspace events:
            # stop a lingering subscription (from an earlier hold here), or
            # every waiting process would be sent every event of every hand-off.
            hub.drop_idle(companion)

    async def abandon(self, attempt: Attempt) -> None:
        """Delete our fields and queue entry, with a tombstone if a script is unanswered.

        Not after close: nothing is sent on a closed client (it would open a
        new connection that nobody closes); what the attempt wrote lapses
        with its lease or queue timeout."""
        a = cast(RedisAttempt, attempt)
        if a.member and not a.ended:
            a.ended = True
            self._promote(a.keys.holders)  # a waiter here takes its place
        self._mind_late_join(a)
        handed, a.handed = a.handed, None
        if handed is not None:
            # Passed a hold it never took: on to the next waiter, or back to Redis.
            await self._drop(handed)
        if self._closed:
            return
        await self.node.abandon(a)

    def _mind_late_join(self, a: RedisAttempt) -> None:
        """``a`` ends with a plain join whose fate is unknown (cancelled or
        lost on the wire): its entry may reach Redis after the attempt's
        cleanup, or after ``acquire.lua`` queued it again, and be handed the
        lock once nothing else stops it (the cleanup's tombstone lapses
        first). Such a grant is given back (``_on_grant``, so we listen)
        until the entry's own deadline. No I/O."""
        if not a.join_unsure:
            return
        a.join_unsure = False
        self._remember_left(a.member, a.keys, time.monotonic() + a.queue_timeout + 1.0)
        if self.node.hub is not None and not self._closed:
            self.node.hub.watch(self.grant_channel, self._on_grant)

    def finish(self, attempt: Attempt) -> None:
        """Unsubscribe (a waiter leaving without the lock passes its turn on)."""
        a = cast(RedisAttempt, attempt)
        self._mind_late_join(a)
        if a.member and self._queued.get(a.member) is a:
            del self._queued[a.member]
            self._promote(a.keys.holders)
        if a.wake is not None and self.node.hub is not None:
            self.node.hub.detach(a.keys.channel, a.wake)

    def _grants(self, a: RedisAttempt, reply: list[Any], sent: float) -> list[Grant]:
        a.maybe_written = False
        request, lease = a.request, a.lease
        tokens = [int(_text(x)) for x in reply[1:]]
        enabled = bool(request.options.get("watchdog", True))
        grants = []
        block = TOKEN_BLOCK - 1 if request.mode is Mode.EXCLUSIVE and request.count == 1 else 0
        for field, token in zip(a.fields, tokens, strict=True):
            hold = RedisHold(a.keys, field, lease)
            grant = hold.grant = Grant(request, token, hold)
            hold.block_end = token + block
            grant.valid_until = sent + lease  # moved on by each successful renewal
            # scheduled by _start_watch (now, or with the keyspace watch)
            hold.watchdog = Renewal(
                grant,
                hold,
                lease=lease,
                valid_until=sent + lease,
                enabled=enabled,
                owner=request.owner,
            )
            self._holds.add(hold)
            if block and not a.fair and not self.node.min_replicas:
                self._owned[a.keys.holders] = hold
            self._start_watch(hold)
            grants.append(grant)
        return grants

    # -- prompt loss -------------------------------------------------------------

    def _start_watch(self, hold: RedisHold) -> None:
        """Listen to our key's events now if that costs nothing, else in ``LOSS_WATCH_DELAY``.

        A channel still subscribed and confirmed (an earlier hold here left it
        lingering) is watched at once. Otherwise the SUBSCRIBE, and the read
        of our field that follows its confirmation, wait ``LOSS_WATCH_DELAY``:
        a hold released sooner (most holds of a busy lock) costs no pub/sub
        command and keeps them off the hand-off's critical path. Nothing is
        missed: a change in between is found by that read, well within a
        second of it. Tasks of this process waiting for the lock change
        nothing here: ``pass_on.lua`` checks our field when the hold is
        passed to them (see ``_pass_on``).

        Also starts the hold's watchdog renewal: with the delayed watch, in
        the same timer when the first renewal (or, with ``watchdog=False``,
        the lease's end) is far enough away, so that a short hold costs one
        timer, not two.
        """
        renewal = hold.watchdog
        if renewal is None or hold.released:
            return
        where = self.node.keyspace_watch(hold.keys.holders)
        if where is None:
            self._renew(hold)
            return
        if where[0].is_confirmed(where[1]):
            self._renew(hold)
            self._watch_key(hold)
            return
        if renewal.lease <= 6 * LOSS_WATCH_DELAY:
            self._renew(hold)
        timer = asyncio.get_running_loop().call_later(LOSS_WATCH_DELAY, self._late_start, hold)
        hold.on_stop = timer.cancel

    def _renew(self, hold: RedisHold) -> None:
        """Start the hold's watchdog renewal (once)."""
        if not hold.renewing and hold.watchdog is not None:
            hold.renewing = True
            self.watchdog.watch(hold.watchdog)

    def _late_start(self, hold: RedisHold) -> None:
        """Start renewing and watching (``LOSS_WATCH_DELAY`` after the grant, or sooner)."""
        hold.on_stop = None
        renewal = hold.watchdog
        if renewal is None or hold.released or renewal.stopped:
            return
        self._renew(hold)
        self._watch_key(hold, True)

    def _watch_key(self, hold: RedisHold, late: bool = False) -> None:
        """Check our field whenever the server reports a change of its key.

        A keyspace event (DEL, HDEL, HSET, expiry, eviction, RENAME...) on
        the lock's hash, or a pub/sub reconnect (events may have been lost),
        makes us read our field: gone or not ours any more, the grant is
        marked lost at once, without waiting for the next renewal. No I/O
        here: the grant goes straight to the engine.

        ``late``: started ``LOSS_WATCH_DELAY`` after the grant; our field is
        read once the subscription is confirmed (at once if it already is),
        since events before it went unheard.
        """
        hold.on_stop = None
        if hold.watchdog is None or hold.released:
            return
        where = self.node.keyspace_watch(hold.keys.holders)
        if where is None:
            return
        hub, channel = where
        self.node.ensure_loss_events(self._spawn)

        def changed(event: str | None) -> None:
            # Our own acquire and renewals write the hash too (hset, expire):
            # those cannot take our field away, so they cost no check.
            if hold.released or event in HARMLESS_EVENTS:
                return
            if hold.checking:
                hold.recheck = True
                return
            hold.checking = True
            self._spawn(self._check_hold(hold, hub), f"aiolocks-redis-check:{hold.keys.holders}")

        confirmed = hub.is_confirmed(channel)
        hub.watch(channel, changed)  # an unconfirmed channel calls changed(None) once confirmed
        hold.on_stop = functools.partial(hub.unwatch, channel, changed)
        if late and confirmed:
            changed(None)

    async def _check_hold(self, hold: RedisHold, hub: PubSubHub | None = None) -> None:
        """Read our field; mark the grant lost if it is gone, lapsed or of another type.

        On a cluster, a hold whose key has moved to another master since it
        subscribed (slot migration, failover) then listens on the new owner.
        """
        client = self.node.client
        assert client is not None  # a hold exists only after open()
        try:
            while not hold.released:
                hold.recheck = False
                try:
                    value = await client.hget(hold.keys.holders, hold.field)
                except UNREACHABLE:
                    return  # the connection is down: renewal timing decides
                except RedisError as exc:  # WRONGTYPE: the key was overwritten
                    self._lose(hold, f"its Redis key was overwritten ({exc})")
                    return
                if value is None:
                    self._lose(hold, GONE)
                    return
                if not hold.recheck:
                    break
        finally:
            hold.checking = False
        if hub is not None and self.node.cluster and not hold.released:
            where = self.node.keyspace_watch(hold.keys.holders)
            if where is not None and where[0] is not hub and hold.on_stop is not None:
                on_stop, hold.on_stop = hold.on_stop, None
                on_stop()
                self._watch_key(hold)

    def _lose(self, hold: RedisHold, reason: str) -> None:
        renewal = hold.watchdog
        if hold.released or renewal is None or renewal.stopped:
            return
        renewal.stop()
        if hold.on_stop is not None:
            on_stop, hold.on_stop = hold.on_stop, None
            on_stop()
        renewal.grant.mark_lost(reason)

    # -- release ---------------------------------------------------------------

    async def release(self, grant: Grant) -> bool:
        """``release.lua`` for our field; ``False`` when Redis no longer had it."""
        hold = grant.handle
        if not isinstance(hold, RedisHold):
            return True
        if hold.grant is not grant:
            return True  # passed on to another task of ours: not this grant's any more
        successor = self._local_successor(hold, grant.request)
        if successor is not None and self._passable(hold, grant, successor):
            if await self._pass_on(hold, grant, successor):
                return True
            # Not passed on (the field was not as expected, the waiter left
            # or the send failed): the usual release, to whoever waits now.
            successor = self._local_successor(hold, grant.request)
        # Stop the watchdog *before* sending the unlock (Redisson #7272).
        hold.stop()
        self._holds.discard(hold)
        key = hold.keys.holders
        if self._owned.get(key) is hold:
            del self._owned[key]
        if self._closed:
            # Closing the backend released every hold first; a release after
            # close (the body of a hold the close ended, leaving its block)
            # must not reopen a connection on the closed client.
            return True
        # An exclusive hold's waiters are all queued (handed the lock
        # directly): nobody to tell on the lock's channel.
        publish = grant.request.mode is not Mode.EXCLUSIVE
        try:
            return await self._release_to_redis(hold, grant, successor, publish)
        finally:
            # Waiters here that waited on our hold, with nobody of ours in
            # the lock's queue: one of them takes that place now.
            self._promote(key)

    async def _release_to_redis(
        self, hold: RedisHold, grant: Grant, successor: RedisAttempt | None, publish: bool
    ) -> bool:
        """``release.lua`` for our field (to ``successor``, a waiter of ours, if not None)."""
        backoff = Backoff(time.monotonic() + min(hold.lease, self.node.connect_timeout), cap=0.5)
        # After a connection error the script may have run: a later "nothing
        # to delete" then proves nothing, unless the server refused it unrun.
        ambiguous = False
        while True:
            try:
                if successor is None:
                    removed = await self.node.release(
                        hold.keys, "", [hold.field, *hold.leave], 0, publish
                    )
                else:
                    target = successor.member
                    if successor.local:
                        # Not in the lock's queue: from this send on, the
                        # release may write its field, so its clean-up must
                        # delete it (or leave a tombstone the script heeds).
                        target = "+" + target
                        successor.maybe_written = True
                        successor.unanswered = True
                        successor.sent = time.monotonic()
                    removed, token = await self.node.release_to(
                        hold.keys, hold.field, target, publish, hold.leave
                    )
                    self._handed_locally(hold.keys.holders, successor, token)
            except UNREACHABLE as exc:
                ambiguous = ambiguous or not refused_unrun(exc)
                if successor is not None:
                    # It may have been handed the lock unheard: it tries (a
                    # try answers with a hand-off it finds). Retries go the
                    # usual way.
                    successor.send_lost = True
                    if successor.wake is not None:
                        successor.wake.ring()
                    successor = None
                if grant.lost:
                    self._nudge(hold.keys.holders)
                    return True  # the lease lapses; nothing to report on a lost hold
                if not await retry_after(exc, backoff):
                    raise map_error(
                        exc, f"releasing {grant.request.name!r}", self.describe()
                    ) from exc
                continue
            except RedisError as exc:
                if grant.lost:
                    self._nudge(hold.keys.holders)
                    return True
                raise map_error(exc, f"releasing {grant.request.name!r}", self.describe()) from exc
            # An unambiguous "nothing to delete": the hold was gone before we
            # released it (a failover to a replica that never saw it, a key
            # deleted behind our back, a lease that lapsed).
            if not removed:
                self._nudge(hold.keys.holders)
            return bool(removed) or ambiguous

    def _nudge(self, key: str) -> None:
        """Our hold of ``key`` was gone when we released it, so nothing in
        Redis handed the lock on: our waiters on it look now instead of at
        the end of their bounded wait. No I/O."""
        for a in self._queued.values():
            if (
                a.keys.holders == key
                and not a.local
                and not a.ended
                and a.granted is None
                and a.handed is None
                and a.wake is not None
            ):
                a.wake.ring()
        self._promote(key)

    def _passable(self, hold: RedisHold, grant: Grant, successor: RedisAttempt) -> bool:
        """Whether our Redis hold may be passed to ``successor``, a task of ours
        waiting in this process, with ``_pass_on``. No I/O.

        Only while the hold is sound (not lost, renewed, well inside its
        lease) and the block has a token left, and only to a waiter asking
        for the same lease with the watchdog on, as ours is (the hold goes
        on under the same lease and renewals), whose own try is not on the
        wire. Whether our field is still there is for ``pass_on.lua`` to say.
        """
        renewal = hold.watchdog
        now = time.monotonic()
        return not (
            self._closed
            or grant.lost
            or grant.token >= hold.block_end
            or renewal is None
            or renewal.stopped
            or not renewal.enabled
            or successor.lease != hold.lease
            or not successor.request.options.get("watchdog", True)
            or renewal.valid_until - now < hold.lease / 2
            or successor.unanswered
        )

    async def _pass_on(self, hold: RedisHold, grant: Grant, successor: RedisAttempt) -> bool:
        """Pass our Redis hold to ``successor``, a task of ours waiting in this
        process: same field, watchdog and loss watch, the next fencing token
        of the block the grant from Redis reserved. One script
        (``pass_on.lua``) rewrites the field to name the new holder and its
        token first, so that whoever reads the lock sees the true holder as
        soon as it holds; no fence counter, queue or subscription work.

        False: nothing was passed on (the field was gone or not as
        expected, the send failed, the waiter left or the hold was lost
        meanwhile); the caller releases the hold as usual, which deletes the
        field whatever it says now. A cancellation leaves the hold with
        ``grant``: the engine sends the release again, and that one finds the
        field rewritten, so it releases the usual way too.
        """
        request = successor.request
        token = grant.token + 1
        member = "" if successor.local else successor.member
        try:
            passed = await self.node.pass_hold(
                hold.keys, hold.field, grant.token, request, token, member
            )
        except (RedisError, OSError):
            return False  # the usual release (with its retries) follows
        renewal = hold.watchdog
        if (
            not passed
            or grant.lost
            or renewal is None
            or renewal.stopped
            or hold.grant is not grant
            or successor.ended
            or successor.handed is not None
            or successor.granted is not None
            or self._queued.get(successor.member) is not successor
        ):
            return False
        now = time.monotonic()
        if member:
            # Taken out of the lock's queue by the script; a refresh of the
            # entry on the wire meanwhile may put it back: it goes with this
            # hold's release to Redis, and a grant to it is given back.
            hold.leave.append(member)
            self._remember_left(member, hold.keys, now + successor.queue_timeout)
        handed = hold.grant = Grant(request, token, hold)
        handed.valid_until = renewal.valid_until
        renewal.grant = handed
        renewal.owner = request.owner
        key = hold.keys.holders
        self._local_streak[key] = self._local_streak.get(key, 0) + 1
        successor.handed = handed
        assert successor.wake is not None
        successor.wake.ring()
        return True

    def _remember_left(self, member: str, keys: LockKeys, until: float) -> None:
        """A grant to ``member`` before ``until`` (monotonic) is given back. No I/O."""
        if len(self._left) > 64:
            now = time.monotonic()
            self._left = {m: v for m, v in self._left.items() if v[1] > now}
        self._left[member] = (keys, until)

    async def _give_back(self, keys: LockKeys, field: str, member: str) -> None:
        """Release a hold Redis handed to a queue entry nobody waits on any more."""
        if not self._closed:
            lease = self._lease_of(member)
            await self.node.cleanup(keys, member, [field], lease, tombstone=False)

    @staticmethod
    def _lease_of(member: str) -> float:
        """The lease (s) in a queue member ``<field>|<lease ms>|<participant>``."""
        parts = member.split("|", 2)
        return int(parts[1]) / 1000 if len(parts) > 1 and parts[1].isdigit() else DEFAULT_LEASE_TIME

    async def _drop(self, grant: Grant) -> None:
        """Release a hold passed on to an attempt that did not take it (it
        ended, or the hold was lost on the way)."""
        try:
            await self.release(grant)
        except LockError as exc:
            logger.warning("releasing %s failed: %s", grant.request.name, exc)

    def _local_successor(self, hold: RedisHold, request: Request) -> RedisAttempt | None:
        """A waiter of this process to pass an unfair mutex to, or None. No I/O.

        The oldest attempt of ours queued on the same lock (its first try
        ran), unless ``LOCAL_HANDOFFS`` local hand-offs of this lock came in
        a row: then the queue head gets its turn (and the count restarts).
        A fair mutex always goes to the queue head.
        """
        key = hold.keys.holders
        if (
            request.mode is not Mode.EXCLUSIVE
            or request.options.get("fair")
            or self.node.min_replicas
            or not self._queued
        ):
            return None
        if self._local_streak.get(key, 0) >= LOCAL_HANDOFFS:
            del self._local_streak[key]
            return None
        # the oldest waiting here only first: one queued in the lock's queue
        # keeps its place there (taking it out would make another one try)
        queued = None
        for a in self._queued.values():
            if (
                a.keys.holders != key
                or a.fair
                or a.ended
                or a.granted is not None
                or a.handed is not None
                or a.wake is None
            ):
                continue
            if a.local:
                if not a.wake.is_set():  # not one rung to look (it is about to try)
                    return a
                continue
            if queued is None and a.args[QUEUE_ARG] == "q":
                queued = a
        return queued

    def _handed_locally(self, key: str, successor: RedisAttempt, token: int | None) -> None:
        """After ``release_to``: tell our waiter it holds the lock (no message). No I/O."""
        if successor.local:
            successor.unanswered = False
            if token is None:
                successor.maybe_written = False  # nothing written for it
        if token is None:
            self._local_streak.pop(key, None)
            return
        self._local_streak[key] = self._local_streak.get(key, 0) + 1
        # Still waiting: it takes the grant without a try. Ended meanwhile:
        # its abandon (queued, so it cleans up) gives the hold back.
        if self._queued.get(successor.member) is successor and successor.granted is None:
            successor.granted = token
            if successor.wake is not None:
                successor.wake.ring()

    # -- inspect -----------------------------------------------------------------

    def admin(self) -> RedisAdmin:
        """Listing and force-release (``aiolocks list``/``break``)."""
        from ._admin import RedisAdmin

        return RedisAdmin([self.node], self.key_prefix, self.describe())

    async def participants(self, name: str, family: Family) -> list[Participant]:
        keys = lock_keys(self.key_prefix, family, name)
        try:
            reply = await self.node.inspect(keys)
        except COMMAND_ERRORS as exc:
            raise map_error(exc, f"listing {name!r}", self.describe()) from exc
        return parse_participants(reply)


async def _wait_for_ring(wake: Wake, wait: float) -> None:
    """Wait up to ``wait`` seconds for ``wake`` to be rung (at once if it was)."""
    future = wake.prepare(wait)
    if future is None:
        return
    try:
        await future
    finally:
        wake.settle()
