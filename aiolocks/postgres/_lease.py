"""The PostgreSQL driver, ``mode=lease``: a row per hold in the lease table.

Design note
-----------
Every statement is one short transaction on a pooled connection (an asyncpg
pool, which may sit behind a transaction-pooling proxy: nothing depends on
the server session). Statements are prepared (asyncpg's statement cache)
only when the listener's probe found the server itself where the pool
connects; a connection going back to the pool is not reset (nothing of ours
stays on it, see :func:`_keep_session`), and a few answered connections are
kept checked out between statements (see :meth:`PostgresLeaseDriver._put`).
``begin`` mints the owner id of the attempt (``<participant>#<random><n>``);
the acquire function takes a hold in one statement (serialized per name by
a transaction-level advisory lock, expired rows purged, the mode's rule
checked, the fencing row bumped, the row inserted).

* **Cancellation.** The connection of an unanswered acquire stays with the
  attempt; ``abandon`` deletes every row of the attempt's owner on that same
  connection, after the cancelled statement (one client connection keeps its
  order, through a proxy too), so a late grant cannot survive the cleanup.
* **Renewal.** A timer per hold fires every third of ``lease_time`` and
  renews in a short owned task; the renewal matches owner and epoch, so a
  row deleted or taken over behind our back is a loss at the next renewal.
  ``Grant.valid_until`` follows the last successful renewal.
* **Waiting.** A listener connection ``LISTEN``s on the release channel (each
  release and abandon sends ``NOTIFY`` with the name in its own statement); a
  waiter wakes on a notification for its name. A holder that crashed sends
  nothing and its row lapses after at most ``lease_time``: a waiter also
  tries again after ``lease_time`` (the longest a live row can have left).
  ``LISTEN`` needs a real session: behind a transaction pooler the listener
  must connect to the server directly (``listen_url``); without one, waits
  end only at that ``lease_time`` bound.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast, final

import asyncpg

from .._core.doctor import Diagnosis
from .._core.driver import Attempt, Capabilities, Family, Grant, Mode, Request
from .._core.errors import BackendUnavailableError, LockError
from .._core.options import check_portable_options
from .._core.participants import Participant
from .._core.tasks import TaskSet, wait_done, wait_finished
from ._errors import REFUSED, denied
from ._errors import TRANSIENT as _TRANSIENT
from ._sql import LeaseQueries, TableNames, advisory_key, ensure_schema, probe_session
from ._state import ConnectionState, StateBroadcaster

if TYPE_CHECKING:
    from ._admin import PostgresLeaseAdmin
    from ._records import PostgresRecords

__all__ = ["PostgresLeaseDriver", "pool_options"]

logger = logging.getLogger("aiolocks.postgres")


_MODES = {Mode.EXCLUSIVE: "exclusive", Mode.WRITE: "write", Mode.READ: "shared"}

#: a connection the server ended between two of our statements can surface as
#: a client protocol error on the next one; the connection is unusable either way
_BROKEN: tuple[type[BaseException], ...] = (*_TRANSIENT, asyncpg.exceptions.InternalClientError)

#: pool connections the driver keeps checked out between its statements (at
#: most the pool's size - 1, so that admin calls and the doctor still get one)
_KEEP_IDLE = 4


async def _return_quietly(pool: Any, conn: Any) -> None:
    """Hand ``conn`` back to ``pool``; a connection that died meanwhile is the pool's business.

    asyncpg resets a returned connection; when the server ended it (or the
    backend is closing and terminated the pool), the reset fails and asyncpg
    has already closed it and freed its slot: nothing to report.

    The hand-back runs to its end even when the caller is cancelled (the
    backend's close cancels its tasks before it terminates the pool).
    ``Pool.release`` shields its work from cancellation, but a cancelled
    caller detaches from it, so an error of that work would go unretrieved:
    asyncpg 0.29 fails the reset of a connection the pool terminated
    meanwhile with an ``AttributeError`` that the event loop then reports.
    """
    release = asyncio.ensure_future(pool.release(conn))
    cancelled = await wait_finished(release)
    try:
        release.result()
    except (*_TRANSIENT, asyncpg.InterfaceError) as exc:
        logger.debug("a lease connection was gone when handed back: %r", exc)
    if cancelled is not None:
        raise cancelled


async def _keep_session(_conn: Any) -> None:
    """The lease pool's reset: nothing beyond what asyncpg always does.

    A connection going back to the pool is reset by default with ``RESET
    ALL; UNLISTEN *; CLOSE ALL; pg_advisory_unlock_all()``: one more round
    trip per statement of this driver. Nothing of that is ever left on a
    lease connection: its only lock is the acquire function's
    transaction-level one (gone with the statement), it never ``LISTEN``s
    (the listener is a connection of its own), sets nothing and opens no
    cursor. asyncpg still rolls back a transaction left open (a cancelled
    downgrade) before it calls this.
    """


def pool_options() -> dict[str, Any]:
    """``asyncpg.create_pool`` keywords of the lease pool (the reset above, asyncpg >= 0.30)."""
    if "reset" in inspect.signature(asyncpg.create_pool).parameters:
        return {"reset": _keep_session}
    return {}


def _open(conn: Any) -> bool:
    """``conn`` (a pool's connection proxy) is still checked out to us and open.

    When its server session ends, asyncpg's pool takes the connection back by
    itself, and the proxy then raises on every call.
    """
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


def _fencing_name(request: Request) -> str:
    return f"{request.family.value}/{request.name}"


class _LeaseAttempt(Attempt):
    __slots__ = ("conn", "fence", "grants", "owner", "refused_unwritten", "unanswered", "waiter")

    def __init__(self, request: Request, owner: str) -> None:
        super().__init__(request)
        self.owner = owner
        #: the name's row name, ``"<family>/<name>"``
        self.fence = _fencing_name(request)
        self.conn: Any = None
        self.unanswered = False
        #: the server refused the try's first statement (a privilege): PostgreSQL
        #: rolled it back, and earlier tries left no rows, so none is ours
        self.refused_unwritten = False
        self.grants: list[Grant] | None = None
        #: set by the next release NOTIFY of the name (armed before each try)
        self.waiter: asyncio.Future[None] | None = None


@final
class _LeaseHold:
    """``Grant.handle``: the row of one hold and its renewal timer."""

    __slots__ = ("name", "owner", "released", "slot", "timer")

    def __init__(self, name: str, slot: int, owner: str) -> None:
        self.name = name
        self.slot = slot
        self.owner = owner
        self.released = False
        self.timer: asyncio.TimerHandle | None = None

    def stop(self) -> None:
        self.released = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


@final
class PostgresLeaseDriver:
    """Lease-table driver (see the module docstring)."""

    capabilities = Capabilities(fair=False, queue_visible=False, can_lose=True)

    def __init__(
        self,
        make_pool: Callable[[bool], Awaitable[Any]],
        *,
        describe: str,
        lease_time: float,
        tables: TableNames,
        create_tables: bool,
        listen: Callable[[], Awaitable[Any]] | None,
        listen_is_pool_target: bool = False,
    ) -> None:
        #: ``make_pool(prepared)``: the statement pool; ``prepared``: with
        #: asyncpg's statement cache (only when no pooler is in the way)
        self._make_pool = make_pool
        #: the listener connects where the pool does: its probe speaks for both
        self._listen_is_pool_target = listen_is_pool_target
        self._describe = describe
        self._lease_time = float(lease_time)
        self._tables = tables
        self._create_tables = create_tables
        self._listen = listen
        self._queries = LeaseQueries.build(tables)
        self._pool: Any = None
        #: answered pool connections kept for the next statement (see :meth:`_put`)
        self._idle: list[Any] = []
        self._keep = 0
        #: owner ids: ``<participant>#<this tag><counter>`` (see :meth:`begin`)
        self._owner_tag = secrets.token_hex(8)
        self._minted = 0
        self._listener: Any = None
        self._owned: TaskSet | None = None
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._closed = False
        #: the connection state (see :mod:`._state`): the statement pool's health
        self.states = StateBroadcaster()
        #: the record store (:meth:`records`), made on first use
        self._records: PostgresRecords | None = None

    def describe(self) -> str:
        """``postgresql://host:port/db`` without credentials."""
        return self._describe

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        """The portable ``fair``/``lease_time``/``watchdog``; ``lease_time`` sets the row's TTL."""
        return check_portable_options(family, options, self._describe)

    def _unavailable(self, exc: BaseException, what: str) -> LockError:
        refused = denied(exc, what, self._describe)
        if refused is not None:
            return refused
        if self.states.state is not None and not self._closed:
            self.states.set(ConnectionState.SUSPENDED)
        return BackendUnavailableError(f"PostgreSQL {self._describe}: {what} failed: {exc!r}")

    async def open(self, tasks: TaskSet) -> None:
        """Create the pool, make sure the tables exist, start listening for releases."""
        self._owned = tasks
        listener: Any = None
        try:
            # Statements are prepared (asyncpg's statement cache: one round
            # trip each instead of two) only when the listener's probe found
            # the server itself where the pool connects; a transaction pooler
            # cannot keep a prepared statement per client.
            prepared = False
            if self._listen is not None:
                listener = await self._listen()
                probe = await probe_session(listener, statements=2)
                if probe.pooled:
                    # LISTEN needs a session of its own: waits end at lease_time.
                    logger.warning(
                        "%s: %s; not listening for releases (waiters retry every "
                        "lease_time); give listen_url= a direct connection",
                        self._describe,
                        probe.describe(),
                    )
                    listener.terminate()
                    listener = None
                else:
                    prepared = self._listen_is_pool_target
            self._pool = await self._make_pool(prepared)
            max_size = getattr(self._pool, "get_max_size", None)
            if callable(max_size):
                self._keep = max(0, min(_KEEP_IDLE, int(max_size()) - 1))
            async with self._pool.acquire() as conn:
                await ensure_schema(conn, self._tables, create=self._create_tables)
            if listener is not None:
                await listener.add_listener(self._tables.channel, self._on_notify)
                self._listener, listener = listener, None
        except (*_BROKEN, *REFUSED) as exc:
            raise self._unavailable(exc, "connect") from exc
        finally:
            if listener is not None:
                listener.terminate()
        self.states.connected()

    def records(self) -> PostgresRecords:
        """The record store under the coordination recipes (one per driver; no I/O)."""
        if self._records is None:
            from ._records import LeaseLink, PostgresRecords

            self._records = PostgresRecords(LeaseLink(self), self._tables)
        return self._records

    async def close(self) -> None:
        """Close the listener and the pool (rows of released holds are gone already).

        This backend's ephemeral records are deleted first (an orderly leave).
        """
        if self._records is not None and not self._closed:
            await self._records.close()
        self._closed = True
        self.states.close()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.terminate()
        self._idle = []  # (terminated with the pool)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()

    # -- connections --------------------------------------------------------

    async def _connection(self) -> Any:
        """A pool connection for one statement: a kept one (no await) or a new checkout."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if _open(conn):
                return conn
            self._return(conn)  # (the pool frees a closed connection's slot)
        return await self._pool.acquire()

    def _put(self, conn: Any) -> None:
        """Keep a connection whose statements were all answered, or hand it back to the pool.

        Kept connections skip the pool's checkout and return (a task and a
        timer each) on the next statement; one in a transaction (a cancelled
        downgrade) or closed goes back to the pool, whose release rolls back
        or drops it.
        """
        if len(self._idle) < self._keep and not self._closed:
            try:
                # (a closed one is dropped at the next checkout; one the pool
                # took back, its session ended, raises here)
                idle = not conn.is_in_transaction()
            except asyncpg.InterfaceError:
                idle = False
            if idle:
                self._idle.append(conn)
                return
        self._return(conn)

    def _return(self, conn: Any) -> None:
        """Hand ``conn`` back to the pool in an owned task (closing: the pool ends it)."""
        if self._owned is not None and self._pool is not None:
            self._owned.spawn(_return_quietly(self._pool, conn), name="aiolocks-pg-release-conn")

    def _arm(self, name: str) -> asyncio.Future[None]:
        """The future the next release NOTIFY of ``name`` sets (shared by its waiters)."""
        waiter = self._waiters.get(name)
        if waiter is None or waiter.done():
            waiter = self._waiters[name] = asyncio.get_running_loop().create_future()
        return waiter

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        waiter = self._waiters.pop(payload, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- attempts ---------------------------------------------------------

    def _ttl(self, request: Request) -> float:
        value = request.options.get("lease_time")
        return float(value) if isinstance(value, int | float) else self._lease_time

    def begin(self, request: Request) -> Attempt:
        """Mint the owner id of every row this attempt may write."""
        # unique per attempt: a random part per driver and a counter
        self._minted += 1
        owner = f"{request.participant}#{self._owner_tag}{self._minted:x}"
        return _LeaseAttempt(request, owner)

    async def try_once(self, attempt: Attempt) -> list[Grant] | None:
        """One call of the acquire function per wanted hold (all or nothing)."""
        a = cast(_LeaseAttempt, attempt)
        if a.grants is not None:
            return a.grants
        request = a.request
        name = a.fence
        key = advisory_key("lease", name)
        ttl = self._ttl(request)
        if request.mode is Mode.LEASE:
            mode, slots = "slots", request.max_leases
        else:
            mode, slots = _MODES[request.mode], 1
        downgrade = request.downgrade_of
        if downgrade is not None and isinstance(downgrade.handle, _LeaseHold):
            return await self._downgrade(a, downgrade, key, ttl)
        rows: list[Any] = []
        if self._pool is None:
            raise BackendUnavailableError(f"backend {self._describe} is closed")
        # Armed before the try: a release between our "no" and the wait is not missed.
        a.waiter = self._arm(name)
        try:
            if a.conn is None:
                a.conn = await self._connection()
            sent = time.monotonic()
            for _ in range(request.count):
                a.unanswered = True
                row = await a.conn.fetchrow(
                    self._queries.acquire, name, key, a.owner, mode, slots, ttl
                )
                a.unanswered = False
                if row is None:
                    break
                rows.append(row)
        except (*_BROKEN, *REFUSED) as exc:
            a.refused_unwritten = not rows and isinstance(exc, REFUSED)
            raise self._unavailable(exc, "lease acquire") from exc
        self.states.connected()  # the statements went through
        if len(rows) < request.count:
            if rows:
                await self._abandon_rows(a)
            self._give_back(a)
            return None
        # Answered: no await from here to the return (finish() returns the
        # connection to the pool).
        grants = []
        for row in rows:
            hold = _LeaseHold(name, int(row[0]), a.owner)
            grant = Grant(request, int(row[1]), handle=hold)
            grant.valid_until = sent + ttl
            self._schedule(grant, ttl)
            grants.append(grant)
        a.grants = grants
        return grants

    async def _downgrade(
        self, a: _LeaseAttempt, write: Grant, key: int, ttl: float
    ) -> list[Grant] | None:
        """A reader row next to our live writer row, ahead of any waiting writer."""
        hold = cast(_LeaseHold, write.handle)
        leases, fencing = self._tables.leases, self._tables.fencing
        query = (
            f"WITH w AS (SELECT 1 FROM {leases} WHERE name = $1 AND slot = 0 AND owner = $2 "
            "AND epoch = $3 AND expires_at > clock_timestamp()), "
            f"f AS (INSERT INTO {fencing} AS f (name, epoch) SELECT $1, 1 FROM w "
            "ON CONFLICT (name) DO UPDATE SET epoch = f.epoch + 1 RETURNING f.epoch), "
            f"ins AS (INSERT INTO {leases} (name, slot, owner, epoch, expires_at) "
            f"SELECT $1, (SELECT coalesce(max(l.slot), 0) + 1 FROM {leases} AS l "
            "WHERE l.name = $1 AND l.slot > 0), $4, f.epoch, "
            "clock_timestamp() + make_interval(secs => $5) "
            "FROM f RETURNING slot, epoch) SELECT slot, epoch FROM ins"
        )
        if self._pool is None:
            raise BackendUnavailableError(f"backend {self._describe} is closed")
        try:
            if a.conn is None:
                a.conn = await self._connection()
            sent = time.monotonic()
            a.unanswered = True
            async with a.conn.transaction():
                await a.conn.execute("SELECT pg_advisory_xact_lock($1)", key)
                row = await a.conn.fetchrow(query, hold.name, hold.owner, write.token, a.owner, ttl)
            a.unanswered = False
        except _BROKEN as exc:
            raise self._unavailable(exc, "lease downgrade") from exc
        if row is None:
            self._give_back(a)
            return None
        grant = Grant(a.request, int(row[1]), handle=_LeaseHold(hold.name, int(row[0]), a.owner))
        grant.valid_until = sent + ttl
        self._schedule(grant, ttl)
        a.grants = [grant]
        return a.grants

    def _give_back(self, a: _LeaseAttempt) -> None:
        conn, a.conn = a.conn, None
        if conn is not None:
            self._put(conn)

    async def _abandon_rows(self, a: _LeaseAttempt) -> None:
        await a.conn.fetchrow(self._queries.abandon, a.fence, a.owner)

    async def wait_for_change(self, attempt: Attempt, bound: float | None) -> None:
        """Wait for a release NOTIFY of this name, at most ``lease_time`` (a crashed holder)."""
        a = cast(_LeaseAttempt, attempt)
        waiter = a.waiter
        if waiter is None:
            waiter = a.waiter = self._arm(a.fence)
        cap = self._ttl(a.request)
        await wait_done(waiter, cap if bound is None else min(bound, cap))

    async def abandon(self, attempt: Attempt) -> None:
        """Delete every row of the attempt's owner, on the connection of its last call."""
        a = cast(_LeaseAttempt, attempt)
        granted, a.grants = a.grants, None
        for grant in granted or ():
            await self.release(grant)
        try:
            if a.conn is not None and not _open(a.conn):
                # Its session ended: nothing of it still runs, any connection will do.
                self._return(a.conn)
                a.conn = None
            if not a.refused_unwritten:  # refused: no row of ours to delete
                if a.conn is None:
                    a.conn = await self._connection()
                await self._abandon_rows(a)
        except _BROKEN as exc:
            logger.warning(
                "could not clean up lease rows of %s (they lapse within %s s): %r",
                a.owner,
                self._ttl(a.request),
                exc,
            )
            conn, a.conn = a.conn, None
            if conn is not None:
                if _open(conn):
                    conn.terminate()
                await _return_quietly(self._pool, conn)
            return
        self._give_back(a)

    def finish(self, attempt: Attempt) -> None:
        """Keep or return a connection the attempt still has (no I/O)."""
        a = cast(_LeaseAttempt, attempt)
        waiter, a.waiter = a.waiter, None
        name = a.fence
        if waiter is not None and self._waiters.get(name) is waiter and not waiter.done():
            # Drop it; an attempt that shares it wakes (early wakes are allowed),
            # tries again and arms a new one.
            waiter.set_result(None)
            del self._waiters[name]
        conn, a.conn = a.conn, None
        if conn is not None:
            if a.unanswered:
                self._return(conn)  # a cancelled statement may still run there: the pool's
            else:
                self._put(conn)

    # -- renewal ----------------------------------------------------------

    def _schedule(self, grant: Grant, ttl: float) -> None:
        hold = cast(_LeaseHold, grant.handle)
        if hold.released or self._closed:
            return
        hold.timer = asyncio.get_running_loop().call_later(ttl / 3, self._fire, grant, ttl)

    def _fire(self, grant: Grant, ttl: float) -> None:
        hold = cast(_LeaseHold, grant.handle)
        hold.timer = None
        if hold.released or self._closed or self._owned is None:
            return
        self._owned.spawn(self._renew(grant, ttl), name="aiolocks-pg-renew")

    async def _renew(self, grant: Grant, ttl: float) -> None:
        hold = cast(_LeaseHold, grant.handle)
        sent = time.monotonic()
        try:
            row = await self._pool.fetchrow(
                self._queries.renew, hold.name, hold.slot, hold.owner, grant.token, ttl
            )
        except _BROKEN as exc:
            logger.warning("lease renewal of %r failed, retrying: %r", grant, exc)
            if not self._closed:
                self.states.set(ConnectionState.SUSPENDED)
            row = False
        if hold.released:
            return
        if row is None:
            grant.mark_lost("its lease row is gone (deleted, taken over or expired) at the renewal")
            return
        if row is not False:
            self.states.connected()
            grant.valid_until = sent + ttl
            grant.note_renewed()
        if grant.verify():
            self._schedule(grant, ttl)
        elif row is False and not self._closed:
            self.states.set(ConnectionState.LOST)  # expired: no renewal got through in time

    async def release(self, grant: Grant) -> bool:
        """Delete our row (owner and epoch); ``False`` when it was gone or had expired."""
        hold = cast(_LeaseHold, grant.handle)
        hold.stop()
        try:
            conn = await self._connection()
        except _BROKEN as exc:
            raise self._unavailable(exc, "lease release") from exc
        try:
            row = await conn.fetchrow(
                self._queries.release, hold.name, hold.slot, hold.owner, grant.token
            )
        except BaseException as exc:
            self._return(conn)  # (cancelled: the statement may still run there)
            if isinstance(exc, _BROKEN):
                raise self._unavailable(exc, "lease release") from exc
            raise
        self._put(conn)
        return bool(row is not None and row[0])

    async def diagnose(self) -> Diagnosis:
        """``backend.doctor()``'s findings for this server (see :mod:`._doctor`)."""
        from ._doctor import CHECK_TIMEOUT, diagnose_postgres

        if self._pool is None:
            raise BackendUnavailableError(f"PostgreSQL {self._describe}: not open")
        pool = self._pool

        async def connect() -> Any:
            return await pool.acquire()

        async def drop(conn: Any) -> None:
            await pool.release(conn)

        async def server_time() -> float:
            value = await pool.fetchval(
                "SELECT extract(epoch FROM clock_timestamp())::float8", timeout=CHECK_TIMEOUT
            )
            return float(value)

        try:
            return await diagnose_postgres(
                connect,
                drop,
                mode="lease",
                label=self._describe,
                interval=self._lease_time / 3,
                timeout=self._lease_time,
                listen=self._listen,
                server_time=server_time,
            )
        except _BROKEN as exc:
            raise self._unavailable(exc, "diagnosis") from exc

    def admin(self) -> PostgresLeaseAdmin:
        """Listing and force-release (``aiolocks list``/``break``)."""
        from ._admin import PostgresLeaseAdmin

        return PostgresLeaseAdmin(self._pool, self._queries, self._tables, self._describe)

    async def participants(self, name: str, family: Family) -> list[Participant]:
        """The live rows of the name (holders only: waiters leave no row)."""
        fencing = f"{family.value}/{name}"
        try:
            rows = await self._pool.fetch(self._queries.holders, fencing)
        except _BROKEN as exc:
            raise self._unavailable(exc, "participants") from exc
        out = []
        for row in rows:
            slot, owner, epoch = int(row[0]), str(row[1]), int(row[2])
            if family is Family.READ_WRITE:
                mode = "write" if slot == 0 else "read"
            elif family is Family.SEMAPHORE:
                mode = "lease"
            else:
                mode = "exclusive"
            out.append(
                Participant(
                    id=owner.rsplit("#", 1)[0],
                    is_holder=True,
                    fencing_token=epoch,
                    mode=mode,
                    node=f"{fencing}#{slot}",
                )
            )
        return out
