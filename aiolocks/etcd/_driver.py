"""The etcd driver, on the attempt-lifecycle driver contract of ``aiolocks._core.driver``.

:class:`EtcdAttempt` is the contract's ``Attempt``; ``aiolocks.etcd.EtcdBackend``
wraps :class:`EtcdDriver`.

The recipe (etcd's concurrency package, with its known bugs closed)
--------------------------------------------------------------------
* **Session = one lease** per backend, kept alive by one keep-alive stream
  at TTL/3. Its client-side deadline is every grant's ``valid_until``; when
  it passes, or etcd answers TTL=0, every hold of the session is lost, and
  the next try of a waiting attempt grants a new lease (waiters keep
  waiting across sessions).
* **Keys.** A lock's queue lives under ``<root><family>\\x00<name>\\x00``:
  lock names never contain control characters, so one lock's queue is never
  a prefix of another's. An attempt's key is ``<queue><lease hex>/<attempt
  id>.<kind>``: two attempts of one backend never share a key (the shared
  per-session key of etcd's Go recipe let two mutexes of one session both
  "win"). An id whose key is gone for sure is used again by a later attempt
  on the same queue (etcd indexes every key name ever written until its
  history is compacted, and a queue's head read walks them all, so a new
  name per acquire made a busy lock slower and slower). ``acquire_many(n)``
  writes ``n`` keys (``<attempt id>-<i>``), one transaction each, so that
  each lease has a create revision (fencing token) of its own; every
  transaction after the first also checks that no other key joined the queue
  since our previous one, so the ``n`` keys stand together in the queue and
  two such acquires can never interleave and deadlock (an acquire that was
  interleaved drops its keys and starts over after a short random pause). A
  write -> read downgrade writes a read key named ``.r@<write revision>`` in
  a transaction that checks the write key is still ours; the queue order
  puts it at the write key's place, so no writer queued behind the write
  hold gets in between.
* **Try** = one transaction: ``If(create_revision(key) == 0 and
  create_revision(tombstone) == 0) Then(Put(key, lease), Range(queue))
  Else(Range(key), Range(queue))``. The owner is the lowest create
  revision (first ``max_leases`` for a semaphore; readers wait only for
  earlier writers). The fencing token is the key's create revision. A try
  whose key exists already (a waiter's, after its wait) only reads: a
  transaction of reads is a linearizable read, with no write to etcd's log.
* **Wait** = a watch on the one key to wait for (the last earlier key; for a
  reader, the last earlier writer). The watch starts from *now*: etcd
  serves a watch whose start revision is already in its history only from
  a loop that runs every 100 ms, so a watch from the revision of our read
  (in a busy queue, other keys are nearly always written in between) saw
  the event it waited for up to 100 ms late. When the store moved on
  between the read and the watch, one read (serializable, at a revision at
  least the watch's) tells whether the key changed in between. A semaphore
  waiter first in line watches the queue for deletes; one further back
  watches the key just ahead of it, whose owner touches it (a put) when it
  gets its leases, so a release wakes one waiter, never the whole queue.
  The next try reads its own key again: a waiter whose key went with its
  lease starts over in a new session rather than claiming the lock (the Go
  recipe could return a lock after its lease had expired, and kept waiting
  on a dead session).
* **Release** deletes only if the create revision is still ours, so a
  stale, repeated release can never delete a newer holder's key.
* **Direct handoff, across the backends of a process.** The etcd drivers
  of one event loop on one cluster (its id) and key prefix know each other
  (a weak registry, ``_Peers``), and each lists its waiting exclusive
  attempts by key. When some attempt of theirs waits in the queue of a key
  being released, the release transaction also reads the head of the
  queue after its delete (or, when one of them waits right behind the
  released key, that attempt's key alone: nothing can stand between the
  two, and etcd finds the head only by sorting the whole queue). The
  released key was the owner (the lowest), so if the delete went through,
  the key found is the owner as of that transaction; its name carries its
  session's lease, which names the driver; if that driver lists an attempt with that key and create
  revision, on the session it still considers live, the attempt takes the
  lock at once, without the watch event and without a transaction of its
  own (a key that went with its lease is not found: etcd's own recipe
  could hand out such a lock). Anything else (a waiter of another process,
  an attempt cancelled, started over or whose session ended) learns of the
  release from its watch, as before; a watch event of the same delete that
  arrives first is harmless (the attempt's own read then finds it owns the
  lock).
* **Prompt loss.** Each hold watches its own key from the revision after
  its creation, starting 50 ms after the grant (a delete in between is
  replayed, so nothing is missed, and a hold shorter than that never opens
  a watch); a delete behind our back (revoke, ``etcdctl del``) marks it lost
  at once.
* **Abandon** deletes the attempt's keys; when a try was unanswered, it
  first writes a tombstone key (outside every queue) that the late
  transaction's compare refuses, on a lease of its own of twice the request
  timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final

from .._core.backoff import Backoff
from .._core.driver import Attempt, Capabilities, Family, Grant, Mode, Request
from .._core.errors import AccessDeniedError, BackendUnavailableError
from .._core.participants import Participant
from .._core.states import StateFeed
from .._core.tasks import TaskSet
from ._client import (
    CompactedError,
    Compare,
    DeleteOp,
    EtcdClient,
    EtcdError,
    EventType,
    KeyValue,
    LeaseKeepAlive,
    LeaseNotFoundError,
    PutOp,
    RangeOp,
    RangeResult,
    SortOrder,
    SortTarget,
    TxnResult,
)
from ._records import EtcdRecords
from ._state import ConnectionState
from ._url import EtcdOptions

if TYPE_CHECKING:
    from .._core.doctor import Diagnosis
    from ._admin import EtcdAdmin

__all__ = ["EtcdAttempt", "EtcdDriver"]

_log = logging.getLogger("aiolocks.etcd")

_KIND: Final = {Mode.EXCLUSIVE: "x", Mode.LEASE: "l", Mode.READ: "r", Mode.WRITE: "w"}
_MODE_NAME: Final = {"x": "exclusive", "l": "lease", "r": "read", "w": "write"}
#: a hold's loss watch starts this long after the grant (seconds): it watches
#: from the revision after the key's creation, so a delete in between is
#: still reported, at most this much later; a hold shorter than this never
#: opens one
_LOSS_WATCH_DELAY: Final = 0.05
#: how many queues' free attempt ids a driver keeps (see ``begin``)
_FREE_IDS_KEPT: Final = 1024
#: how many queues' prebuilt head reads a driver keeps (see ``_queue_reads``)
_READS_KEPT: Final = 256
# Tombstones live outside every queue (queues start with a family name).
_TOMBSTONES: Final = b"\x00abandoned\x00"


class _Session:
    """One lease, its keep-alive, and the grants that live on it."""

    __slots__ = ("grants", "keeper", "lease_id", "lost", "lost_reason", "wakers")

    def __init__(self, lease_id: int, keeper: LeaseKeepAlive) -> None:
        self.lease_id = lease_id
        self.keeper = keeper
        self.grants: set[Grant] = set()
        self.lost = asyncio.Event()
        self.lost_reason = ""
        #: futures of the waits on this session, set when it is lost
        self.wakers: set[asyncio.Future[None]] = set()


class _Hold:
    """The driver handle of a grant: its key, create revision, session, loss watch."""

    __slots__ = (
        "key",
        "queue",
        "releasing",
        "revision",
        "session",
        "slot",
        "watch_task",
        "watch_timer",
    )

    def __init__(self, key: bytes, revision: int, session: _Session) -> None:
        self.key = key
        self.revision = revision
        self.session = session
        #: the attempt id the key is named after, to use again once the key is
        #: released (``None``: not to be used again, or given back already)
        self.slot: str | None = None
        self.queue = b""
        self.releasing = False
        self.watch_task: asyncio.Task[None] | None = None
        self.watch_timer: asyncio.TimerHandle | None = None


@dataclasses.dataclass(slots=True)
class _Awaited:
    """What a waiting attempt watches (see ``EtcdDriver.wait_for_change``).

    ``read_at``: the revision of the read that found it (the watch starts
    after it). ``target``: the key whose delete (or, ``with_puts``, touch
    past revision ``touched``) may let the attempt in; ``whole_queue``: any
    delete in the queue may. ``recheck``: a read that tells whether what we
    wait for changed since ``read_at``, and the test of its answer.
    """

    read_at: int
    target: bytes | None = None
    target_revision: int = 0
    touched: int = 0
    whole_queue: bool = False
    with_puts: bool = False
    recheck: tuple[RangeOp, Callable[[RangeResult], bool]] | None = None


class EtcdAttempt(Attempt):
    """One acquire attempt.

    ``attempt_id`` is minted in ``begin``; the keys (one per lease asked
    for) are bound to the session's lease at the first try and re-bound if
    the session changes.
    """

    __slots__ = (
        "__weakref__",
        "ahead",
        "attempt_id",
        "created",
        "downgrade",
        "handoff",
        "interleaved",
        "keys",
        "listed",
        "revision",
        "revisions",
        "session",
        "unanswered",
        "waited",
        "woken",
    )

    def __init__(self, request: Request, attempt_id: str) -> None:
        super().__init__(request)
        self.attempt_id = attempt_id
        self.keys: list[bytes] = []
        self.session: _Session | None = None
        self.revision = 0
        #: each key's create revision (its lease's fencing token), in key order
        self.revisions: list[int] = []
        #: a mutex attempt's last try also read the key just ahead of its own:
        #: ``(that key or None, its create revision, the store revision of the read)``
        self.ahead: tuple[bytes | None, int, int] | None = None
        #: keys of an ``acquire_many`` written so far (one transaction each)
        self.created = 0
        #: another key joined the queue between two of ours: pause, start over
        self.interleaved = False
        self.unanswered = False
        self.waited = False
        #: the write hold this read takes the place of (write -> read downgrade)
        self.downgrade: _Hold | None = None
        #: the create revision of our key when a release (of any etcd backend of
        #: this process) handed the lock to this waiting attempt; 0: none
        #: (see ``EtcdDriver.release``)
        self.handoff = 0
        #: the future that ends the current wait (a handoff sets it)
        self.woken: asyncio.Future[None] | None = None
        #: the key under which the driver lists this attempt as waiting (see ``_list``)
        self.listed: bytes | None = None


def _kind(key: bytes) -> bytes:
    return key.rsplit(b".", 1)[-1]


def _is_writer(key: bytes) -> bool:
    return _kind(key) == b"w"


def _position(kv: KeyValue) -> tuple[int, int, int, bytes]:
    """Queue order: create revision, except that a downgraded read stands at its write key.

    The read key of a write -> read downgrade is named ``.r@<write revision>``
    and sorts just before the write key it replaces, so no writer queued
    behind the write hold can get in between.
    """
    kind = _kind(kv.key)
    if kind.startswith(b"r@"):
        try:
            return (int(kind[2:], 16), 0, kv.create_revision, kv.key)
        except ValueError:
            pass
    return (kv.create_revision, 1, kv.create_revision, kv.key)


def _ordered(kvs: tuple[KeyValue, ...]) -> list[KeyValue]:
    return sorted(kvs, key=_position)


def _lease_of(key: bytes, queue: bytes) -> int | None:
    """The session lease a queue key is named after (``<queue><lease hex>/<id>.<kind>``)."""
    name = key[len(queue) :]
    if len(name) < 18 or name[16:17] != b"/" or not key.startswith(queue):
        return None
    try:
        return int(name[:16], 16)
    except ValueError:
        return None


class _Peers:
    """The live etcd drivers of this process on one event loop, cluster and key prefix.

    A release hands the lock to the next waiter in line when that waiter is
    an attempt of any of them (see ``EtcdDriver.release``). Drivers are held
    weakly: the registry never keeps a backend alive.
    """

    __slots__ = ("__weakref__", "behind", "by_lease", "waiting")

    def __init__(self) -> None:
        #: each driver under the lease of its live session
        self.by_lease: weakref.WeakValueDictionary[int, EtcdDriver] = (
            weakref.WeakValueDictionary()
        )
        #: per queue, how many exclusive attempts of these drivers wait in it
        self.waiting: dict[bytes, int] = {}
        #: a waiting mutex attempt of these drivers, by the key (and its create
        #: revision) just ahead of its own, for as long as it waits for it
        self.behind: dict[tuple[bytes, int], weakref.ref[EtcdAttempt]] = {}


#: by (event loop, cluster id, key prefix): the drivers of this process that
#: may hand each other locks
_PEERS: weakref.WeakValueDictionary[tuple[asyncio.AbstractEventLoop, int, bytes], _Peers] = (
    weakref.WeakValueDictionary()
)


class EtcdDriver:
    """The etcd driver: one lease per backend, one key per lease asked for."""

    capabilities = Capabilities(fair=True, queue_visible=True, can_lose=True)

    def __init__(
        self,
        options: EtcdOptions,
        *,
        client: EtcdClient | None = None,
    ) -> None:
        self._options = options
        self._owns_client = client is None
        self._client = client or EtcdClient(
            list(options.endpoints),
            connect_timeout=options.connect_timeout,
            request_timeout=options.request_timeout,
            username=options.username,
            password=options.password,
            tls=options.tls,
        )
        root = f"{options.prefix}/" if options.prefix else ""
        self._root = root.encode()
        self._engine_tasks: TaskSet | None = None
        self._session: _Session | None = None
        self._session_lock = asyncio.Lock()
        self._states: StateFeed[ConnectionState] = StateFeed()
        self._closing = False
        self._timers: set[asyncio.TimerHandle] = set()
        self._reads: dict[tuple[bytes, int, bool], tuple[RangeOp, RangeOp | None]] = {}
        #: this driver's waiting exclusive attempts, by their key (see ``_list``)
        self._queued: dict[bytes, EtcdAttempt] = {}
        #: the drivers of this process on the same cluster and prefix (set by ``open``)
        self._peers = _Peers()
        #: per queue, attempt ids whose keys are gone for sure (see ``begin``)
        self._free_ids: dict[bytes, list[str]] = {}
        self._next_id = 0
        self._records = EtcdRecords(self)

    # -- plumbing

    @property
    def client(self) -> EtcdClient:
        """The etcd client this driver talks through."""
        return self._client

    @property
    def options(self) -> EtcdOptions:
        """The checked options (endpoints, prefix, lease TTL, timeouts)."""
        return self._options

    @property
    def root(self) -> bytes:
        """The key prefix every key of this driver starts with (``b""`` or ``b"prefix/"``)."""
        return self._root

    def describe(self) -> str:
        """``etcd://h1:2379,h2:2379/prefix``."""
        return self._options.description

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        """No per-lock options on etcd: any is a ``ValueError`` naming it."""
        if options:
            raise ValueError(
                f"etcd locks take no per-lock options, got {', '.join(sorted(options))}"
            )
        return {}

    def _spawn(
        self, coro: Coroutine[Any, Any, None], name: str, *, service: bool = False
    ) -> asyncio.Task[None]:
        """Background work in the engine's task set (given to ``open``).

        ``service``: a watch that lives as long as what it serves (a hold, a
        record, a session); not work in flight, cancelled by its owner
        (release) or by the engine's close, which finishes the task set
        before it closes the driver.
        """
        tasks = self._engine_tasks
        if tasks is None:
            coro.close()
            raise RuntimeError("the etcd driver was not opened")
        return tasks.spawn(coro, name=name, service=service)

    def _watcher(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """:meth:`_spawn` of a service."""
        return self._spawn(coro, name, service=True)

    def _tombstone(self, key: bytes) -> bytes:
        return self._root + _TOMBSTONES + key[len(self._root) :]

    def _queue_of(self, name: str, family: Family) -> bytes:
        return self._root + f"{family.value}\x00{name}\x00".encode()

    def _queue(self, request: Request) -> bytes:
        return self._queue_of(request.name, request.family)

    async def open(self, tasks: TaskSet) -> None:
        """Connect and start the first session; ``BackendUnavailableError`` in time.

        Background work (waking the next waiter) goes into the engine's
        ``tasks``; so do the watches of holds and records, as services.
        """
        self._engine_tasks = tasks
        await self._client.connect()
        # Peers share the event loop too: a hand-off wakes the waiter's future.
        group = (asyncio.get_running_loop(), self._client.cluster_id, self._root)
        peers = _PEERS.get(group)
        if peers is None:
            peers = _PEERS[group] = _Peers()
        self._peers = peers
        await self._live_session()

    async def close(self) -> None:
        """Revoke the session lease (its keys go at once) and disconnect our own client."""
        self._closing = True
        self._records.close()  # ephemeral records go with the lease: not a loss
        self._states.close()
        for timer in list(self._timers):
            timer.cancel()
        self._timers.clear()
        session, self._session = self._session, None
        if session is not None:
            self._unpeer(session)
        if session is not None:
            with contextlib.suppress(BackendUnavailableError, LeaseNotFoundError):
                await session.keeper.revoke()
        if self._owns_client:
            await self._client.close()

    # -- sessions

    async def _live_session(self) -> _Session:
        session = self._session
        if session is not None and not session.lost.is_set():
            return session
        async with self._session_lock:
            session = self._session
            if session is not None and not session.lost.is_set():
                return session
            grant = await self._client.lease_grant(self._options.lease_ttl)
            holder: list[_Session] = []
            keeper = self._client.keep_alive(
                grant,
                on_expired=lambda reason: self._session_lost(holder[0], reason),
                on_refreshed=lambda deadline: self._session_renewed(holder[0], deadline),
                on_failed=lambda detail: self._session_failing(holder[0], detail),
            )
            session = _Session(grant.id, keeper)
            holder.append(session)
            self._session = session
            self._peers.by_lease[grant.id] = self
            if not self._closing:
                first = self._states.state is None
                self._emit(ConnectionState.CONNECTED if first else ConnectionState.RECONNECTED)
            return session

    def _session_renewed(self, session: _Session, deadline: float) -> None:
        for grant in session.grants:
            grant.valid_until = deadline  # loop.time() is time.monotonic() here
            grant.note_renewed()
        if self._session is session and self._states.state is ConnectionState.SUSPENDED:
            self._emit(ConnectionState.RECONNECTED)

    def _session_failing(self, session: _Session, detail: str) -> None:
        if self._session is session and self._states.state in (
            ConnectionState.CONNECTED,
            ConnectionState.RECONNECTED,
        ):
            _log.info("etcd session lease %x suspended: %s", session.lease_id, detail)
            self._emit(ConnectionState.SUSPENDED)

    def _session_lost(self, session: _Session, reason: str) -> None:
        session.lost_reason = reason
        session.lost.set()
        wakers, session.wakers = session.wakers, set()
        for waker in wakers:
            if not waker.done():
                waker.set_result(None)
        self._unpeer(session)
        if self._session is session:
            self._session = None
            if not self._closing:
                self._emit(ConnectionState.LOST)
                self._watcher(self._regrant(), "aiolocks-etcd-new-session")
        grants, session.grants = list(session.grants), set()
        for grant in grants:
            grant.mark_lost(f"the etcd session lease {session.lease_id:x} ended: {reason}")
        self._records.session_lost(session.lease_id, reason)

    def _unpeer(self, session: _Session) -> None:
        """No release hands this driver a lock on ``session`` any more."""
        if self._peers.by_lease.get(session.lease_id) is self:
            del self._peers.by_lease[session.lease_id]

    async def _regrant(self) -> None:
        """After ``LOST``: grant a new session lease in the background, retrying until it works."""
        backoff = Backoff(math.inf, first=0.1, cap=2.0)
        while not self._closing:
            try:
                await self._live_session()
                return
            except (BackendUnavailableError, EtcdError) as exc:
                _log.info("etcd: no new session lease yet: %s", exc)
            except AccessDeniedError as exc:  # a rotated password: an operator must act
                _log.warning("etcd: no new session lease: %s", exc)
            await backoff.wait()

    # -- connection states

    @property
    def connection_state(self) -> ConnectionState | None:
        """The last connection state (``None`` before ``open()``)."""
        return self._states.state

    def _emit(self, state: ConnectionState) -> None:
        self._states.publish(state)

    def add_listener(self, listener: Callable[[ConnectionState], object]) -> Callable[[], None]:
        """Call ``listener(state)`` on every state change; returns a remover."""
        return self._states.add_listener(listener)

    def states(self) -> AsyncIterator[ConnectionState]:
        """Yield every state change from now on, until the driver closes."""
        return self._states.states()

    # -- the attempt lifecycle

    def _mint_id(self) -> str:
        self._next_id += 1
        return f"{self._next_id:x}"

    def _give_back(self, queue: bytes, attempt_id: str) -> None:
        """``attempt_id``'s keys on ``queue`` are gone for sure: a later attempt may use it."""
        if len(self._free_ids) >= _FREE_IDS_KEPT and queue not in self._free_ids:
            self._free_ids.clear()
        self._free_ids.setdefault(queue, []).append(attempt_id)

    def begin(self, request: Request) -> EtcdAttempt:
        """Pick the attempt id (no I/O).

        An id is unique among the live attempts of this driver (a key is
        ``<queue><lease>/<id>.<kind>``: two attempts never share one). An id
        whose key was deleted with an answer from etcd (released, or
        abandoned with every try answered) is used again by a later attempt
        on the same queue: etcd keeps an index entry for every key name ever
        written until the history is compacted, and reading the head of a
        queue walks them all, so a busy lock with a new name per acquire would
        read slower and slower. (A late copy of an old try that created the
        key again after its release would be taken over by the attempt that
        uses the id next, and released with it, rather than left in the queue.)
        """
        queue = self._queue(request)
        free = self._free_ids.get(queue)
        if free:
            attempt_id = free.pop()
            if not free:
                del self._free_ids[queue]
        else:
            attempt_id = self._mint_id()
        attempt = EtcdAttempt(request, attempt_id)
        write = request.downgrade_of
        if write is not None and isinstance(write.handle, _Hold):
            attempt.downgrade = write.handle
        return attempt

    def _bind(self, attempt: EtcdAttempt, session: _Session) -> None:
        self._unlist(attempt)
        request = attempt.request
        attempt.session = session
        kind = _KIND[request.mode]
        if request.mode is Mode.LEASE:
            kind += str(request.max_leases)  # participants() needs N
        downgrade = attempt.downgrade
        if downgrade is not None and (downgrade.session is not session or downgrade.releasing):
            attempt.downgrade = downgrade = None  # the write hold is gone: an ordinary read
        if downgrade is not None:
            kind += f"@{downgrade.revision:x}"
        base = self._queue(request) + f"{session.lease_id:016x}/{attempt.attempt_id}".encode()
        if request.count == 1:
            attempt.keys = [base + f".{kind}".encode()]
        else:
            attempt.keys = [base + f"-{i}.{kind}".encode() for i in range(request.count)]
        attempt.revision = 0
        attempt.revisions = []
        attempt.created = 0

    def _list(self, attempt: EtcdAttempt) -> None:
        """List a waiting exclusive attempt, so that a release can hand it the lock.

        Only once its key's create revision is known (a try was answered) and
        while that key is its only one; ``_unlist`` takes it off before the key
        changes or goes (grant, start over, abandon, finish).
        """
        key = attempt.keys[0]
        if attempt.listed == key:
            return
        self._unlist(attempt)
        attempt.listed = key
        self._queued[key] = attempt
        queue = self._queue(attempt.request)
        waiting = self._peers.waiting
        waiting[queue] = waiting.get(queue, 0) + 1

    def _unlist(self, attempt: EtcdAttempt) -> None:
        key, attempt.listed = attempt.listed, None
        if key is None:
            return
        if self._queued.get(key) is attempt:
            del self._queued[key]
        queue = self._queue(attempt.request)
        waiting = self._peers.waiting
        left = waiting.get(queue, 0) - 1
        if left > 0:
            waiting[queue] = left
        else:
            waiting.pop(queue, None)

    def _refused(self, attempt: EtcdAttempt) -> None:
        """etcd refused a transaction of ``attempt``: it checks a transaction's
        permissions before applying any of it, so the transaction wrote nothing.

        With no key of the attempt written before, there is nothing to give
        back (and the clean-up would only be refused the same way). A resend
        refused after an earlier send went unanswered would need the user's
        permissions to change between the two: that key lapses with the session.
        """
        attempt.unanswered = False
        if attempt.revision == 0 and not attempt.revisions and attempt.created == 0:
            attempt.keys = []

    async def _start_over(self, attempt: EtcdAttempt) -> None:
        """Drop what is left of the attempt's keys; the next try binds new ones."""
        self._unlist(attempt)
        await self._drop_keys(attempt.keys)
        attempt.keys = []
        attempt.session = None
        attempt.downgrade = None
        attempt.revisions = []
        attempt.created = 0
        attempt.attempt_id = self._mint_id()

    async def _create_in_a_row(self, attempt: EtcdAttempt, session: _Session) -> bool:
        """Write an ``acquire_many``'s keys one transaction each, next to each other.

        Each key gets a create revision of its own (distinct fencing tokens).
        Every key after the first is written only if no key of the queue is
        newer than our previous one, so nobody stands between our keys.
        ``False``: the session ended, or another key got in between (the
        attempt then starts over, after a short pause).
        """
        request = attempt.request
        queue = self._queue(request)
        keys = attempt.keys
        while attempt.created < len(keys):
            key = keys[attempt.created]
            compares = [
                Compare.create_revision(key, "==", 0),
                Compare.create_revision(self._tombstone(key), "==", 0),
            ]
            if attempt.revisions:
                compares.append(
                    Compare.create_revision(queue, "<", attempt.revisions[-1] + 1, prefix=True)
                )
            attempt.unanswered = True
            try:
                result = await self._client.txn(
                    compares,
                    [PutOp.of(key, request.participant, lease=session.lease_id)],
                    [RangeOp.of(key)],
                    retry=True,
                )
            except LeaseNotFoundError:
                attempt.unanswered = False
                self._session_lost(session, "etcd said the lease does not exist")
                return False
            except AccessDeniedError:
                self._refused(attempt)
                raise
            attempt.unanswered = False
            if result.succeeded:
                revision = result.revision
            else:
                found = result.responses[0]
                assert isinstance(found, RangeResult)
                if found.kvs and found.kvs[0].lease == session.lease_id:
                    # An earlier send of this very transaction went through.
                    revision = found.kvs[0].create_revision
                else:
                    attempt.interleaved = True
                    await self._start_over(attempt)
                    return False
            attempt.revisions.append(revision)
            attempt.created += 1
        return True

    def _queue_reads(
        self, queue: bytes, head_limit: int, exclusive: bool
    ) -> tuple[RangeOp, RangeOp | None]:
        """The reads of a queue's head (and, for a mutex, of its two newest keys).

        The same for every try on a queue, so built (and wire-encoded) once
        per queue: a few recently used queues are kept.
        """
        cache_key = (queue, head_limit, exclusive)
        found = self._reads.get(cache_key)
        if found is None:
            head = RangeOp.of(
                queue,
                prefix=True,
                limit=head_limit,
                keys_only=True,
                sort_target=SortTarget.CREATE,
                sort_order=SortOrder.ASCEND,
            )
            newest = None
            if exclusive:
                newest = RangeOp.of(
                    queue,
                    prefix=True,
                    limit=2,
                    keys_only=True,
                    sort_target=SortTarget.CREATE,
                    sort_order=SortOrder.DESCEND,
                )
            if len(self._reads) >= _READS_KEPT:
                self._reads.clear()
            found = self._reads[cache_key] = (head, newest)
        return found

    def _try_txn(
        self,
        attempt: EtcdAttempt,
        session: _Session,
        queue: bytes,
        *,
        exclusive: bool,
        readonly: bool,
    ) -> tuple[list[Compare], list[PutOp | RangeOp], list[PutOp | RangeOp], RangeOp | None]:
        """The transaction of one try: compares, ops, failure ops, and the read of the key ahead.

        ``exclusive``: a mutex attempt (one holder, no shared reads).
        ``readonly``: the attempt's keys exist already; they and the queue
        are only read. Otherwise the first key is put if absent (and not
        tombstoned, and, for a downgrade, while our write key is there). A
        mutex attempt also reads the key just ahead of its own: a new key is
        the newest of the queue (the two newest keys are it and the one
        ahead); a key written before, of known revision, reads the newest key
        older than it (the fourth item; ``None`` when not read).
        """
        request = attempt.request
        keys = attempt.keys
        if request.family is Family.READ_WRITE:
            head_limit = 0  # downgraded reads stand out of create order: read it all
        elif request.mode is Mode.LEASE:
            head_limit = request.max_leases
        else:
            head_limit = 1
        head, ahead_new = self._queue_reads(queue, head_limit, exclusive)
        reads: list[PutOp | RangeOp] = [*(RangeOp.of(key) for key in keys), head]
        ahead_old = None
        if exclusive and attempt.revision:
            ahead_old = RangeOp.of(
                queue,
                prefix=True,
                limit=1,
                keys_only=True,
                max_create_revision=attempt.revision - 1,
                sort_target=SortTarget.CREATE,
                sort_order=SortOrder.DESCEND,
            )
            reads.append(ahead_old)
        if readonly:
            return [], reads, [], ahead_old
        compares = [
            Compare.create_revision(keys[0], "==", 0),
            Compare.create_revision(self._tombstone(keys[0]), "==", 0),
        ]
        downgrade = attempt.downgrade
        if downgrade is not None:
            compares.append(Compare.create_revision(downgrade.key, "==", downgrade.revision))
        ops: list[PutOp | RangeOp] = [
            PutOp.of(keys[0], request.participant, lease=session.lease_id),
            head,
        ]
        if ahead_new is not None:
            ops.append(ahead_new)
        return compares, ops, reads, ahead_old

    def _note_ahead(
        self, attempt: EtcdAttempt, result: TxnResult, created: bool, read_older: bool
    ) -> None:
        """Keep in ``attempt.ahead`` the key just ahead of ours that a try read (none: first)."""
        keys = attempt.keys
        ahead = result.responses[len(keys) + 1]
        assert isinstance(ahead, RangeResult)
        if created:
            older = [kv for kv in ahead.kvs if kv.key != keys[0]]
            attempt.ahead = (
                (older[0].key, older[0].create_revision, result.revision)
                if older
                else (None, 0, result.revision)
            )
        elif read_older:
            attempt.ahead = (
                (ahead.kvs[0].key, ahead.kvs[0].create_revision, result.revision)
                if ahead.kvs
                else (None, 0, result.revision)
            )

    async def try_once(self, attempt: Attempt) -> list[Grant] | None:
        """One transaction: create the attempt's keys if absent and read the head of the queue."""
        assert isinstance(attempt, EtcdAttempt)
        request = attempt.request
        handed, attempt.handoff = attempt.handoff, 0
        session = attempt.session
        if (
            handed
            and handed == attempt.revision
            and session is not None
            and session is self._session
            and not session.lost.is_set()
            and attempt.keys
        ):
            # A release handed us the lock: its transaction found our key,
            # of this very revision, at the head of the queue (see release).
            attempt.revisions = [handed]
            return self._grant(attempt, session, self._queue(request))
        session = await self._live_session()
        if attempt.session is not session or not attempt.keys:
            self._bind(attempt, session)
        multi = request.count > 1
        if multi and not await self._create_in_a_row(attempt, session):
            return None
        keys = attempt.keys
        queue = self._queue(request)
        # A mutex attempt also reads the key just ahead of its own in the same
        # transaction, so that waiting needs no read of its own.
        exclusive = request.family is not Family.READ_WRITE and request.mode is not Mode.LEASE
        # Keys written already (an acquire_many's, one by one above; a
        # waiter's, by its first try) are only read again: a transaction of
        # reads only is a linearizable read for etcd, answered without a write
        # to its log (a compare-and-put that fails is still a logged write).
        readonly = multi or (attempt.revision != 0 and attempt.downgrade is None)
        compares, ops, failure, ahead_old = self._try_txn(
            attempt, session, queue, exclusive=exclusive, readonly=readonly
        )
        attempt.ahead = None
        # A read cannot create a key late: only a write goes unanswered.
        attempt.unanswered = not readonly
        try:
            result = await self._client.txn(compares, ops, failure, retry=True)
        except LeaseNotFoundError:
            attempt.unanswered = False
            self._session_lost(session, "etcd said the lease does not exist")
            return None
        except AccessDeniedError:
            self._refused(attempt)
            raise
        attempt.unanswered = False
        created = result.succeeded and not readonly
        if created:
            attempt.revisions = [result.revision]
        else:
            found = [r for r in result.responses[: len(keys)] if isinstance(r, RangeResult)]
            if len(found) != len(keys) or any(not r.kvs for r in found):
                # A key of ours is gone (its lease ended, it was deleted behind
                # our back, or our write hold went before the downgrade): never
                # claim anything; drop what is left and start over, new keys.
                await self._start_over(attempt)
                return None
            attempt.revisions = [r.kvs[0].create_revision for r in found]
        attempt.revision = attempt.revisions[0]
        ranked = result.responses[len(keys)]
        assert isinstance(ranked, RangeResult)
        if exclusive and len(result.responses) > len(keys) + 1:
            self._note_ahead(attempt, result, created, ahead_old is not None)
        if not self._wins(request, keys, ranked.kvs):
            if exclusive and not multi:
                self._list(attempt)
            return None
        return self._grant(attempt, session, queue)

    def _grant(self, attempt: EtcdAttempt, session: _Session, queue: bytes) -> list[Grant]:
        """The attempt won: its keys become grants (no I/O, no await)."""
        self._unlist(attempt)
        request = attempt.request
        keys = attempt.keys
        multi = request.count > 1
        grants: list[Grant] = []
        holds: list[_Hold] = []
        for key, revision in zip(keys, attempt.revisions, strict=True):
            hold = _Hold(key, revision, session)
            if not multi:
                hold.slot, hold.queue = attempt.attempt_id, queue
            grant = Grant(request, revision, hold)
            grant.valid_until = session.keeper.deadline
            session.grants.add(grant)
            holds.append(hold)
            grants.append(grant)
        # No await between "won" and the return (contract). The loss watch
        # starts a moment later, from the revision after the key's creation
        # (a delete in between is replayed): a short hold never pays for it.
        loop = asyncio.get_running_loop()
        for grant, hold in zip(grants, holds, strict=True):
            hold.watch_timer = loop.call_later(
                _LOSS_WATCH_DELAY, self._start_loss_watch, grant, hold
            )
            self._timers.add(hold.watch_timer)
        if attempt.waited and request.mode is Mode.LEASE:
            # The next waiter watches our key for this: it may be first in line now.
            self._spawn(self._touch(holds, request.participant), "aiolocks-etcd-wake")
        attempt.keys = []  # the keys now belong to the grants, not the attempt
        return grants

    def _wins(self, request: Request, keys: list[bytes], head: tuple[KeyValue, ...]) -> bool:
        if request.mode is Mode.LEASE:
            present = {kv.key for kv in head[: request.max_leases]}
            return all(key in present for key in keys)
        ordered = _ordered(head) if request.family is Family.READ_WRITE else list(head)
        mine = keys[0]
        if request.mode is Mode.READ:
            for kv in ordered:
                if kv.key == mine:
                    return True
                if _is_writer(kv.key):
                    return False
            return False
        return bool(ordered) and ordered[0].key == mine

    async def _touch(self, holds: list[_Hold], value: str) -> None:
        for hold in holds:
            if hold.releasing:
                continue
            with contextlib.suppress(BackendUnavailableError, LeaseNotFoundError):
                await self._client.txn(
                    [Compare.create_revision(hold.key, "==", hold.revision)],
                    [PutOp.of(hold.key, value, lease=hold.session.lease_id)],
                    [],
                )

    async def _drop_keys(self, keys: list[bytes]) -> None:
        if keys:
            await self._client.txn([], [DeleteOp.of(key) for key in keys], [], retry=True)

    async def _awaited_in_read_write(self, attempt: EtcdAttempt, queue: bytes) -> _Awaited | None:
        """Reader: the last writer ahead; writer: the key just ahead (``None``: ours is gone)."""
        seen = await self._client.range(RangeOp.of(queue, prefix=True, keys_only=True))
        ordered = _ordered(seen.kvs)
        mine = attempt.keys[0]
        index = next((i for i, kv in enumerate(ordered) if kv.key == mine), None)
        if index is None:
            return None  # our key is gone: the next try starts over
        earlier = ordered[:index]
        if attempt.request.mode is Mode.READ:
            earlier = [kv for kv in earlier if _is_writer(kv.key)]
        if not earlier:
            return _Awaited(seen.revision)
        return _Awaited(seen.revision, earlier[-1].key, earlier[-1].create_revision)

    async def _awaited_in_semaphore(self, attempt: EtcdAttempt, queue: bytes) -> _Awaited | None:
        """First in line: any delete in the queue; further back: the key just ahead (its touch).

        ``None``: there is room now.
        """
        request = attempt.request
        seen = await self._client.range(
            RangeOp.of(
                queue,
                prefix=True,
                keys_only=True,
                max_create_revision=attempt.revision - 1,
                sort_target=SortTarget.CREATE,
                sort_order=SortOrder.DESCEND,
                limit=request.max_leases + 1,
            )
        )
        if len(seen.kvs) + request.count <= request.max_leases:
            return None  # room now: try again
        if len(seen.kvs) > request.max_leases:
            first = seen.kvs[0]
            return _Awaited(
                seen.revision,
                first.key,
                first.create_revision,
                touched=first.mod_revision,
                with_puts=True,
            )
        ahead = len(seen.kvs)
        recheck: tuple[RangeOp, Callable[[RangeResult], bool]] = (
            RangeOp.of(
                queue,
                prefix=True,
                keys_only=True,
                max_create_revision=attempt.revision - 1,
                serializable=True,
            ),
            # (``count_only`` would ignore ``max_create_revision``)
            lambda found: len(found.kvs) >= ahead,
        )
        return _Awaited(seen.revision, whole_queue=True, recheck=recheck)

    async def _awaited_in_mutex(self, attempt: EtcdAttempt, queue: bytes) -> _Awaited:
        """The key just ahead of ours, as the try's transaction read it, else read now."""
        known, attempt.ahead = attempt.ahead, None
        if known is not None:
            target, target_revision, read_at = known
            return _Awaited(read_at, target, target_revision)
        seen = await self._client.range(
            RangeOp.of(
                queue,
                prefix=True,
                keys_only=True,
                max_create_revision=attempt.revision - 1,
                sort_target=SortTarget.CREATE,
                sort_order=SortOrder.DESCEND,
                limit=1,
            )
        )
        if not seen.kvs:
            return _Awaited(seen.revision)
        return _Awaited(seen.revision, seen.kvs[0].key, seen.kvs[0].create_revision)

    async def wait_for_change(self, attempt: Attempt, bound: float | None) -> None:
        """Watch the one key whose change can let this attempt in; return then or after ``bound``.

        * mutex, writer: the key just ahead (its delete);
        * reader: the last writer ahead (its delete);
        * semaphore, first in line (every earlier key is a holder): a delete
          anywhere in the queue; further back: the key just ahead, whose
          owner touches it when it gets its leases (so each release wakes
          one waiter, not the whole queue).
        """
        assert isinstance(attempt, EtcdAttempt)
        attempt.waited = True
        if attempt.interleaved:
            # Another acquire's key got between two of ours: a short random
            # pause before starting over, so two such attempts do not collide again.
            attempt.interleaved = False
            pause = random.uniform(0.002, 0.03)
            # not a retry: a random pause that breaks a tie, bounded by the caller's wait
            await asyncio.sleep(pause if bound is None else min(pause, max(bound, 0)))
            return
        session = attempt.session
        if session is None or not attempt.keys or attempt.revision == 0:
            return  # start over at once (new session or key gone)
        request = attempt.request
        queue = self._queue(request)
        awaited: _Awaited | None
        if request.family is Family.READ_WRITE:
            awaited = await self._awaited_in_read_write(attempt, queue)
        elif request.mode is Mode.LEASE:
            awaited = await self._awaited_in_semaphore(attempt, queue)
        else:
            awaited = await self._awaited_in_mutex(attempt, queue)
        if awaited is None or (awaited.target is None and not awaited.whole_queue):
            return  # room now, our key is gone, or nothing to wait for: try again
        target, target_revision = awaited.target, awaited.target_revision
        whole_queue, with_puts, touched = awaited.whole_queue, awaited.with_puts, awaited.touched
        read_at, recheck = awaited.read_at, awaited.recheck
        if target is not None:
            recheck = (
                RangeOp.of(target, serializable=True),
                lambda found: bool(found.kvs)
                and found.kvs[0].create_revision == target_revision
                and (not with_puts or found.kvs[0].mod_revision == touched),
            )
        assert recheck is not None
        if attempt.handoff:
            return  # handed the lock (see release) since the try: take it
        behind = self._peers.behind
        spot: tuple[bytes, int] | None = None
        if (
            target is not None
            and target_revision
            and attempt.listed is not None
            and (target, target_revision) not in behind
        ):
            # Nothing can stand between ``target`` and our key (a new key is
            # the newest): a release of ``target`` need only read our key.
            spot = (target, target_revision)
            behind[spot] = weakref.ref(attempt)
        try:
            await self._watch_for_change(
                attempt, session, queue, target, whole_queue, with_puts, read_at, recheck, bound
            )
        finally:
            if spot is not None:
                ref = behind.get(spot)
                if ref is not None and ref() is attempt:
                    del behind[spot]

    async def _watch_for_change(
        self,
        attempt: EtcdAttempt,
        session: _Session,
        queue: bytes,
        target: bytes | None,
        whole_queue: bool,
        with_puts: bool,
        read_at: int,
        recheck: tuple[RangeOp, Callable[[RangeResult], bool]],
        bound: float | None,
    ) -> None:
        # The watch starts from *now*, not from ``read_at + 1``: etcd serves a
        # watch whose start revision is already in its history from a loop
        # that catches such "unsynced" watches up only every 100 ms, so the
        # event we wait for would come up to 100 ms late (in a busy queue,
        # other keys are written between our read and the watch, nearly
        # always). A watch from now is served at once, but sees only changes
        # after the revision it was created at; if that is past ``read_at``,
        # one read (at a revision at least that one) tells whether what we
        # wait for already changed in between.
        if whole_queue:
            watch = await self._client.watch(queue, prefix=True, no_put=True)
        else:
            assert target is not None
            watch = await self._client.watch(target, no_put=not with_puts)
        # One future ends the wait: set by the watch's next delivery (an event
        # or an error), by the session's loss, or by a handoff (``release``);
        # no task per wait, and no event-loop turns to wind tasks down after.
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        attempt.woken = wake
        try:
            if watch.created_revision > read_at and not attempt.handoff:
                op, unchanged = recheck
                found = await self._client.range(op)
                if found.revision < watch.created_revision:
                    # A member behind the one that created the watch answered.
                    found = await self._client.range(dataclasses.replace(op, serializable=False))
                if not unchanged(found):
                    return  # it changed before the watch began: try again
            if attempt.handoff or session.lost.is_set():
                return  # handed the lock, or the session went, while the watch was created
            watch._wake_on_delivery(wake)
            session.wakers.add(wake)
            async with asyncio.timeout(bound):
                await wake
        except TimeoutError:
            pass
        finally:
            attempt.woken = None
            session.wakers.discard(wake)
            await watch.aclose()

    async def abandon(self, attempt: Attempt) -> None:
        """Delete the attempt's keys; tombstone them first if a try was unanswered.

        A tombstone lives on a short lease of its own (twice the request
        timeout: no transaction sent before it can arrive later than that),
        so nothing has to come back to remove it.
        """
        assert isinstance(attempt, EtcdAttempt)
        self._unlist(attempt)  # no release may hand it the lock any more
        keys, session = attempt.keys, attempt.session
        if not keys or session is None:
            return
        if attempt.unanswered:
            ttl = max(1, math.ceil(2 * self._options.request_timeout))
            lease = await self._client.lease_grant(ttl)
            await self._client.txn(
                [],
                [
                    *(PutOp.of(self._tombstone(key), b"", lease=lease.id) for key in keys),
                    *(DeleteOp.of(key) for key in keys),
                ],
                [],
                retry=True,
            )
        else:
            await self._drop_keys(keys)
            if attempt.request.count == 1:
                self._give_back(self._queue(attempt.request), attempt.attempt_id)
        attempt.keys = []

    def finish(self, attempt: Attempt) -> None:
        """Take the attempt off the waiting list (each wait closed its own watch)."""
        assert isinstance(attempt, EtcdAttempt)
        self._unlist(attempt)
        attempt.downgrade = None

    async def release(self, grant: Grant) -> bool:
        """Delete the key only if its create revision is still ours; ``False`` otherwise."""
        hold = grant.handle
        assert isinstance(hold, _Hold)
        hold.releasing = True
        timer, hold.watch_timer = hold.watch_timer, None
        if timer is not None:
            timer.cancel()
            self._timers.discard(timer)
        task, hold.watch_task = hold.watch_task, None
        if task is not None:
            task.cancel()
        hold.session.grants.discard(grant)
        # Direct handoff: when an exclusive attempt of an etcd backend of this
        # process waits in this queue, the release also reads the head of the
        # queue after its delete. The released key was the owner (the lowest
        # of the queue), so if the delete went through, the key the read
        # finds is the owner as of this transaction: when it belongs to a
        # waiting attempt of this process (its name carries its session's
        # lease, see ``_hand_off``), that attempt takes the lock without the
        # watch event and without a transaction of its own. The read of its
        # key closes the hole of etcd's own recipe (a lock taken on a key whose
        # lease ended): a key that went is not found.
        queue = hold.queue
        success: list[DeleteOp | RangeOp] = [DeleteOp.of(hold.key)]
        peers = self._peers
        handing = bool(queue) and queue in peers.waiting
        if handing:
            # The attempt waiting right behind this key, when one of this
            # process does, is the next owner if its key is still there: a
            # read of that one key is cheaper than of the head (which etcd
            # finds by sorting the whole queue).
            ref = peers.behind.get((hold.key, hold.revision))
            follower = ref() if ref is not None else None
            next_key = follower.listed if follower is not None else None
            if next_key is not None:
                success.append(RangeOp.of(next_key))
            else:
                success.append(self._queue_reads(queue, 1, True)[0])
        result = await self._client.txn(
            [Compare.create_revision(hold.key, "==", hold.revision)],
            success,
            [],
            retry=True,
        )
        if handing and result.succeeded:
            self._hand_off(queue, result)
        slot, hold.slot = hold.slot, None
        if slot is not None:
            self._give_back(queue, slot)  # the key is gone (or was not ours)
        return result.succeeded and not grant.lost

    def _hand_off(self, queue: bytes, result: TxnResult) -> None:
        """Hand the lock to the attempt whose key the release found (the new owner), if ours.

        "Ours": an attempt of a live etcd driver of this process on the same
        cluster and prefix, listed as waiting with that very key and create
        revision, on the session the driver still considers live. Anything
        else (a waiter of another process, an attempt that abandoned,
        started over, won on its own or lost its session) is left to its
        watch. The attempt may also have stopped waiting meanwhile (the
        watch event of the same delete can come first): its next try then
        takes the lock without a transaction, or its own read already did.
        """
        found = result.responses[1] if len(result.responses) > 1 else None
        if not isinstance(found, RangeResult) or not found.kvs:
            return  # nobody left in the queue
        head = found.kvs[0]
        lease = _lease_of(head.key, queue)
        if lease is None:
            return
        driver = self._peers.by_lease.get(lease)
        if driver is not None:
            driver._handed(head.key, head.create_revision)

    def _handed(self, key: bytes, revision: int) -> None:
        """A release found ``key`` (created at ``revision``) at the head of its queue."""
        attempt = self._queued.get(key)
        if attempt is None or attempt.revision != revision or attempt.keys != [key]:
            return
        session = attempt.session
        if session is None or session is not self._session or session.lost.is_set():
            return  # the session went: the attempt starts over on its own
        attempt.handoff = revision
        woken = attempt.woken
        if woken is not None and not woken.done():
            woken.set_result(None)

    def _deleted(self, grant: Grant, hold: _Hold, how: str) -> None:
        if not hold.releasing:
            grant.mark_lost(f"etcd key {hold.key!r} {how}")
            hold.session.grants.discard(grant)

    def _start_loss_watch(self, grant: Grant, hold: _Hold) -> None:
        timer, hold.watch_timer = hold.watch_timer, None
        if timer is not None:
            self._timers.discard(timer)
        if hold.releasing or grant.lost or self._closing:
            return
        hold.watch_task = self._watcher(
            self._watch_hold(grant, hold), f"aiolocks-etcd-hold-{hold.key!r}"
        )

    async def _watch_hold(self, grant: Grant, hold: _Hold) -> None:
        start = hold.revision + 1
        while not hold.releasing and not grant.lost:
            try:
                watch = await self._client.watch(hold.key, start_revision=start, no_put=True)
            except BackendUnavailableError:
                return  # the session deadline still bounds the hold
            try:
                while True:
                    try:
                        response = await anext(watch)
                    except BackendUnavailableError:
                        continue  # the stream keeps trying; the session deadline bounds the hold
                    for event in response.events:
                        if event.type is EventType.DELETE:
                            self._deleted(
                                grant,
                                hold,
                                f"was deleted behind our back (revision {event.kv.mod_revision})",
                            )
                            return  # the key is gone either way: nothing more to watch
            except StopAsyncIteration:
                return
            except CompactedError:
                # The history we watched from is gone: is the key still ours?
                with contextlib.suppress(BackendUnavailableError):
                    found = await self._client.range(RangeOp.of(hold.key))
                    if not found.kvs or found.kvs[0].create_revision != hold.revision:
                        self._deleted(grant, hold, "was gone when its watch was compacted")
                        return
                    _log.info(
                        "etcd history of %r was compacted; the key is still ours, watching on",
                        hold.key,
                    )
                    start = found.revision + 1
            finally:
                await watch.aclose()

    # -- operations

    def records(self) -> EtcdRecords:
        """The record store under the coordination recipes (groups, latches, ``once``)."""
        return self._records

    def admin(self) -> EtcdAdmin:
        """Listing and force-release (``aiolocks list``/``break``)."""
        from ._admin import EtcdAdmin

        return EtcdAdmin(self)

    async def diagnose(self) -> Diagnosis:
        """``backend.doctor()``'s findings for this cluster (see :mod:`._doctor`)."""
        from ._doctor import diagnose_etcd

        return await diagnose_etcd(self)

    # -- introspection

    async def participants(self, name: str, family: Family) -> list[Participant]:
        """Holders first, then waiters, in queue order."""
        result = await self._client.range(
            self._queue_of(name, family),
            prefix=True,
            sort_target=SortTarget.CREATE,
            sort_order=SortOrder.ASCEND,
        )
        found: list[Participant] = []
        writer_seen = False
        for index, kv in enumerate(_ordered(result.kvs)):
            kind = _kind(kv.key).decode("ascii", "replace")
            if kind.startswith("r"):
                holder = not writer_seen
                kind = "r"
            elif kind.startswith("l"):
                holder = index < int(kind[1:] or "1")
                kind = "l"
            else:
                holder = index == 0
                writer_seen = writer_seen or kind == "w"
            found.append(
                Participant(
                    id=kv.value.decode("utf-8", "replace"),
                    is_holder=holder,
                    fencing_token=kv.create_revision,
                    mode=_MODE_NAME.get(kind, "exclusive"),
                    node=kv.key.decode("utf-8", "replace"),
                )
            )
        return sorted(found, key=lambda p: not p.is_holder)
