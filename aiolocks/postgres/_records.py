"""The record store of the PostgreSQL backend (the contract of :mod:`aiolocks._core.records`).

Design note
-----------
**One table**, ``<prefix>_records`` next to the lock tables (same ``schema``
and ``table_prefix``): ``key`` (primary key, ``"<prefix>/<child>"``),
``parent`` (``"<prefix>"``, indexed: a snapshot reads the children by it),
``value`` (``bytea``), ``version`` (``nextval`` of the fencing sequence at
every write, so two writes of a key never share a version, even across a
delete and re-create), ``expires_at`` (server time, ``NULL``: no expiry),
``session`` and ``owner`` (ephemeral records, below) and ``tag`` (an id the
writer mints before it sends a create, to find the row again if the answer
is lost). It is created with the lock tables (:func:`._sql.ddl`) and, where
those exist already (an upgrade), on the first use of the store (a backend
that only takes locks never needs it): behind the setup advisory lock, or
:class:`PostgresSetupError` with the DDL when the role may not create it or
``create_tables=false``.

**Liveness, by the server only.** A row is live when ``expires_at`` is
``NULL`` or after ``clock_timestamp()`` (never the client's clock), and,
when it has a ``session`` key, some session holds the advisory lock of
that key (``pg_locks``, readable by every role). Every statement applies
that rule: a row that is not live is absent to every method; ``create`` and
``join`` write over it (``INSERT … ON CONFLICT DO UPDATE … WHERE NOT
live``), and ``read``/``snapshot`` delete it when they meet it (matching
its version, so a row written meanwhile is never taken).

**Ephemeral records** (``join``), per mode:

* ``mode=advisory``: the row's ``session`` is a random 64-bit advisory key
  that the driver's primary session locks before its first ``join``. The
  row is live exactly as long as that session is: when the process dies or
  the connection drops, the server ends the session, the lock goes and every
  reader finds the row absent at once. The driver marks the entries lost
  on its existing loss path (``_session_ended``: the session's termination
  listener, a failed statement). A check every ``heartbeat / 2`` s, like
  the lock heartbeat, finds a row deleted behind our back (lost) and gives
  up on a session that does not answer within ``heartbeat / 2 + 1`` s
  (closed: its holds and entries lost). A statement that finds the primary
  session already ended by the server (before anything was sent) goes
  once more on a new one.
* ``mode=lease``: the row expires ``lease_time`` after its last renewal;
  the driver renews every ephemeral row of its own in one statement every
  third of ``lease_time``. A row missing at a renewal is lost; when no
  renewal got through for ``lease_time``, every entry is lost.

An orderly close deletes this backend's ephemeral rows (not a loss).

**Changes.** Every write sends ``NOTIFY <prefix>_records`` with the parent
prefix, in its own statement. A snapshot ``LISTEN``s before it reads
(advisory: on the primary session; lease: on the listener connection), so a
change is either in what it read or wakes it. What publishes nothing (an
expiry, a session that died, or no listener behind a pooler) is found by
re-reading the children's versions: at the earliest expiry among the rows
read, and every half second while the snapshot holds session-tied rows of
``mode=advisory`` (or has no listener). So a member whose process was
killed is seen gone within about half a second of the server ending its
session.

**Cancellation.** A create or join minted its ``tag`` before sending; when
it is cancelled (or fails) before its answer, a cleanup deleting the row of
that tag runs after it on the same connection (one connection keeps its
order), in the engine's task set; one that could not run is retried when
the backend closes. An update, delete, read or snapshot leaves nothing to
clean up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast, final

import asyncpg

from .._core.errors import AccessDeniedError, BackendUnavailableError, LockError
from .._core.records import CHILD, Entry, Record, Snapshot
from .._core.tasks import wait_done
from ._errors import REFUSED, TRANSIENT, denied
from ._sql import PostgresSetupError, TableNames, advisory_key, records_ddl

if TYPE_CHECKING:
    from ._driver import PostgresAdvisoryDriver, _Session
    from ._lease import PostgresLeaseDriver

__all__ = ["AdvisoryLink", "LeaseLink", "PostgresRecords", "RecordQueries"]

logger = logging.getLogger("aiolocks.postgres")

#: a connection the server ended can surface as a client protocol error
_BROKEN: tuple[type[BaseException], ...] = (*TRANSIENT, asyncpg.exceptions.InternalClientError)

#: seconds between re-reads of a snapshot holding session-tied rows (or without LISTEN)
POLL = 0.5

#: seconds after a row's expiry a snapshot re-reads (the server must have passed it)
_EXPIRY_MARGIN = 0.05

#: bytes of a key at most (its prefix is a NOTIFY payload, whose limit is 8000)
MAX_KEY_BYTES = 4000


# --------------------------------------------------------------------------- SQL


#: the advisory lock keys held by any session of this database
_HELD = (
    "held AS MATERIALIZED (SELECT (l.classid::int8 << 32) | l.objid::int8 AS k "
    "FROM pg_locks AS l WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
)


def _live(r: str) -> str:
    """Row ``r`` is live: not expired by the server's clock, and its session (if any) alive."""
    return (
        f"(({r}.expires_at IS NULL OR {r}.expires_at > clock_timestamp()) "
        f"AND ({r}.session IS NULL OR {r}.session IN (SELECT k FROM held)))"
    )


@final
@dataclass(frozen=True, slots=True)
class RecordQueries:
    """The statements of the record store (asyncpg ``$n`` parameters; see each builder)."""

    exists: str
    create: str
    update: str
    delete: str
    read: str
    children: str
    versions: str
    check: str
    renew: str
    drop_tag: str
    leave: str

    @classmethod
    def build(cls, names: TableNames) -> RecordQueries:
        """The statements for the tables in ``names``."""
        t = names.records
        seq = "nextval('" + names.sequence.replace("'", "''") + "')"
        notify = f"pg_notify('{names.records_channel}', w.parent)"
        expiry = (
            "CASE WHEN $4::float8 IS NULL THEN NULL "
            "ELSE clock_timestamp() + make_interval(secs => $4::float8) END"
        )
        return cls(
            exists="SELECT to_regclass('" + t.replace("'", "''") + "') IS NOT NULL",
            # $1 key, $2 parent, $3 value, $4 ttl, $5 session, $6 owner, $7 tag
            create=(
                f"WITH {_HELD}, w AS (INSERT INTO {t} AS r "
                "(key, parent, value, version, expires_at, session, owner, tag) "
                f"VALUES ($1, $2, $3, {seq}, {expiry}, $5::int8, $6::text, $7) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                "version = excluded.version, expires_at = excluded.expires_at, "
                "session = excluded.session, owner = excluded.owner, tag = excluded.tag "
                f"WHERE NOT {_live('r')} RETURNING r.version, r.parent) "
                f"SELECT w.version, {notify} FROM w"
            ),
            # $1 key, $2 value, $3 version, $4 ttl (an ephemeral row keeps its expiry), $5 tag
            update=(
                f"WITH {_HELD}, w AS (UPDATE {t} AS r SET value = $2, version = {seq}, tag = $5, "
                f"expires_at = CASE WHEN r.owner IS NOT NULL THEN r.expires_at ELSE {expiry} END "
                f"WHERE r.key = $1 AND r.version = $3 AND {_live('r')} "
                "AND (r.owner IS NULL OR $4::float8 IS NULL) RETURNING r.version, r.parent) "
                f"SELECT w.version, {notify} FROM w"
            ),
            # $1 key, $2 version or NULL: (live, notified) when a row was deleted
            delete=(
                f"WITH {_HELD}, w AS (DELETE FROM {t} AS r WHERE r.key = $1 "
                "AND ($2::int8 IS NULL OR r.version = $2::int8) "
                f"RETURNING {_live('r')} AS live, r.parent) SELECT w.live, {notify} FROM w"
            ),
            read=_reading(t, "r.key = $1"),
            children=_reading(t, "r.parent = $1"),
            # $1 parent: (key, version, seconds to expiry, session-tied) of the live children
            versions=(
                f"WITH {_HELD} SELECT r.key, r.version, "
                "extract(epoch FROM r.expires_at - clock_timestamp())::float8, "
                f"r.session IS NOT NULL FROM {t} AS r WHERE r.parent = $1 AND {_live('r')}"
            ),
            # mode=advisory: which of our ephemeral rows ($2) of session key $3 are there
            check=(
                f"WITH {_HELD} SELECT r.key FROM {t} AS r WHERE r.owner = $1 "
                f"AND r.key = ANY($2::text[]) AND r.session = $3 AND {_live('r')}"
            ),
            # mode=lease: renew our ephemeral rows $2 for $3 seconds; the keys renewed
            renew=(
                f"UPDATE {t} AS r SET expires_at = clock_timestamp() + make_interval(secs => $3) "
                "WHERE r.owner = $1 AND r.key = ANY($2::text[]) AND r.session IS NULL "
                "AND r.expires_at > clock_timestamp() RETURNING r.key"
            ),
            # after a cancelled create or join: $1 key, $2 tag
            drop_tag=(
                f"WITH w AS (DELETE FROM {t} AS r WHERE r.key = $1 AND r.tag = $2 "
                f"RETURNING r.parent) SELECT {notify} FROM w"
            ),
            # an orderly close: owner $1's rows, and rows ($2 keys, $3 tags) of cleanups
            leave=(
                f"WITH w AS (DELETE FROM {t} AS r WHERE r.owner = $1 OR (r.key, r.tag) IN "
                "(SELECT * FROM unnest($2::text[], $3::text[])) RETURNING r.parent) "
                f"SELECT {notify} FROM (SELECT DISTINCT w.parent FROM w) AS w"
            ),
        )


def _reading(table: str, where: str) -> str:
    """Live rows matching ``where``; dead ones met are deleted (by version: never a newer row)."""
    return (
        f"WITH {_HELD}, rows AS (SELECT r.key, r.value, r.version, r.owner IS NOT NULL AS eph, "
        "extract(epoch FROM r.expires_at - clock_timestamp())::float8 AS left_s, "
        f"r.session IS NOT NULL AS tied, {_live('r')} AS live FROM {table} AS r WHERE {where}), "
        f"gone AS (DELETE FROM {table} AS d USING rows WHERE NOT rows.live "
        "AND d.key = rows.key AND d.version = rows.version) "
        "SELECT key, value, version, eph, left_s, tied FROM rows WHERE live"
    )


# --------------------------------------------------------------------------- input


def _parent(key: str) -> str:
    """The prefix of ``key``; ``ValueError`` when it is not ``<prefix>/<child>``."""
    if not isinstance(key, str):
        raise ValueError(f"a record key is a str, got {key!r}")
    parent, slash, child = key.rpartition("/")
    if not slash or not parent or not CHILD.fullmatch(child):
        raise ValueError(
            f"record key {key!r} is not '<prefix>/<child>' with a child of [A-Za-z0-9_.-]{{1,64}}"
        )
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"record key {key[:40]!r}… is longer than {MAX_KEY_BYTES} bytes")
    return parent


def _prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not prefix or prefix.endswith("/"):
        raise ValueError(f"a record prefix is a non-empty str, no trailing '/', got {prefix!r}")
    if len(prefix.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"record prefix {prefix[:40]!r}… is longer than {MAX_KEY_BYTES} bytes")
    return prefix


def _value(value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError(f"a record value is bytes, got {type(value).__name__}")
    return bytes(value)


def _ttl(ttl: float | None) -> float | None:
    if ttl is None:
        return None
    number = isinstance(ttl, int | float) and not isinstance(ttl, bool)
    if not number or not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"a record ttl is a number of seconds > 0 or None, got {ttl!r}")
    return float(ttl)


def _version(version: int | None, *, required: bool) -> int | None:
    if version is None and not required:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or not -(2**63) <= version < 2**63:
        raise ValueError(f"a record version is a 64-bit int, got {version!r}")
    return version


# --------------------------------------------------------------------------- links


class _Link(Protocol):
    """What the store needs from its driver: where statements run, and its sessions."""

    owner: str
    create_tables: bool
    #: seconds between checks (advisory) or renewals (lease) of our ephemeral rows
    keep_interval: float
    #: the expiry of an ephemeral row (lease), or ``None`` (tied to a session)
    ephemeral_ttl: float | None

    async def run(
        self,
        query: str,
        args: tuple[Any, ...],
        *,
        place: object = None,
        timeout: float | None = None,
        failed: Callable[[object], None] | None = None,
        script: bool = False,
    ) -> list[Any]:
        """One statement (``place``: on that session); ``failed(place)`` before a lost answer."""
        ...

    async def run_on(self, place: object, query: str, args: tuple[Any, ...]) -> None:
        """Run ``query`` where a failed statement ran, after it; then let the place go."""
        ...

    async def listen(self, channel: str, callback: Callable[..., None]) -> bool:
        """``LISTEN`` (once per connection); ``False`` when nothing can listen."""
        ...

    async def join_place(self) -> tuple[int | None, object]:
        """``(session key, place)`` for an ephemeral write (advisory: lock the key first)."""
        ...

    async def keep(self, queries: RecordQueries, keys: list[str]) -> set[str] | None:
        """Check or renew our ephemeral rows ``keys``; the ones still ours, ``None``: no answer."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> bool:
        """Run ``coro`` in the engine's task set; ``False`` (coroutine closed) when not open."""
        ...


class _NotSent(BackendUnavailableError):
    """A statement found its session ended before it was sent (it may go again)."""


def _spawn(owned: Any, coro: Coroutine[Any, Any, None], name: str) -> bool:
    if owned is None:
        coro.close()
        return False
    owned.spawn(coro, name=name)
    return True


@final
class AdvisoryLink:
    """``mode=advisory``: statements on the primary session; ephemeral rows tied to it."""

    def __init__(self, driver: PostgresAdvisoryDriver) -> None:
        self._driver = driver
        self.owner = f"records#{secrets.token_hex(8)}"
        self.create_tables = driver._create_tables
        self.keep_interval = driver._heartbeat / 2
        self.ephemeral_ttl: float | None = None
        self.store: PostgresRecords | None = None
        #: the session holding our session key, and the key
        self._key_session: _Session | None = None
        self._key = 0
        #: a key minted for a session whose lock call has not been answered yet
        self._minted: tuple[_Session, int] | None = None
        self._listen_session: _Session | None = None

    async def run(
        self,
        query: str,
        args: tuple[Any, ...],
        *,
        place: object = None,
        timeout: float | None = None,
        failed: Callable[[object], None] | None = None,
        script: bool = False,
    ) -> list[Any]:
        """One statement on the primary session (or on ``place``, a session).

        On the primary, a statement that found its session already ended by
        the server (the connection closed, or asyncpg refusing to start it:
        the session's last message was the server's FATAL) was never sent:
        it goes once more, on a new primary session.
        """
        if place is not None:
            return await self._statement(
                cast("_Session", place), query, args, timeout, failed, script
            )
        session = await self._primary()
        try:
            return await self._statement(session, query, args, timeout, failed, script)
        except _NotSent:
            return await self._statement(
                await self._driver._get_primary(), query, args, timeout, failed, script
            )

    async def _primary(self) -> _Session:
        """The primary session; one the server ended (its callback not run yet) is replaced."""
        driver = self._driver
        session = await driver._get_primary()
        if session.conn.is_closed():
            driver._session_ended(session, "its connection was closed")
            session = await driver._get_primary()
        return session

    async def _statement(
        self,
        session: _Session,
        query: str,
        args: tuple[Any, ...],
        timeout: float | None,
        failed: Callable[[object], None] | None,
        script: bool,
    ) -> list[Any]:
        driver = self._driver
        if not session.alive or session.conn.is_closed():
            driver._session_ended(session, "its connection was closed")
            raise _NotSent(f"PostgreSQL {driver._describe}: the session (pid {session.pid}) ended")
        try:
            if script:
                async with session.io:
                    await session.conn.execute(query, timeout=timeout)
                return []
            return await session.fetch(query, *args, timeout=timeout)
        except asyncpg.exceptions.InternalClientError as exc:
            # refused before anything was sent: the session is done (its loss path)
            driver._session_ended(session, f"record statement refused: {exc!r}")
            raise _NotSent(f"PostgreSQL {driver._describe}: records failed: {exc!r}") from exc
        except BaseException as exc:
            if failed is not None:
                failed(session)
            if isinstance(exc, _BROKEN) and (
                session.conn.is_closed() or isinstance(exc, TimeoutError)
            ):
                # gone or stalled: the driver's loss path (holds and entries lost)
                driver._session_ended(session, f"record statement failed: {exc!r}")
            if isinstance(exc, (*_BROKEN, *REFUSED)):
                raise denied(exc, "records", driver._describe) or BackendUnavailableError(
                    f"PostgreSQL {driver._describe}: records failed: {exc!r}"
                ) from exc
            raise

    async def run_on(self, place: object, query: str, args: tuple[Any, ...]) -> None:
        """After a failed statement, on its session (asyncpg keeps one connection's order)."""
        await self.run(query, args, place=place)

    async def listen(self, channel: str, callback: Callable[..., None]) -> bool:
        """``LISTEN`` on the primary session (again on each new one)."""
        session = await self._primary()
        if self._listen_session is not session:
            try:
                async with session.io:
                    await session.conn.add_listener(channel, callback)
            except (*_BROKEN, *REFUSED) as exc:
                raise denied(exc, "LISTEN", self._driver._describe) or BackendUnavailableError(
                    f"PostgreSQL {self._driver._describe}: LISTEN failed: {exc!r}"
                ) from exc
            if session.alive:
                self._listen_session = session
        return True

    async def join_place(self) -> tuple[int | None, object]:
        """The primary session, holding the advisory lock of our session key."""
        session = await self._primary()
        if self._key_session is session and session.alive:
            return self._key, session
        if self._minted is None or self._minted[0] is not session:
            # Minted before the call: a cancelled call is sent again with the same
            # key (the lock stacks on the one session), so no stray key stays locked.
            self._minted = (session, secrets.randbits(63))
        key = self._minted[1]
        rows = await self.run("SELECT pg_try_advisory_lock($1)", (key,), place=session)
        self._minted = None
        if not rows or not rows[0][0] or not session.alive:
            raise BackendUnavailableError(
                f"PostgreSQL {self._driver._describe}: could not lock the records session key"
            )
        self._key_session, self._key = session, key
        return key, session

    async def keep(self, queries: RecordQueries, keys: list[str]) -> set[str] | None:
        """Which rows are still ours; a session that does not answer in time is ended."""
        session = self._key_session
        if session is None or not session.alive:
            return None
        try:
            rows = await self.run(
                queries.check,
                (self.owner, keys, self._key),
                place=session,
                timeout=self.keep_interval + 1.0,
            )
        except LockError as exc:
            logger.warning("PostgreSQL records check failed: %r", exc)
            return None
        return {str(row[0]) for row in rows}

    def session_ended(self, session: _Session, why: str) -> None:
        """The driver's loss path: entries of that session are lost; listeners wake."""
        store = self.store
        if session is self._listen_session:
            self._listen_session = None
            if store is not None:
                store.wake_all()
        if session is self._key_session:
            self._key_session = None
            if store is not None:
                store.lose_all(
                    f"its PostgreSQL session (pid {session.pid}) ended ({why}); "
                    "the record went with it"
                )

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> bool:
        """In the engine's task set."""
        return _spawn(self._driver._owned, coro, name)


@final
class LeaseLink:
    """``mode=lease``: statements on the pool; ephemeral rows renewed like lease rows."""

    def __init__(self, driver: PostgresLeaseDriver) -> None:
        self._driver = driver
        self.owner = f"records#{secrets.token_hex(8)}"
        self.create_tables = driver._create_tables
        self.keep_interval = driver._lease_time / 3
        self.ephemeral_ttl: float | None = driver._lease_time
        self.store: PostgresRecords | None = None
        self._listening: Any = None
        self._listen_lock = asyncio.Lock()

    async def run(
        self,
        query: str,
        args: tuple[Any, ...],
        *,
        place: object = None,
        timeout: float | None = None,
        failed: Callable[[object], None] | None = None,
        script: bool = False,
    ) -> list[Any]:
        """One statement on a pool connection."""
        driver = self._driver
        if driver._pool is None:
            raise BackendUnavailableError(f"backend {driver._describe} is closed")
        try:
            conn = await driver._connection()
        except (*_BROKEN, *REFUSED) as exc:
            raise driver._unavailable(exc, "records") from exc
        try:
            if script:
                await conn.execute(query, timeout=timeout)
                rows: list[Any] = []
            else:
                rows = await conn.fetch(query, *args, timeout=timeout)
        except BaseException as exc:
            if failed is not None:
                failed(conn)  # the cleanup runs there, after the statement, then returns it
            else:
                driver._return(conn)  # a cancelled statement may still run there: the pool's
            if isinstance(exc, (*_BROKEN, *REFUSED)):
                raise driver._unavailable(exc, "records") from exc
            raise
        driver._put(conn)
        return rows

    async def run_on(self, place: object, query: str, args: tuple[Any, ...]) -> None:
        """On the connection of a failed statement (after it), then back to the pool."""
        driver = self._driver
        try:
            await place.fetch(query, *args)  # type: ignore[attr-defined]
        except (*_BROKEN, *REFUSED) as exc:
            raise driver._unavailable(exc, "records cleanup") from exc
        finally:
            driver._return(place)

    async def listen(self, channel: str, callback: Callable[..., None]) -> bool:
        """``LISTEN`` on the driver's listener connection, if it has one."""
        listener = self._driver._listener
        if listener is None:
            return False
        async with self._listen_lock:
            if self._listening is not listener:
                try:
                    await listener.add_listener(channel, callback)
                    listener.add_termination_listener(self._listener_ended)
                except (*_BROKEN, *REFUSED) as exc:
                    raise self._driver._unavailable(exc, "LISTEN") from exc
                self._listening = listener
        return not listener.is_closed()

    def _listener_ended(self, _conn: object) -> None:
        if self.store is not None:
            self.store.wake_all()

    async def join_place(self) -> tuple[int | None, object]:
        """Any pool connection: the row carries its own expiry."""
        return None, None

    async def keep(self, queries: RecordQueries, keys: list[str]) -> set[str] | None:
        """Renew every ephemeral row of ours in one statement."""
        try:
            rows = await self.run(
                queries.renew,
                (self.owner, keys, self.ephemeral_ttl),
                timeout=self.keep_interval,
            )
        except LockError as exc:
            logger.warning("PostgreSQL record renewal failed, retrying: %r", exc)
            return None
        return {str(row[0]) for row in rows}

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> bool:
        """In the engine's task set."""
        return _spawn(self._driver._owned, coro, name)


# --------------------------------------------------------------------------- the store


@final
class _Own:
    """``Entry.handle``: one ephemeral row this store wrote."""

    __slots__ = ("busy", "touched", "unsure", "valid_until")

    def __init__(self, valid_until: float | None) -> None:
        #: deletes of it in flight
        self.busy = 0
        #: the store's counter at the last delete start or end
        self.touched = 0
        #: a delete whose answer was lost: a missing row is not a loss
        self.unsure = False
        #: lease: monotonic time the row expires unless renewed
        self.valid_until = valid_until


@dataclass(slots=True)
class _Seen:
    """What a snapshot read: versions, the next expiry (loop time), whether to poll."""

    versions: dict[str, int]
    expires: float | None
    poll: bool

    @classmethod
    def of(cls, rows: list[Any], listening: bool) -> _Seen:
        now = asyncio.get_running_loop().time()
        left = [float(r[2]) for r in rows if r[2] is not None]
        return cls(
            versions={str(r[0]).rpartition("/")[2]: int(r[1]) for r in rows},
            expires=None if not left else now + max(0.0, min(left)) + _EXPIRY_MARGIN,
            poll=not listening or any(bool(r[3]) for r in rows),
        )

    def next_check(self, now: float) -> float | None:
        steps = [] if self.expires is None else [max(0.0, self.expires - now)]
        if self.poll:
            steps.append(POLL)
        return min(steps) if steps else None


class _PgSnapshot(Snapshot):
    """Children as read, woken by ``NOTIFY`` or by a re-read that differs."""

    def __init__(
        self,
        store: PostgresRecords,
        prefix: str,
        records: Mapping[str, Record],
        future: asyncio.Future[None],
        seen: _Seen,
    ) -> None:
        super().__init__(records)
        self._store = store
        self._prefix = prefix
        self._future = future
        self._seen = seen
        self._closed = False

    async def changed(self, bound: float | None) -> None:
        """Return on a ``NOTIFY`` of the prefix, a re-read that differs, or after ``bound``."""
        loop = asyncio.get_running_loop()
        end = None if bound is None else loop.time() + max(0.0, bound)
        while not self._closed:
            now = loop.time()
            step = self._seen.next_check(now)
            wait = step if end is None else end - now if step is None else min(step, end - now)
            if await wait_done(self._future, wait):
                return
            if end is not None and loop.time() >= end:
                return
            try:
                seen = await self._store._look(self._prefix)
            except LockError:
                return  # the caller's next read reports it
            if seen.versions != self._seen.versions:
                return
            self._seen = seen

    def close(self) -> None:
        """Stop listening for this snapshot (no I/O)."""
        if not self._closed:
            self._closed = True
            self._store._forget(self._prefix, self._future)


@final
class PostgresRecords:
    """The record store of one PostgreSQL backend (see the module notes)."""

    def __init__(self, link: AdvisoryLink | LeaseLink, tables: TableNames) -> None:
        self._link: _Link = link
        link.store = self
        self._tables = tables
        self._q = RecordQueries.build(tables)
        self._table_ok = False
        self._entries: dict[str, Entry] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        #: tag -> key of creates and joins whose answer was lost (cleanup pending)
        self._cleanups: dict[str, str] = {}
        self._counter = 0
        self._joined = False
        self._closing = False
        self._timer: asyncio.TimerHandle | None = None

    # -- the contract ---------------------------------------------------------------

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int | None:
        """Write a persistent or expiring record if absent (or expired); its version."""
        parent, data, seconds = _parent(key), _value(value), _ttl(ttl)
        await self._ready()
        rows = await self._write(key, (key, parent, data, seconds, None, None))
        return None if not rows else int(rows[0][0])

    async def join(self, key: str, value: bytes) -> Entry | None:
        """Write an ephemeral record if absent: tied to the session, or renewed (lease)."""
        parent, data = _parent(key), _value(value)
        await self._ready()
        session, place = await self._link.join_place()
        ttl = self._link.ephemeral_ttl
        sent = time.monotonic()
        self._joined = True
        rows = await self._write(
            key, (key, parent, data, ttl, session, self._link.owner), place=place
        )
        # Answered: from here to the return, no await (the entry is recorded at once).
        if not rows:
            return None
        entry = Entry(key, int(rows[0][0]), _Own(None if ttl is None else sent + ttl))
        if self._closing or (place is not None and not getattr(place, "alive", True)):
            entry.mark_lost("the PostgreSQL session ended as the record was written")
            return entry
        self._entries[key] = entry
        self._arm()
        return entry

    async def update(
        self, key: str, value: bytes, *, version: int, ttl: float | None = None
    ) -> int | None:
        """Compare-and-set by version; an ephemeral record stays ephemeral (no ``ttl``)."""
        _parent(key)
        data, seconds = _value(value), _ttl(ttl)
        expected = _version(version, required=True)
        await self._ready()
        rows = await self._link.run(
            self._q.update, (key, data, expected, seconds, secrets.token_hex(8))
        )
        if rows:
            return int(rows[0][0])
        if seconds is not None:
            record = await self.read(key)
            if record is not None and record.ephemeral and record.version == expected:
                raise ValueError(f"record {key!r} is ephemeral: it takes no ttl")
        return None

    async def delete(self, key: str, *, version: int | None = None) -> bool:
        """Delete (at ``version``, when given); ``True`` when this call deleted it."""
        _parent(key)
        expected = _version(version, required=False)
        await self._ready()
        entry = self._entries.get(key)
        own = entry.handle if entry is not None and isinstance(entry.handle, _Own) else None
        if own is not None:
            own.busy += 1
            own.touched = self._touch()
        try:
            rows = await self._link.run(self._q.delete, (key, expected))
        except BaseException:
            if own is not None:
                own.busy -= 1
                own.unsure = True  # it may have gone: the next check does not call it lost
                own.touched = self._touch()
            raise
        if own is not None:
            own.busy -= 1
            own.touched = self._touch()
            if rows and self._entries.get(key) is entry:
                del self._entries[key]  # left on purpose: not a loss, no more checks
        return bool(rows) and bool(rows[0][0])

    async def read(self, key: str) -> Record | None:
        """The record, or ``None`` when absent, expired or its session ended."""
        _parent(key)
        await self._ready()
        rows = await self._link.run(self._q.read, (key,))
        return None if not rows else _record(rows[0])

    async def snapshot(self, prefix: str) -> Snapshot:
        """The live children of ``prefix``, read after ``LISTEN`` (see the module notes)."""
        _prefix(prefix)
        await self._ready()
        listening = await self._link.listen(self._tables.records_channel, self._on_notify)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(prefix, set()).add(future)
        try:
            rows = await self._link.run(self._q.children, (prefix,))
        except BaseException:
            self._forget(prefix, future)
            raise
        start = len(prefix) + 1
        records = {str(row[0])[start:]: _record(row) for row in rows}
        seen = _Seen.of([(r[0], r[2], r[4], r[5]) for r in rows], listening)
        return _PgSnapshot(self, prefix, records, future, seen)

    # -- statements ----------------------------------------------------------------

    async def _write(self, key: str, args: tuple[Any, ...], *, place: object = None) -> list[Any]:
        """A create or join with a minted tag; a lost answer leaves a cleanup behind it."""
        tag = secrets.token_hex(8)
        self._cleanups[tag] = key  # before sending: a cleanup that cannot run now runs at close
        sent = False

        def failed(where: object) -> None:
            nonlocal sent
            sent = True
            if not self._link.spawn(self._drop(where, key, tag), "aiolocks-pg-record-cleanup"):
                logger.debug("record cleanup of %r deferred to close", key)

        try:
            rows = await self._link.run(self._q.create, (*args, tag), place=place, failed=failed)
        except BaseException:
            if not sent:
                self._cleanups.pop(tag, None)  # never sent (no connection yet): nothing to undo
            raise
        self._cleanups.pop(tag, None)
        return rows

    async def _drop(self, where: object, key: str, tag: str) -> None:
        """Delete the row a cancelled create or join may have written (by its tag)."""
        try:
            await self._link.run_on(where, self._q.drop_tag, (key, tag))
        except LockError as exc:
            logger.warning("could not clean up record %r (retried at close): %r", key, exc)
            return
        self._cleanups.pop(tag, None)

    async def _ready(self) -> None:
        """Make sure the record table exists (once per store)."""
        if self._table_ok:
            return
        rows = await self._link.run(self._q.exists, ())
        if not (rows and rows[0][0]):
            statements = records_ddl(self._tables)
            if not self._link.create_tables:
                raise PostgresSetupError(
                    "the aiolocks record table does not exist (table creation is turned off)",
                    ddl=statements,
                )
            setup = advisory_key("setup", f"{self._tables.schema or ''}.{self._tables.prefix}")
            try:
                await self._link.run(
                    f"SELECT pg_advisory_xact_lock({setup});\n{statements}", (), script=True
                )
            except AccessDeniedError as exc:
                raise PostgresSetupError(
                    f"this role may not create the aiolocks record table ({exc})", ddl=statements
                ) from exc
        self._table_ok = True

    async def _look(self, prefix: str) -> _Seen:
        """The versions of the live children now (a snapshot's re-read)."""
        listening = await self._link.listen(self._tables.records_channel, self._on_notify)
        rows = await self._link.run(self._q.versions, (prefix,))
        return _Seen.of(rows, listening)

    # -- waiting ---------------------------------------------------------------------

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        for future in self._waiters.pop(payload, ()):
            if not future.done():
                future.set_result(None)

    def _forget(self, prefix: str, future: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(prefix)
        if waiters is not None:
            waiters.discard(future)
            if not waiters:
                del self._waiters[prefix]

    def wake_all(self) -> None:
        """Every snapshot returns from ``changed`` (a notification may have been missed)."""
        waiters, self._waiters = self._waiters, {}
        for futures in waiters.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)

    # -- ephemeral entries ------------------------------------------------------------

    def _touch(self) -> int:
        self._counter += 1
        return self._counter

    def _arm(self) -> None:
        if self._timer is None and self._entries and not self._closing:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._link.keep_interval, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._entries and not self._closing:
            self._link.spawn(self._keep(), "aiolocks-pg-records-keep")

    async def _keep(self) -> None:
        """Check (advisory) or renew (lease) our ephemeral rows; a missing one is lost."""
        started = self._counter
        sent = time.monotonic()
        keys = list(self._entries)
        kept = await self._link.keep(self._q, keys)
        ttl = self._link.ephemeral_ttl
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or not isinstance(own := entry.handle, _Own):
                continue
            if own.busy or own.touched > started:
                continue  # a delete of ours is under way: its answer decides
            if kept is None:
                if own.valid_until is not None and time.monotonic() >= own.valid_until:
                    self._lose(key, f"its record was not renewed within {ttl} s; it expired")
            elif key in kept:
                own.unsure = False
                if ttl is not None:
                    own.valid_until = sent + ttl
            elif own.unsure:
                del self._entries[key]  # our own cancelled delete went through
            else:
                self._lose(key, "its record is gone (deleted behind our back, or it expired)")
        self._arm()

    def _lose(self, key: str, reason: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None and not self._closing:
            entry.mark_lost(reason)

    def session_ended(self, session: _Session, why: str) -> None:
        """``mode=advisory``: the driver's loss path calls this for every session that ends."""
        if isinstance(self._link, AdvisoryLink):
            self._link.session_ended(session, why)

    def lose_all(self, reason: str) -> None:
        """The session of our ephemeral rows ended: every entry is lost."""
        for key in list(self._entries):
            self._lose(key, reason)

    async def close(self) -> None:
        """The backend closes: our ephemeral rows (and rows of lost answers) go; not a loss."""
        if self._closing:
            return
        self._closing = True
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self._entries = {}
        self.wake_all()
        if not self._joined and not self._cleanups:
            return
        keys, tags = list(self._cleanups.values()), list(self._cleanups)
        args = (self._link.owner, keys, tags)
        # Twice at most: a session that ended under the first try takes its
        # session-tied rows with it, but not persistent rows of lost answers
        # (nor lease rows), which a new session deletes.
        for attempt in (1, 2):
            try:
                await self._link.run(self._q.leave, args, timeout=self._link.keep_interval + 1)
            except LockError as exc:
                if attempt == 2 or not (keys or self._link.ephemeral_ttl is not None):
                    logger.warning("could not delete this backend's records at close: %r", exc)
                    return
            else:
                self._cleanups.clear()
                return


def _record(row: Any) -> Record:
    """``(key, value, version, ephemeral, seconds left, session-tied)`` as a :class:`Record`."""
    ephemeral = bool(row[3])
    left = None if ephemeral or row[4] is None else max(0.0, float(row[4]))
    return Record(bytes(row[1]), int(row[2]), ephemeral, left)
