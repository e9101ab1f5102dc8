"""The SQL the PostgreSQL backend runs: keys, tables, queries and session checks.

Design note
-----------
**Keys.** A lock name becomes one ``bigint`` advisory-lock key: the first 8
bytes of ``SHA-256("aiolocks/<family>/<name>")`` read as a big-endian signed
64-bit integer (:func:`advisory_key`). A cryptographic hash because the key
space is shared by every application on the database: 32-bit hashes
(``hashtext``, CRC32) collide after about a hundred thousand names, and
Python's ``hash()`` is seeded per process, so two processes would disagree.
The ``bigint`` form (``pg_advisory_lock(int8)``) and the ``(int4, int4)`` form
are two separate key spaces on the server (``objsubid`` 1 and 2 in
``pg_locks``); we use only the ``bigint`` one, which holds the whole 64-bit
hash. The same key can be computed in SQL, for an operator looking at
``pg_locks`` (:data:`KEY_SQL`). Advisory locks are per database, so two
databases never share a key.

**Fencing.** ``mode=advisory`` takes its tokens from one sequence per table
set (:attr:`TableNames.sequence`), in the statement that takes the lock:
``SELECT nextval(seq) WHERE pg_try_advisory_lock($1)`` (the one-time filter
runs first, so a refused try consumes nothing). A sequence is WAL-logged and
never goes back, across a restart as across a crash (a crash may skip values,
which keeps tokens increasing), so a token is strictly increasing per name,
and across names too: tokens of one name are increasing but not consecutive.
``nextval`` writes no row: a grant costs about what the bare lock call
costs. The fencing table (``name`` → ``epoch``) lists the names in use
(``aiolocks list`` reads it, as a key is a hash): the first grant of a name in
a backend records it in the same statement (``*_register`` queries), later
grants do not. When the sequence is created where a fencing table already
has rows (an upgrade from per-name rows), it starts above their largest epoch,
so no name's token goes backwards. ``mode=lease`` bumps the name's fencing row
in its acquire function (a lease grant writes a row anyway). A session-level
advisory lock survives a ROLLBACK: if the statement fails after the lock was
granted, the lock is still held and the caller must unlock it
(:data:`AdvisoryQueries.unlock_if_held`).

**Lease mode.** A lease table with a row per hold (unique ``(name, slot)``,
owner, server-time expiry, fencing epoch) and one PL/pgSQL function that
acquires in a single round trip: it serializes the acquirers of one name with
a transaction-level advisory lock (safe behind a transaction-pooling proxy,
since it ends with the statement's transaction), purges expired rows, checks
the mode's rule with a fresh snapshot, bumps the fencing row and inserts the
hold. Renewal and release match owner *and* epoch, so a stale owner can never
touch a newer hold. Release sends ``NOTIFY`` on :attr:`TableNames.channel`
with the name, in the same statement, for waiters that can ``LISTEN``.

**Bootstrap.** :func:`ensure_schema` looks the tables and the function up
first and runs the DDL (with the record table's, :func:`records_ddl`) only
when something is missing, serialized by a
transaction-level advisory lock so that two processes starting together do
not trip over each other; a role that may not create them gets
:class:`PostgresSetupError` whose message is the DDL to run.

**Proxies.** :func:`probe_session` finds what can be found: a pooler that
answers the login itself (pgbouncer, pgcat, Odyssey, RDS Proxy) hands out its
own cancel key, so the pid the login reported differs from
``pg_backend_pid()``; a transaction pooler may also move two statements of one
client connection to two server sessions. A plain TCP proxy keeps the session
whole and is (rightly) not reported.

This module imports no driver; the helpers take any connection with
asyncpg's ``fetch``/``fetchrow``/``fetchval``/``execute``.
"""

from __future__ import annotations

import functools
import hashlib
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, final

from .._core.errors import LockError
from ._client import Connection

__all__ = [
    "FAMILIES",
    "KEY_SQL",
    "AdvisoryQueries",
    "LeaseQueries",
    "PostgresSetupError",
    "SessionProbe",
    "TableNames",
    "advisory_key",
    "configure_keepalives",
    "ddl",
    "ensure_schema",
    "held_advisory_locks",
    "key_text",
    "lost_keys",
    "probe_session",
    "records_ddl",
    "slot_keys",
    "split_key",
]

#: The lock families that get their own key space: one per factory (the
#: values of the core's ``Family`` enum), ``lease`` for the lease mode's
#: serializing locks and ``setup`` for the table bootstrap. Part of every key:
#: never rename one.
FAMILIES: Final = frozenset(
    {"mutex", "semaphore-mutex", "semaphore", "rwlock", "leader", "lease", "setup"}
)

#: The same key as :func:`advisory_key`, computed by the server from a text
#: ``$1`` such as ``'aiolocks/mutex/locks/pay/order-1'``.
KEY_SQL: Final = "('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))::bit(64)::int8"

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_INT64 = 1 << 64


class PostgresSetupError(LockError, RuntimeError):
    """The lock tables are missing and this role may not create them.

    ``ddl`` is the SQL a database owner must run once (it is also the end of
    the message).
    """

    def __init__(self, message: str, *, ddl: str) -> None:
        super().__init__(f"{message}\n-- run this once as a role that may create them:\n{ddl}")
        self.ddl = ddl


# --------------------------------------------------------------------------- keys


def key_text(family: str, name: str) -> str:
    """The text hashed into a key: ``"aiolocks/<family>/<name>"``.

    ``name`` is the lock name as the core normalized it (no leading ``/``).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown lock family {family!r} (one of {', '.join(sorted(FAMILIES))})")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a lock name is a non-empty str, got {name!r}")
    return f"aiolocks/{family}/{name}"


@functools.lru_cache(maxsize=4096)
def advisory_key(family: str, name: str) -> int:
    """The signed 64-bit advisory-lock key of ``name`` in ``family``.

    >>> advisory_key("mutex", "locks/pay/order-1") == advisory_key("mutex", "locks/pay/order-1")
    True
    """
    digest = hashlib.sha256(key_text(family, name).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def slot_keys(name: str, slots: int) -> list[int]:
    """The keys of the ``slots`` slots of semaphore ``name`` (``"<name>#<i>"``, i from 0).

    A slot suffix is digits after the last ``#``, so two (name, slot) pairs
    never make the same text.
    """
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"a semaphore has at least 1 slot, got {slots!r}")
    return [advisory_key("semaphore", f"{name}#{i}") for i in range(slots)]


def split_key(key: int) -> tuple[int, int]:
    """``(classid, objid)``: how ``pg_locks`` shows a ``bigint`` key (high, low 32 bits)."""
    if not -(1 << 63) <= key < (1 << 63):
        raise ValueError(f"advisory key {key!r} is not a signed 64-bit integer")
    unsigned = key % _INT64
    return unsigned >> 32, unsigned & 0xFFFFFFFF


# --------------------------------------------------------------------------- tables


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@final
@dataclass(frozen=True, slots=True)
class TableNames:
    """Where the backend's tables live: ``schema`` (``None``: the ``search_path``) and a prefix.

    Names are checked as plain SQL identifiers (letters, digits, ``_``, at
    most 63 bytes) so that they can be put into statements.
    """

    schema: str | None = None
    prefix: str = "aiolocks"

    def __post_init__(self) -> None:
        if self.schema is not None and not _IDENTIFIER.match(self.schema):
            raise ValueError(
                f"schema {self.schema!r} must be a plain SQL identifier (letters, digits, _)"
            )
        if not _IDENTIFIER.match(self.prefix) or len(self.prefix) > 40:
            raise ValueError(
                f"table prefix {self.prefix!r} must be a plain SQL identifier of at most 40 bytes"
            )

    def _qualified(self, suffix: str) -> str:
        name = _quote_ident(f"{self.prefix}_{suffix}")
        return name if self.schema is None else f"{_quote_ident(self.schema)}.{name}"

    @property
    def fencing(self) -> str:
        """The fencing table (``name`` → ``epoch``), quoted."""
        return self._qualified("fencing")

    @property
    def sequence(self) -> str:
        """The sequence of ``mode=advisory`` fencing tokens, quoted."""
        return self._qualified("fencing_seq")

    @property
    def leases(self) -> str:
        """The lease table of ``mode=lease``, quoted."""
        return self._qualified("leases")

    @property
    def acquire_function(self) -> str:
        """The lease-acquire function, quoted."""
        return self._qualified("lease_acquire_v2")

    @property
    def records(self) -> str:
        """The record table under the coordination recipes, quoted (see :mod:`._records`)."""
        return self._qualified("records")

    @property
    def records_channel(self) -> str:
        """The ``NOTIFY`` channel of record writes (a plain identifier; payload: the prefix)."""
        if self.schema is None:
            return f"{self.prefix}_records"
        return f"{self.schema}_{self.prefix}_records"

    @property
    def channel(self) -> str:
        """The ``NOTIFY`` channel of lease releases (a plain identifier)."""
        if self.schema is None:
            return f"{self.prefix}_released"
        return f"{self.schema}_{self.prefix}_released"

    @property
    def token_channel(self) -> str:
        """The ``NOTIFY`` channel where one backend asks another for a holder's token."""
        if self.schema is None:
            return f"{self.prefix}_token"
        return f"{self.schema}_{self.prefix}_token"

    def lookup_sql(self) -> str:
        """A query returning four booleans: fencing table, lease table, function, sequence exist."""

        def literal(text: str) -> str:
            return "'" + text.replace("'", "''") + "'"

        signature = f"{self.acquire_function}(text, int8, text, text, int4, float8)"
        return (
            f"SELECT to_regclass({literal(self.fencing)}) IS NOT NULL, "
            f"to_regclass({literal(self.leases)}) IS NOT NULL, "
            f"to_regprocedure({literal(signature)}) IS NOT NULL, "
            f"to_regclass({literal(self.sequence)}) IS NOT NULL"
        )


def ddl(names: TableNames) -> str:
    """The statements that create the fencing table and sequence, the lease table and its function.

    And the record table (:func:`records_ddl`), which :func:`ensure_schema`
    does not look for: where only it is missing (an upgrade), the record
    store creates it on first use, so lock users need nothing new.

    The sequence starts above the largest epoch already in the fencing table
    (created only when missing, so a running sequence is never set back).
    """
    return (
        _tables_ddl(names)
        + _sequence_ddl(names)
        + _acquire_function_ddl(names)
        + records_ddl(names)
    )


def records_ddl(names: TableNames) -> str:
    """The record table and its indexes (``CREATE … IF NOT EXISTS``)."""
    table = names.records
    index = f'"{names.prefix}_records_parent"'
    owners = f'"{names.prefix}_records_owner"'
    return f"""\
CREATE TABLE IF NOT EXISTS {table} (
    key        text        PRIMARY KEY,  -- "<prefix>/<child>"
    parent     text        NOT NULL,     -- "<prefix>"
    value      bytea       NOT NULL,
    version    bigint      NOT NULL,     -- nextval of the fencing sequence, every write
    expires_at timestamptz,              -- server time; NULL: no expiry
    session    bigint,                   -- mode=advisory ephemeral: the owner session's lock key
    owner      text,                     -- ephemeral: the writing backend's id
    tag        text        NOT NULL      -- minted by the writer (cleanup of a cancelled write)
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (parent);
CREATE INDEX IF NOT EXISTS {owners} ON {table} (owner) WHERE owner IS NOT NULL;
"""


def _tables_ddl(names: TableNames) -> str:
    """The fencing table (one epoch per name) and the lease table (one row per hold)."""
    fencing, leases = names.fencing, names.leases
    return f"""\
CREATE TABLE IF NOT EXISTS {fencing} (
    name  text   PRIMARY KEY,        -- "<family>/<lock name>"
    epoch bigint NOT NULL            -- the last fencing token handed out
);
CREATE TABLE IF NOT EXISTS {leases} (
    name       text        NOT NULL, -- "<family>/<lock name>"
    slot       integer     NOT NULL, -- 0: exclusive or writer; semaphore slot; reader number;
                                     -- < 0: a waiting writer (keeps new readers out)
    owner      text        NOT NULL, -- unique per hold
    epoch      bigint      NOT NULL, -- fencing token of the hold
    expires_at timestamptz NOT NULL, -- server time; renewed by the watchdog
    PRIMARY KEY (name, slot)
);
"""


def _sequence_ddl(names: TableNames) -> str:
    """The ``mode=advisory`` fencing sequence, created once above every epoch handed out."""
    fencing, sequence = names.fencing, names.sequence
    sequence_literal = "'" + sequence.replace("'", "''") + "'"
    return f"""\
-- mode=advisory fencing tokens; starts above every epoch already handed out.
-- Roles that take locks need SELECT, INSERT, UPDATE, DELETE on the tables and
-- USAGE on this sequence.
DO $aiolocks$
BEGIN
    IF to_regclass({sequence_literal}) IS NULL THEN
        CREATE SEQUENCE {sequence} AS bigint;
        PERFORM setval({sequence_literal},
                       coalesce((SELECT max(f.epoch) FROM {fencing} AS f), 0) + 1, false);
    END IF;
END
$aiolocks$;
"""


def _acquire_function_ddl(names: TableNames) -> str:
    """The ``mode=lease`` acquire function: one try, by mode, under a per-name lock."""
    fencing, leases, function = names.fencing, names.leases, names.acquire_function
    return f"""\
CREATE OR REPLACE FUNCTION {function}(
    p_name text, p_key int8, p_owner text, p_mode text, p_slots int4, p_ttl float8
) RETURNS TABLE (slot int4, epoch int8)
LANGUAGE plpgsql VOLATILE AS $aiolocks$
DECLARE
    v_now  timestamptz;
    v_slot int4;
BEGIN
    -- One acquirer of this name at a time; ends with this statement's transaction.
    PERFORM pg_advisory_xact_lock(p_key);
    v_now := clock_timestamp();
    DELETE FROM {leases} AS l WHERE l.name = p_name AND l.expires_at <= v_now;
    IF p_mode = 'exclusive' THEN
        IF EXISTS (SELECT 1 FROM {leases} AS l WHERE l.name = p_name) THEN RETURN; END IF;
        v_slot := 0;
    ELSIF p_mode = 'write' THEN
        IF EXISTS (SELECT 1 FROM {leases} AS l WHERE l.name = p_name AND l.slot >= 0) THEN
            -- Taken: mark this writer as waiting (one row per waiting writer,
            -- renewed by each of its tries, gone when it is granted, gives up
            -- or stops trying for two TTLs), which keeps new readers out.
            UPDATE {leases} AS l SET expires_at = v_now + make_interval(secs => 2 * p_ttl)
            WHERE l.name = p_name AND l.owner = p_owner AND l.slot < 0;
            IF NOT FOUND THEN
                INSERT INTO {leases} (name, slot, owner, epoch, expires_at)
                SELECT p_name, least(coalesce(min(l.slot), 0), 0) - 1, p_owner, 0,
                       v_now + make_interval(secs => 2 * p_ttl)
                FROM {leases} AS l WHERE l.name = p_name AND l.slot < 0;
            END IF;
            RETURN;
        END IF;
        DELETE FROM {leases} AS l WHERE l.name = p_name AND l.owner = p_owner AND l.slot < 0;
        v_slot := 0;
    ELSIF p_mode = 'shared' THEN
        -- a writer holds (slot 0) or waits (slot < 0): readers wait
        IF EXISTS (SELECT 1 FROM {leases} AS l WHERE l.name = p_name AND l.slot <= 0) THEN
            RETURN;
        END IF;
        SELECT coalesce(max(l.slot), 0) + 1 INTO v_slot FROM {leases} AS l WHERE l.name = p_name;
    ELSIF p_mode = 'slots' THEN
        SELECT s INTO v_slot FROM generate_series(0, p_slots - 1) AS s
        WHERE NOT EXISTS (SELECT 1 FROM {leases} AS l WHERE l.name = p_name AND l.slot = s)
        ORDER BY s LIMIT 1;
        IF v_slot IS NULL THEN RETURN; END IF;
    ELSE
        RAISE EXCEPTION 'aiolocks: unknown lease mode %', p_mode USING ERRCODE = '22023';
    END IF;
    INSERT INTO {fencing} AS f (name, epoch) VALUES (p_name, 1)
    ON CONFLICT (name) DO UPDATE SET epoch = f.epoch + 1
    RETURNING f.epoch INTO epoch;
    INSERT INTO {leases} (name, slot, owner, epoch, expires_at)
    VALUES (p_name, v_slot, p_owner, epoch, v_now + make_interval(secs => p_ttl));
    slot := v_slot;
    RETURN NEXT;
END
$aiolocks$;
"""


# --------------------------------------------------------------------------- queries


_HELD_WHERE: Final = (
    "locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 1 AND granted "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


@final
@dataclass(frozen=True, slots=True)
class AdvisoryQueries:
    """The statements of ``mode=advisory`` (asyncpg ``$n`` parameters).

    Grants return one row ``(epoch)`` (or ``(slot, epoch)`` for a semaphore)
    and no row when a ``try`` finds the lock taken; the epoch is the next
    value of the fencing sequence, drawn only once the lock is granted. ``$1``
    is the key (or the array of slot keys). The plain forms take nothing
    else (``lock_slot``: ``$2`` is the 0-based slot to wait for); the
    ``*_register`` forms also record the name in the fencing table (``$2`` the
    fencing name ``"<family>/<name>"``; ``lock_slot_register``: ``$3`` the slot).
    """

    try_exclusive: str
    lock_exclusive: str
    try_shared: str
    lock_shared: str
    try_slot: str
    lock_slot: str
    try_exclusive_register: str
    lock_exclusive_register: str
    try_shared_register: str
    lock_shared_register: str
    try_slot_register: str
    lock_slot_register: str
    next_token: str
    unlock_exclusive: str
    unlock_shared: str
    unlock_notify: str
    unlock_if_held: str
    join_shared: str
    held: str
    participants: str

    @classmethod
    def build(cls, names: TableNames) -> AdvisoryQueries:
        """The statements for the tables in ``names``."""
        token = f"nextval('{names.sequence.replace(chr(39), chr(39) * 2)}')"
        return cls(**_advisory_grants(names.fencing, token), **_advisory_others(token))


def _advisory_grants(fencing: str, token: str) -> dict[str, str]:
    """The grant statements of :class:`AdvisoryQueries`: try or wait, plain or registering."""

    def try_grant(call: str) -> str:
        # A one-time filter: the lock call runs first, nextval only when it
        # returned true (a refused try returns no row and draws nothing).
        return f"SELECT {token} AS epoch WHERE {call}($1)"

    def wait_grant(call: str) -> str:
        # The blocking calls return void; a subquery with a volatile call
        # is not pulled up, so nextval runs once the lock was granted.
        return f"SELECT {token} AS epoch FROM (SELECT {call}($1)) AS w"

    def register(grant: str, columns: str = "epoch") -> str:
        # The grant runs once (a CTE with a volatile call is materialized);
        # the name's row records the token (names for ``aiolocks list``).
        return (
            f"WITH g AS ({grant}), r AS (INSERT INTO {fencing} AS f (name, epoch) "
            "SELECT $2, g.epoch FROM g ON CONFLICT (name) DO UPDATE "
            "SET epoch = greatest(f.epoch, excluded.epoch)) "
            f"SELECT {columns} FROM g"
        )

    # LIMIT 1 over the scan stops at the first slot whose lock call
    # succeeds, so exactly one slot is taken (tests check this).
    try_slot = (
        "SELECT t.slot, "
        f"{token} AS epoch FROM (SELECT (s.i - 1)::int4 AS slot FROM unnest($1::int8[]) "
        "WITH ORDINALITY AS s(k, i) WHERE pg_try_advisory_lock(s.k) LIMIT 1) AS t"
    )

    def lock_slot(slot: str) -> str:
        return (
            f"SELECT w.slot, {token} AS epoch FROM (SELECT {slot}::int4 AS slot, "
            f"pg_advisory_lock(($1::int8[])[{slot} + 1])) AS w"
        )

    return {
        "try_exclusive": try_grant("pg_try_advisory_lock"),
        "lock_exclusive": wait_grant("pg_advisory_lock"),
        "try_shared": try_grant("pg_try_advisory_lock_shared"),
        "lock_shared": wait_grant("pg_advisory_lock_shared"),
        "try_slot": try_slot,
        # Waits for slot $2 (0-based) only: the caller picks which.
        "lock_slot": lock_slot("$2"),
        "try_exclusive_register": register(try_grant("pg_try_advisory_lock")),
        "lock_exclusive_register": register(wait_grant("pg_advisory_lock")),
        "try_shared_register": register(try_grant("pg_try_advisory_lock_shared")),
        "lock_shared_register": register(wait_grant("pg_advisory_lock_shared")),
        "try_slot_register": register(try_slot, "g.slot, g.epoch"),
        "lock_slot_register": register(lock_slot("$3"), "g.slot, g.epoch"),
        # Hand-offs inside one backend: the lock stays held; $1 new tokens
        # at once, for this hand-off and the next ones of the same chain.
        "next_token": f"SELECT {token} FROM generate_series(1, $1)",
    }


def _advisory_others(token: str) -> dict[str, str]:
    """The release, heartbeat and listing statements of :class:`AdvisoryQueries`."""
    return {
        "unlock_exclusive": "SELECT pg_advisory_unlock($1)",
        "unlock_shared": "SELECT pg_advisory_unlock_shared($1)",
        # A semaphore slot: unlock $1 and NOTIFY channel $2 with the
        # semaphore's name $3 (sent when the statement commits).
        "unlock_notify": "SELECT pg_advisory_unlock($1), pg_notify($2, $3)",
        # After a cancelled or failed grant: unlock once if this session
        # holds $1 in mode $2 ('ExclusiveLock' or 'ShareLock'); returns
        # whether it did. No WARNING when it does not hold it.
        "unlock_if_held": (
            "SELECT CASE WHEN $2 = 'ShareLock' THEN pg_advisory_unlock_shared($1) "
            "ELSE pg_advisory_unlock($1) END FROM pg_locks "
            f"WHERE {_HELD_WHERE} AND mode = $2 "
            "AND classid = (($1::int8 >> 32) & 4294967295)::oid "
            "AND objid = ($1::int8 & 4294967295)::oid"
        ),
        # A reader joining a shared lock its backend already holds: a
        # token ($1 the key) unless a session waits for the key
        # exclusively (a fresh shared try would be refused then: the
        # server keeps new readers out behind a queued writer).
        "join_shared": (
            f"SELECT {token} AS epoch WHERE NOT EXISTS (SELECT 1 FROM pg_locks "
            "WHERE locktype = 'advisory' AND objsubid = 1 AND NOT granted "
            "AND mode = 'ExclusiveLock' "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid = (($1::int8 >> 32) & 4294967295)::oid "
            "AND objid = ($1::int8 & 4294967295)::oid)"
        ),
        # The heartbeat: every advisory lock this session holds, as
        # (key, mode). Also keeps idle_session_timeout from ending an
        # idle holder.
        "held": (
            "SELECT (classid::int8 << 32) | objid::int8 AS key, mode FROM pg_locks "
            f"WHERE {_HELD_WHERE}"
        ),
        # Every session holding or waiting for key $1 in this database:
        # holders first, then waiters in the order they started waiting
        # (pg_locks.waitstart, PostgreSQL 14+).
        "participants": (
            "SELECT l.pid, l.mode, l.granted, a.application_name FROM pg_locks AS l "
            "LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.objsubid = 1 "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.classid = (($1::int8 >> 32) & 4294967295)::oid "
            "AND l.objid = ($1::int8 & 4294967295)::oid "
            "ORDER BY l.granted DESC, l.waitstart NULLS FIRST, l.pid"
        ),
    }


@final
@dataclass(frozen=True, slots=True)
class LeaseQueries:
    """The statements of ``mode=lease`` (asyncpg ``$n`` parameters).

    ``acquire``: ``$1`` fencing name, ``$2`` serializing key, ``$3`` owner,
    ``$4`` mode (``exclusive``/``shared``/``slots``), ``$5`` slots, ``$6`` TTL
    seconds; one row ``(slot, epoch)`` when granted, else none. ``renew``:
    ``$1`` name, ``$2`` slot, ``$3`` owner, ``$4`` epoch, ``$5`` TTL; the new
    expiry, or no row when the hold is gone (lost). ``release``: ``$1`` name,
    ``$2`` slot, ``$3`` owner, ``$4`` epoch; one row whose ``live`` is true
    when the hold was still ours and unexpired, false when it was lost.
    ``abandon``: ``$1`` name, ``$2`` owner; removes every row of that owner
    (what a cancelled acquire may have won) and says how many.
    """

    acquire: str
    renew: str
    release: str
    abandon: str
    listen: str
    holders: str

    @classmethod
    def build(cls, names: TableNames) -> LeaseQueries:
        """The statements for the tables in ``names``."""
        leases = names.leases
        match = "name = $1 AND slot = $2 AND owner = $3 AND epoch = $4"
        return cls(
            acquire=f"SELECT slot, epoch FROM {names.acquire_function}($1, $2, $3, $4, $5, $6)",
            renew=(
                f"UPDATE {leases} SET expires_at = clock_timestamp() + make_interval(secs => $5) "
                f"WHERE {match} AND expires_at > clock_timestamp() RETURNING expires_at"
            ),
            release=(
                f"WITH gone AS (DELETE FROM {leases} WHERE {match} RETURNING expires_at) "
                "SELECT coalesce((SELECT expires_at > clock_timestamp() FROM gone), false) "
                "AS live, "
                f"pg_notify('{names.channel}', $1)"
            ),
            # After a cancelled or failed acquire: drop whatever the owner
            # minted before the call may have won ($1 name, $2 owner).
            abandon=(
                f"WITH gone AS (DELETE FROM {leases} WHERE name = $1 AND owner = $2 "
                "RETURNING slot) "
                f"SELECT count(*) AS removed, pg_notify('{names.channel}', $1) FROM gone"
            ),
            listen=f'LISTEN "{names.channel}"',
            holders=(
                f"SELECT slot, owner, epoch, expires_at FROM {leases} "
                "WHERE name = $1 AND slot >= 0 AND expires_at > clock_timestamp() ORDER BY slot"
            ),
        )


# --------------------------------------------------------------------------- bootstrap


async def ensure_schema(conn: Connection, names: TableNames, *, create: bool = True) -> bool:
    """Make sure the fencing table, the lease table and the acquire function exist.

    Returns ``True`` when this call created something. Nothing is written when
    all three exist (a role without DDL rights works then). Creation runs in
    one implicit transaction behind a transaction-level advisory lock, so
    concurrent callers (even through a transaction pooler) do not collide.

    :raises PostgresSetupError: something is missing and ``create`` is false,
        or the role may not create it (SQLSTATE 42501); the message has the DDL.
    """
    row = await conn.fetchrow(names.lookup_sql())
    if row is not None and all(row):
        return False
    statements = ddl(names)
    if not create:
        raise PostgresSetupError(
            "the aiolocks lock tables do not exist (table creation is turned off)", ddl=statements
        )
    setup_key = advisory_key("setup", f"{names.schema or ''}.{names.prefix}")
    try:
        # No parameters: the simple protocol sends every statement in one
        # round trip, as one implicit transaction.
        await conn.execute(f"SELECT pg_advisory_xact_lock({setup_key});\n{statements}")
    except Exception as exc:
        if getattr(exc, "sqlstate", None) == "42501":
            raise PostgresSetupError(
                f"this role may not create the aiolocks lock tables ({exc})", ddl=statements
            ) from exc
        raise
    return True


# --------------------------------------------------------------------------- sessions


@final
@dataclass(frozen=True, slots=True)
class SessionProbe:
    """What :func:`probe_session` found about the path to the server session."""

    #: The pid the login reported (BackendKeyData).
    login_pid: int
    #: ``pg_backend_pid()`` of each probing statement.
    backend_pids: tuple[int, ...]
    #: The server's ``server_version_num`` as the session reports it.
    server_version: int

    @property
    def pooled(self) -> bool:
        """``True`` when a pooler sits between us and the server session.

        Either the login pid is not the session's pid (the pooler answered the
        login), or two statements ran in two server sessions.
        """
        return any(pid != self.login_pid for pid in self.backend_pids)

    @property
    def session_moved(self) -> bool:
        """``True`` when two statements of one connection ran in two server sessions."""
        return len(set(self.backend_pids)) > 1

    def describe(self) -> str:
        """A sentence for an error message or a log record."""
        if self.session_moved:
            return (
                "statements of one connection ran in different server sessions "
                f"(pids {sorted(set(self.backend_pids))}): a transaction-pooling proxy"
            )
        if self.pooled:
            return (
                f"the login reported pid {self.login_pid} but the session is pid "
                f"{self.backend_pids[0]}: a connection pooler answers the login"
            )
        return f"a direct session (pid {self.login_pid})"


async def probe_session(conn: Connection, *, statements: int = 3) -> SessionProbe:
    """Find out whether ``conn`` reaches one real server session (see the module notes).

    Runs ``statements`` separate statements (separate transactions) and
    compares their ``pg_backend_pid()`` with the pid of the login.
    """
    if statements < 1:
        raise ValueError(f"statements must be >= 1, got {statements!r}")
    pids: list[int] = []
    version = 0
    for _ in range(statements):
        row = await conn.fetchrow(
            "SELECT pg_backend_pid(), current_setting('server_version_num')::int4"
        )
        pids.append(int(row[0]))
        version = int(row[1])
    return SessionProbe(
        login_pid=int(conn.get_server_pid()), backend_pids=tuple(pids), server_version=version
    )


async def configure_keepalives(
    conn: Connection, *, idle: float, interval: float, count: int, user_timeout: float | None = None
) -> bool:
    """Turn TCP keep-alives on at both ends of ``conn``'s session.

    The server side through the session's ``tcp_keepalives_idle``,
    ``tcp_keepalives_interval``, ``tcp_keepalives_count`` (and
    ``tcp_user_timeout``); the client side on asyncpg's socket, which asyncpg
    has no option for (:func:`._asyncpg_compat.client_socket`: on an asyncpg
    release outside its version gate only the server side is set). Returns
    ``True`` when the client socket was set (a Unix-domain socket has no
    keep-alives; the server ignores the settings there too). Session
    settings: for a dedicated connection, never through a transaction
    pooler (they would stick to a pooled server session).
    """
    if idle < 1 or interval < 1 or count < 1:
        raise ValueError(
            f"keep-alive idle, interval and count must be >= 1 (got {idle}, {interval}, {count})"
        )
    timeout_ms = 0 if user_timeout is None else max(1, round(user_timeout * 1000))
    await conn.execute(
        "SELECT set_config('tcp_keepalives_idle', $1, false), "
        "set_config('tcp_keepalives_interval', $2, false), "
        "set_config('tcp_keepalives_count', $3, false), "
        "set_config('tcp_user_timeout', $4, false)",
        str(round(idle)),
        str(round(interval)),
        str(count),
        str(timeout_ms),
    )
    from ._asyncpg_compat import client_socket  # (asyncpg is imported only when used)

    sock = client_socket(conn)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", round(idle)),
        ("TCP_KEEPINTVL", round(interval)),
        ("TCP_KEEPCNT", count),
        ("TCP_USER_TIMEOUT", timeout_ms),
    ):
        number = getattr(socket, option, None)
        if number is not None:
            sock.setsockopt(socket.IPPROTO_TCP, number, value)
    return True


async def held_advisory_locks(
    conn: Connection, queries: AdvisoryQueries
) -> dict[int, frozenset[str]]:
    """The heartbeat: ``{key: modes}`` of every advisory lock ``conn``'s session holds.

    A mode is ``"ExclusiveLock"`` or ``"ShareLock"``; one session may hold
    both on one key (a writer that also reads).
    """
    held: dict[int, set[str]] = {}
    for row in await conn.fetch(queries.held):
        held.setdefault(int(row[0]), set()).add(str(row[1]))
    return {key: frozenset(modes) for key, modes in held.items()}


def lost_keys(expected: Iterable[tuple[int, bool]], held: Mapping[int, frozenset[str]]) -> set[int]:
    """The keys we believe held, as ``(key, shared)`` pairs, that the heartbeat did not find."""
    lost: set[int] = set()
    for key, shared in expected:
        if ("ShareLock" if shared else "ExclusiveLock") not in held.get(key, frozenset()):
            lost.add(key)
    return lost
