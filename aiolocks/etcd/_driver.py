"""DRAFT, NOT ACTIVE: the etcd driver, written against the attempt-lifecycle driver contract.

Nothing imports this module: ``aiolocks.connect()`` does not know ``etcd://``
yet. The driver follows the attempt-lifecycle contract of
``aiolocks._core.driver`` (``begin`` / ``try_once`` / ``wait_for_change`` /
``abandon`` / ``finish`` / ``release -> bool``; :class:`EtcdAttempt` is an
``Attempt``). What is left: wire ``etcd://`` into ``connect()`` (a backend
over :class:`EtcdDriver`) and run the conformance and fault-injection suites
against it. Until then the recipe is exercised directly by
``tests/etcd/test_driver_draft.py``.

Known gaps of the draft: ``request.count > 1`` (several semaphore leases in
one acquire) and ``request.downgrade_of`` are refused with a clear error;
semaphore waiters watch the whole queue for deletes (a herd) instead of one
key each.

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
  "win").
* **Try** = one transaction: ``If(create_revision(key) == 0 and
  create_revision(tombstone) == 0) Then(Put(key, lease), Range(queue))
  Else(Range(key), Range(queue))``. The owner is the lowest create
  revision (first ``max_leases`` for a semaphore; readers wait only for
  earlier writers). The fencing token is the key's create revision.
* **Wait** = a watch on the one key to wait for (the last earlier key; for a
  reader, the last earlier writer), from the revision of the read that saw
  it, so a delete in between is not missed. The next try reads its own key
  again: a waiter whose key went with its lease starts over in a new session
  rather than claiming the lock (the Go recipe could return a lock after its
  lease had expired, and kept waiting on a dead session).
* **Release** deletes only if the create revision is still ours, so a
  stale, repeated release can never delete a newer holder's key.
* **Prompt loss.** Each hold watches its own key from its create revision;
  a delete behind our back (revoke, ``etcdctl del``) marks it lost at once.
* **Abandon** deletes the attempt's key; when a try was unanswered, it
  first writes a tombstone key (outside every queue) that the late
  transaction's compare refuses, and removes it after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final

from .._core.driver import Attempt, Capabilities, Family, Grant, Mode, Request
from .._core.errors import BackendUnavailableError
from .._core.participants import Participant
from .._core.tasks import TaskSet
from ._client import (
    Compare,
    DeleteOp,
    EtcdClient,
    EventType,
    KeyValue,
    LeaseKeepAlive,
    LeaseNotFoundError,
    PutOp,
    RangeOp,
    RangeResult,
    SortOrder,
    SortTarget,
)
from ._url import EtcdOptions

__all__ = ["EtcdAttempt", "EtcdDriver"]

_log = logging.getLogger("aiolocks.etcd")

_KIND: Final = {Mode.EXCLUSIVE: "x", Mode.LEASE: "l", Mode.READ: "r", Mode.WRITE: "w"}
_MODE_NAME: Final = {"x": "exclusive", "l": "lease", "r": "read", "w": "write"}
# Tombstones live outside every queue (queues start with a family name).
_TOMBSTONES: Final = b"\x00abandoned\x00"

Spawn = Callable[[Coroutine[Any, Any, None], str], object]


class _Session:
    """One lease, its keep-alive, and the grants that live on it."""

    __slots__ = ("grants", "keeper", "lease_id", "lost", "lost_reason")

    def __init__(self, lease_id: int, keeper: LeaseKeepAlive) -> None:
        self.lease_id = lease_id
        self.keeper = keeper
        self.grants: set[Grant] = set()
        self.lost = asyncio.Event()
        self.lost_reason = ""


class _Hold:
    """The driver handle of a grant: its key, create revision, session, loss watch."""

    __slots__ = ("key", "releasing", "revision", "session", "watch_task")

    def __init__(self, key: bytes, revision: int, session: _Session) -> None:
        self.key = key
        self.revision = revision
        self.session = session
        self.releasing = False
        self.watch_task: asyncio.Task[None] | None = None


class EtcdAttempt(Attempt):
    """One acquire attempt.

    ``attempt_id`` is minted in ``begin``; the key is bound to the session's
    lease at the first try and re-bound if the session changes.
    """

    __slots__ = (
        "attempt_id",
        "key",
        "predecessor",
        "read_revision",
        "revision",
        "session",
        "unanswered",
    )

    def __init__(self, request: Request, attempt_id: str) -> None:
        super().__init__(request)
        self.attempt_id = attempt_id
        self.key: bytes | None = None
        self.session: _Session | None = None
        self.revision = 0
        self.predecessor: bytes | None = None
        self.read_revision = 0
        self.unanswered = False


class EtcdDriver:
    """The etcd driver (draft; see the module docstring)."""

    capabilities = Capabilities(fair=True, queue_visible=True, can_lose=True)

    def __init__(
        self,
        options: EtcdOptions,
        *,
        client: EtcdClient | None = None,
        spawn: Spawn | None = None,
    ) -> None:
        self._options = options
        self._owns_client = client is None
        self._client = client or EtcdClient(
            list(options.endpoints),
            connect_timeout=options.connect_timeout,
            request_timeout=options.request_timeout,
        )
        root = f"{options.prefix}/" if options.prefix else ""
        self._root = root.encode()
        self._spawn_hook = spawn
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: _Session | None = None
        self._session_lock = asyncio.Lock()

    # -- plumbing

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

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None] | None:
        if self._spawn_hook is not None:
            spawned = self._spawn_hook(coro, name)
            return spawned if isinstance(spawned, asyncio.Task) else None
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _tombstone(self, key: bytes) -> bytes:
        return self._root + _TOMBSTONES + key[len(self._root) :]

    def _queue(self, request: Request) -> bytes:
        return self._root + f"{request.family.value}\x00{request.name}\x00".encode()

    async def open(self, tasks: TaskSet | None = None) -> None:
        """Connect and start the first session; ``BackendUnavailableError`` in time.

        Background work (hold watches, tombstone removal) goes into the
        engine's ``tasks`` when given.
        """
        if tasks is not None and self._spawn_hook is None:
            self._spawn_hook = lambda coro, name: tasks.spawn(coro, name=name)
        await self._client.connect()
        await self._live_session()

    async def close(self) -> None:
        """Revoke the session lease (its keys go at once) and disconnect."""
        session, self._session = self._session, None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if session is not None:
            with contextlib.suppress(BackendUnavailableError):
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
            )
            session = _Session(grant.id, keeper)
            holder.append(session)
            self._session = session
            return session

    def _session_renewed(self, session: _Session, deadline: float) -> None:
        for grant in session.grants:
            grant.valid_until = deadline  # loop.time() is time.monotonic() here
            grant.note_renewed()

    def _session_lost(self, session: _Session, reason: str) -> None:
        session.lost_reason = reason
        session.lost.set()
        if self._session is session:
            self._session = None
        grants, session.grants = list(session.grants), set()
        for grant in grants:
            grant.mark_lost(f"the etcd session lease {session.lease_id:x} ended: {reason}")

    # -- the attempt lifecycle

    def begin(self, request: Request) -> EtcdAttempt:
        """Mint the attempt id (no I/O)."""
        if request.count != 1:
            raise ValueError("the etcd driver draft takes one lease per acquire (count=1)")
        if request.downgrade_of is not None:
            raise ValueError("the etcd driver draft does not downgrade write holds yet")
        return EtcdAttempt(request, secrets.token_hex(8))

    async def try_once(self, attempt: EtcdAttempt) -> list[Grant] | None:
        """One transaction: create the attempt's key if absent and read the queue."""
        request = attempt.request
        session = await self._live_session()
        if attempt.session is not session:
            attempt.session = session
            kind = _KIND[request.mode]
            if request.mode is Mode.LEASE:
                kind += str(request.max_leases)  # participants() needs N
            attempt.key = self._queue(request) + (
                f"{session.lease_id:016x}/{attempt.attempt_id}.{kind}".encode()
            )
            attempt.revision = 0
        key = attempt.key
        assert key is not None
        queue = self._queue(request)
        head_limit = request.max_leases if request.mode is Mode.LEASE else 1
        if request.mode is Mode.READ:
            head_limit = 0  # a reader needs every earlier key to find writers
        head = RangeOp.of(
            queue,
            prefix=True,
            limit=head_limit,
            keys_only=True,
            sort_target=SortTarget.CREATE,
            sort_order=SortOrder.ASCEND,
        )
        attempt.unanswered = True
        try:
            result = await self._client.txn(
                [
                    Compare.create_revision(key, "==", 0),
                    Compare.create_revision(self._tombstone(key), "==", 0),
                ],
                [PutOp.of(key, request.participant, lease=session.lease_id), head],
                [RangeOp.of(key), head],
                retry=True,
            )
        except LeaseNotFoundError:
            attempt.unanswered = False
            self._session_lost(session, "etcd said the lease does not exist")
            return None
        attempt.unanswered = False
        if result.succeeded:
            attempt.revision = result.revision
        else:
            mine = result.responses[0]
            assert isinstance(mine, RangeResult)
            if not mine.kvs:
                # Our key is gone (its lease ended, or deleted behind our back),
                # or the tombstone is there: never claim anything, start over.
                attempt.session = None
                return None
            attempt.revision = mine.kvs[0].create_revision
        ranked = result.responses[1]
        assert isinstance(ranked, RangeResult)
        if self._wins(request, key, ranked.kvs):
            hold = _Hold(key, attempt.revision, session)
            grant = Grant(request, attempt.revision, hold)
            grant.valid_until = session.keeper.deadline
            session.grants.add(grant)
            # No await between "won" and the return (contract).
            hold.watch_task = self._spawn(
                self._watch_hold(grant, hold), f"aiolocks-etcd-hold-{key!r}"
            )
            attempt.key = None  # the key now belongs to the grant, not the attempt
            return [grant]
        return None

    def _wins(self, request: Request, key: bytes, head: tuple[KeyValue, ...]) -> bool:
        keys = [kv.key for kv in head]
        if request.mode is Mode.READ:
            for other in keys:
                if other == key:
                    return True
                if other.endswith(b".w"):
                    return False
            return False
        return key in keys

    async def wait_for_change(self, attempt: EtcdAttempt, bound: float | None) -> None:
        """Watch the one key this attempt waits for; return on its delete or after ``bound``."""
        session = attempt.session
        if session is None or attempt.key is None or attempt.revision == 0:
            return  # start over at once (new session or key gone)
        request = attempt.request
        queue = self._queue(request)
        before = await self._client.range(
            RangeOp.of(
                queue,
                prefix=True,
                keys_only=True,
                max_create_revision=attempt.revision - 1,
                sort_target=SortTarget.CREATE,
                sort_order=SortOrder.DESCEND,
                limit=0 if request.mode in (Mode.READ, Mode.LEASE) else 1,
            )
        )
        target: bytes | None = None
        if request.mode is Mode.READ:
            target = next((kv.key for kv in before.kvs if kv.key.endswith(b".w")), None)
        elif before.kvs:
            target = before.kvs[0].key
        if target is None:
            return  # nothing to wait for any more: try again
        if request.mode is Mode.LEASE:
            watch = await self._client.watch(
                queue, prefix=True, start_revision=before.revision + 1, no_put=True
            )
        else:
            watch = await self._client.watch(
                target, start_revision=before.revision + 1, no_put=True
            )
        try:
            async with asyncio.timeout(bound):
                lost = asyncio.ensure_future(session.lost.wait())
                nxt = asyncio.ensure_future(anext(aiter(watch)))
                try:
                    await asyncio.wait({lost, nxt}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for future in (lost, nxt):
                        future.cancel()
                    await asyncio.gather(lost, nxt, return_exceptions=True)
        except TimeoutError:
            pass
        finally:
            await watch.aclose()

    async def abandon(self, attempt: EtcdAttempt) -> None:
        """Delete the attempt's key; tombstone it first if a try was unanswered."""
        key, session = attempt.key, attempt.session
        if key is None or session is None:
            return
        if attempt.unanswered:
            try:
                await self._client.txn(
                    [],
                    [
                        PutOp.of(self._tombstone(key), b"", lease=session.lease_id),
                        DeleteOp.of(key),
                    ],
                    [],
                    retry=True,
                )
            except LeaseNotFoundError:
                return  # the lease is gone and its keys with it
            self._spawn(self._drop_tombstone(self._tombstone(key)), "aiolocks-etcd-tombstone")
        else:
            await self._client.delete(key)
        attempt.key = None

    async def _drop_tombstone(self, tombstone: bytes) -> None:
        # After twice the request timeout no transaction sent before the
        # tombstone can still arrive (its deadline made the client give up).
        await asyncio.sleep(2 * self._options.request_timeout)
        with contextlib.suppress(BackendUnavailableError):
            await self._client.delete(tombstone)

    def finish(self, attempt: EtcdAttempt) -> None:
        """Nothing local outlives a wait in this draft (each wait closes its watch)."""
        attempt.predecessor = None

    async def release(self, grant: Grant) -> bool:
        """Delete the key only if its create revision is still ours; ``False`` otherwise."""
        hold = grant.handle
        assert isinstance(hold, _Hold)
        hold.releasing = True
        task, hold.watch_task = hold.watch_task, None
        if task is not None:
            task.cancel()
        hold.session.grants.discard(grant)
        result = await self._client.txn(
            [Compare.create_revision(hold.key, "==", hold.revision)],
            [DeleteOp.of(hold.key)],
            [],
            retry=True,
        )
        return result.succeeded and not grant.lost

    async def _watch_hold(self, grant: Grant, hold: _Hold) -> None:
        if hold.releasing:
            return
        try:
            watch = await self._client.watch(hold.key, start_revision=hold.revision + 1)
        except BackendUnavailableError:
            return  # the session deadline still bounds the hold
        try:
            async for response in watch:
                for event in response.events:
                    if event.type is not EventType.DELETE:
                        continue
                    if not hold.releasing:
                        grant.mark_lost(
                            f"etcd key {hold.key!r} was deleted behind our back "
                            f"(revision {event.kv.mod_revision})"
                        )
                        hold.session.grants.discard(grant)
                    return  # the key is gone either way: nothing more to watch
        finally:
            await watch.aclose()

    # -- introspection

    async def participants(self, name: str, family: Family) -> list[Participant]:
        """Holders first, then waiters, in create-revision order."""
        queue = self._root + f"{family.value}\x00{name}\x00".encode()
        result = await self._client.range(
            queue, prefix=True, sort_target=SortTarget.CREATE, sort_order=SortOrder.ASCEND
        )
        found: list[Participant] = []
        writer_seen = False
        for index, kv in enumerate(result.kvs):
            kind = kv.key.rsplit(b".", 1)[-1].decode()
            if kind == "r":
                holder = not writer_seen
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
