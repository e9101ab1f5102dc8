"""PostgreSQL administration: list the locks in use, force-release one.

``mode=advisory``: an advisory key is a hash, so names come from the fencing
table (every name that was ever granted has a row), and a name is in use when
one of its keys shows in ``pg_locks`` (held or waited for). An advisory lock
can only be released by the session that holds it, so force-release
*terminates the holder's server session* (``pg_terminate_backend``): every
other lock that session holds goes too, and its client sees the session end
(its holds are lost at once). The role running it needs the right to signal
that session (superuser, the same role, or ``pg_signal_backend``). Only
sessions aiolocks opened are ended: their ``application_name`` is this
backend's (``aiolocks`` unless the URL sets another), or, for a leader
latch, the session is the latch's own (named after its participant). A
session of another program that happens to hold the same advisory key is
left alone and logged; each session ended is logged at WARNING (the command
line prints it).

``mode=lease``: names are the lease rows; force-release deletes the rows and
notifies waiters. The holder notices at its next renewal (every third of
``lease_time``) and its hold is lost.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, final

from .._core.admin import KINDS, name_matches
from .._core.driver import Family
from ._sql import LeaseQueries, TableNames, advisory_key, slot_keys

if TYPE_CHECKING:
    from ._driver import PostgresAdvisoryDriver

__all__ = ["MAX_ADMIN_SLOTS", "PostgresAdvisoryAdmin", "PostgresLeaseAdmin", "parse_fencing_name"]

logger = logging.getLogger("aiolocks.postgres")

#: who a session holding a key is: (application_name, user, client address)
_WHO: Final = (
    "SELECT pid, coalesce(application_name, ''), coalesce(usename, ''), "
    "coalesce(host(client_addr), 'local') FROM pg_stat_activity WHERE pid = ANY($1::int[])"
)

#: slots of a semaphore looked for in ``pg_locks`` (a slot's key says nothing of the count)
MAX_ADMIN_SLOTS: Final = 256

_DATABASE: Final = "(SELECT oid FROM pg_database WHERE datname = current_database())"

#: every advisory lock of this database: (key, pid, granted)
_ADVISORY_KEYS: Final = (
    "SELECT (classid::int8 << 32) | objid::int8 AS key, pid, granted FROM pg_locks "
    f"WHERE locktype = 'advisory' AND objsubid = 1 AND database = {_DATABASE}"
)


def parse_fencing_name(text: str) -> tuple[Family, str] | None:
    """``(family, name)`` of a ``"<family>/<name>"`` row name; ``None`` for anything else."""
    family_value, sep, name = text.partition("/")
    family = KINDS.get(family_value)
    if not sep or family is None or not name:
        return None
    return family, name


def _like_prefix(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%/{escaped}%"


def _keys(family: Family, name: str) -> list[int]:
    if family is Family.SEMAPHORE:
        return slot_keys(name, MAX_ADMIN_SLOTS)
    return [advisory_key(family.value, name)]


@final
class PostgresAdvisoryAdmin:
    """:class:`aiolocks._core.admin.AdminDriver` for ``mode=advisory`` (see the module notes)."""

    def __init__(self, driver: PostgresAdvisoryDriver) -> None:
        self._driver = driver

    async def _advisory(self) -> list[tuple[int, int, bool]]:
        primary = await self._driver._get_primary()
        rows = await primary.fetch(_ADVISORY_KEYS)
        return [(int(r[0]), int(r[1]), bool(r[2])) for r in rows]

    async def lock_names(self, prefix: str) -> list[tuple[Family, str]]:
        """Fencing-table names under ``prefix`` whose keys show in ``pg_locks``."""
        primary = await self._driver._get_primary()
        in_use = {key for key, _pid, _granted in await self._advisory()}
        if not in_use:
            return []
        rows = await primary.fetch(
            f"SELECT name FROM {self._driver._tables.fencing} WHERE name LIKE $1",
            _like_prefix(prefix),
        )
        found: list[tuple[Family, str]] = []
        for row in rows:
            parsed = parse_fencing_name(str(row[0]))
            if parsed is None or not name_matches(parsed[1], prefix):
                continue
            family, name = parsed
            keys = _keys(family, name)
            used = [i for i, key in enumerate(keys) if key in in_use]
            if used:
                if family is Family.SEMAPHORE:
                    # participants() then looks at every slot seen in use
                    slots = self._driver._slots
                    slots[name] = max(slots.get(name, 1), used[-1] + 1)
                found.append(parsed)
        return sorted(found, key=lambda e: (e[1], e[0].value))

    async def force_release(self, name: str, family: Family) -> int:
        """Terminate every session holding a key of ``name``; the number of holds removed."""
        keys = set(_keys(family, name))
        holders: dict[int, int] = {}
        for key, pid, granted in await self._advisory():
            if granted and key in keys:
                holders[pid] = holders.get(pid, 0) + 1
        if not holders:
            return 0
        primary = await self._driver._get_primary()
        own = primary.pid
        ours = str((await primary.fetch("SELECT current_setting('application_name')"))[0][0])
        who = {
            int(r[0]): (str(r[1]), str(r[2]), str(r[3]))
            for r in await primary.fetch(_WHO, list(holders))
        }
        removed = 0
        for pid, count in holders.items():
            if pid == own:
                # Our own primary session: ending it ends the connection under us.
                primary.conn.terminate()
                self._driver._session_ended(primary, "force-released by an administrator")
                removed += count
                continue
            app, user, client = who.get(pid, ("", "", "?"))
            if app != ours and family is not Family.LEADER:
                logger.warning(
                    "not ending PostgreSQL session pid=%d (application_name=%r, user=%r, "
                    "client %s): it holds the advisory key of %r but is not an aiolocks "
                    "session of application_name=%r",
                    pid, app, user, client, name, ours,
                )  # fmt: skip
                continue
            logger.warning(
                "ending PostgreSQL session pid=%d (application_name=%r, user=%r, client %s) "
                "that holds %r",
                pid, app, user, client, name,
            )  # fmt: skip
            rows = await primary.fetch("SELECT pg_terminate_backend($1)", pid)
            if rows and rows[0][0]:
                removed += count
        return removed


@final
class PostgresLeaseAdmin:
    """:class:`aiolocks._core.admin.AdminDriver` for ``mode=lease``: the lease rows."""

    def __init__(self, pool: Any, queries: LeaseQueries, tables: TableNames, describe: str) -> None:
        self._pool = pool
        self._tables = tables
        self._describe = describe
        self._queries = queries

    async def lock_names(self, prefix: str) -> list[tuple[Family, str]]:
        """Names with a live lease row under ``prefix``."""
        rows = await self._pool.fetch(
            f"SELECT DISTINCT name FROM {self._tables.leases} "
            "WHERE name LIKE $1 AND expires_at > clock_timestamp()",
            _like_prefix(prefix),
        )
        found = []
        for row in rows:
            parsed = parse_fencing_name(str(row[0]))
            if parsed is not None and name_matches(parsed[1], prefix):
                found.append(parsed)
        return sorted(found, key=lambda e: (e[1], e[0].value))

    async def force_release(self, name: str, family: Family) -> int:
        """Delete every live row of ``name`` and wake its waiters; the number deleted."""
        fencing = f"{family.value}/{name}"
        value = await self._pool.fetchval(
            f"WITH gone AS (DELETE FROM {self._tables.leases} WHERE name = $1 "
            "RETURNING slot >= 0 AND expires_at > clock_timestamp() AS live) "
            f"SELECT count(*) FILTER (WHERE live), pg_notify('{self._tables.channel}', $1) "
            "FROM gone",
            fencing,
        )
        return int(value or 0)
