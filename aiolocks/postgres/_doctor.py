"""``doctor`` for PostgreSQL: the server settings that quietly break PostgreSQL locks.

``mode=advisory`` locks live as long as the server session that took them,
so what matters is whether the client really has a session of its own (a
transaction pooler in the way makes session locks meaningless), how soon the
server notices a holder that vanished behind a network partition (TCP
keep-alives), and whether the server ends idle sessions before the heartbeat
keeps them busy. ``mode=lease`` keeps rows, so what matters is whether a
commit survives a crash or a failover (``synchronous_commit``, synchronous
replication) and whether renewals come often enough for
``idle_session_timeout``. Both modes share the lock table capacity and the
fencing table, and how open the deployment is (:mod:`._doctor_security`).

The checks run on a connection of their own, opened for the diagnosis (so
that they also work when the backend refused to open, e.g. behind a pooler)
and read ``pg_settings``; the rules are pure functions of the values read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from .._core.doctor import Diagnosis, Finding, Severity
from ._doctor_security import plaintext_finding, read_security, superuser_finding
from ._sql import SessionProbe, probe_session

__all__ = [
    "SETTINGS",
    "capacity_finding",
    "diagnose_postgres",
    "durability_findings",
    "idle_session_finding",
    "keepalive_finding",
    "lock_table_capacity",
    "listener_finding",
    "pooler_finding",
    "read_settings",
]

#: the ``pg_settings`` rows the checks read
SETTINGS: Final = (
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
    "tcp_user_timeout",
    "idle_session_timeout",
    "max_locks_per_transaction",
    "max_connections",
    "max_prepared_transactions",
    "autovacuum_max_workers",
    "max_worker_processes",
    "max_wal_senders",
    "synchronous_commit",
    "synchronous_standby_names",
)

#: server keep-alive idle above this (seconds) leaves a partitioned holder's lock held
KEEPALIVE_IDLE_LIMIT: Final = 300
#: what Linux uses when ``tcp_keepalives_idle`` is 0 (the system default)
LINUX_DEFAULT_IDLE: Final = 7200
#: share of the shared lock table in use that is worth a warning
LOCK_TABLE_WARNING: Final = 0.5
#: a per-query bound for the checks (a stalled server must not hang doctor)
CHECK_TIMEOUT: Final = 5.0


async def read_settings(conn: Any) -> dict[str, str]:
    """``{name: setting}`` of :data:`SETTINGS` as the server's defaults give them.

    ``reset_val`` is what a new session starts with (``ALTER SYSTEM``, the
    configuration file, role and database settings), not a value this
    connection may have set for itself. Settings the server does not have
    (``idle_session_timeout`` before PostgreSQL 14) are left out.
    """
    rows = await conn.fetch(
        "SELECT name, reset_val FROM pg_settings WHERE name = ANY($1::text[])",
        list(SETTINGS),
        timeout=CHECK_TIMEOUT,
    )
    return {str(row[0]): str(row[1]) for row in rows}


def _int(settings: Mapping[str, str], name: str, default: int = 0) -> int:
    try:
        return int(settings.get(name, default))
    except ValueError:
        return default


# -- rules (pure: values in, findings out) ----------------------------------------------


def pooler_finding(probe: SessionProbe, mode: str, label: str) -> Finding | None:
    """Advisory mode behind a pooler: critical. Lease mode: nothing (it is built for it)."""
    if not probe.pooled or mode != "advisory":
        return None
    return Finding(
        code="postgres-pooler",
        severity=Severity.CRITICAL,
        title=f"{label}: {probe.describe()}",
        breaks=(
            "session advisory locks belong to the server session, and a pooler hands each "
            "statement to any server session: a lock is taken in one session and checked or "
            "released in another, so two clients can hold it (aiolocks refuses to open)"
        ),
        fix=(
            "connect mode=advisory straight to PostgreSQL (or to a session-pooling proxy), "
            "or use mode=lease, which works through a transaction pooler"
        ),
        details={
            "login_pid": probe.login_pid,
            "backend_pids": list(probe.backend_pids),
            "mode": mode,
        },
    )


def listener_finding(probe: SessionProbe, label: str) -> Finding | None:
    """``mode=lease``: the ``LISTEN`` connection goes through a pooler (waits poll)."""
    if not probe.pooled:
        return None
    return Finding(
        code="postgres-listen-pooled",
        severity=Severity.WARNING,
        title=f"{label}: the release listener goes through a pooler ({probe.describe()})",
        breaks=(
            "LISTEN needs a session of its own, so waiters are not woken by releases and "
            "try again only every lease_time: waits last up to lease_time longer"
        ),
        fix="give the backend listen_url= with a direct connection to the server",
        details={"login_pid": probe.login_pid, "backend_pids": list(probe.backend_pids)},
    )


def keepalive_finding(settings: Mapping[str, str], label: str) -> Finding | None:
    """Server keep-alive idle of 0 (system default, two hours on Linux) or above five minutes."""
    if "tcp_keepalives_idle" not in settings:
        return None
    idle = _int(settings, "tcp_keepalives_idle")
    interval = _int(settings, "tcp_keepalives_interval")
    count = _int(settings, "tcp_keepalives_count")
    user_timeout = _int(settings, "tcp_user_timeout")
    if 0 < idle <= KEEPALIVE_IDLE_LIMIT:
        return None
    if 0 < user_timeout <= KEEPALIVE_IDLE_LIMIT * 1000:
        return None
    shown = f"{idle} s" if idle else f"0 (system default, {LINUX_DEFAULT_IDLE} s on Linux)"
    return Finding(
        code="postgres-tcp-keepalives",
        severity=Severity.WARNING,
        title=f"{label}: server tcp_keepalives_idle is {shown}",
        breaks=(
            "a holder cut off by a network partition keeps its advisory locks until the "
            "server notices the dead connection, which takes this long: other clients wait "
            "that long (aiolocks sets short keep-alives on its own sessions, but a session "
            "opened by anything else, or one whose settings were reset, gets this default)"
        ),
        fix=(
            "set tcp_keepalives_idle = 30, tcp_keepalives_interval = 5, "
            "tcp_keepalives_count = 3 (or tcp_user_timeout) in postgresql.conf"
        ),
        details={
            "tcp_keepalives_idle": idle,
            "tcp_keepalives_interval": interval,
            "tcp_keepalives_count": count,
            "tcp_user_timeout_ms": user_timeout,
        },
    )


def idle_session_finding(
    settings: Mapping[str, str], mode: str, interval: float, label: str
) -> Finding | None:
    """``idle_session_timeout`` at or below the heartbeat (advisory) or renewal (lease) period.

    :param interval: seconds between two statements of a holder's connection:
        ``heartbeat / 2`` (advisory) or ``lease_time / 3`` (lease)
    """
    timeout_ms = _int(settings, "idle_session_timeout")
    if timeout_ms <= 0 or timeout_ms / 1000 > 2 * interval:
        return None
    if mode == "advisory":
        severity = Severity.CRITICAL
        breaks = (
            "the server ends a session idle that long, and the session's advisory locks go "
            "with it: a holder between two heartbeats loses its locks"
        )
        fix = (
            "raise idle_session_timeout well above heartbeat (or set it to 0 for the lock "
            "role: ALTER ROLE … SET idle_session_timeout = 0), or lower heartbeat"
        )
    else:
        severity = Severity.WARNING
        breaks = (
            "the server ends pooled connections idle that long: renewals then fail on a "
            "dead connection and a hold can be lost before its lease runs out"
        )
        fix = "raise idle_session_timeout well above lease_time / 3, or lower lease_time"
    return Finding(
        code="postgres-idle-session-timeout",
        severity=severity,
        title=(
            f"{label}: idle_session_timeout is {timeout_ms} ms, against a statement every "
            f"{interval:g} s"
        ),
        breaks=breaks,
        fix=fix,
        details={"idle_session_timeout_ms": timeout_ms, "interval_s": interval, "mode": mode},
    )


def lock_table_capacity(settings: Mapping[str, str]) -> tuple[int, int, int]:
    """``(capacity, max_locks_per_transaction, backends)`` of the shared lock table.

    The server sizes it for ``max_locks_per_transaction`` locks per backend
    slot: client connections, prepared transactions, autovacuum and other
    background workers, WAL senders, and one more.
    """
    per_tx = _int(settings, "max_locks_per_transaction", 64)
    backends = (
        _int(settings, "max_connections", 100)
        + _int(settings, "max_prepared_transactions")
        + _int(settings, "autovacuum_max_workers")
        + _int(settings, "max_worker_processes")
        + _int(settings, "max_wal_senders")
        + 1
    )
    return per_tx * backends, per_tx, backends


def capacity_finding(settings: Mapping[str, str], in_use: int, label: str) -> Finding | None:
    """Locks in use above half the shared lock table (advisory locks live there too)."""
    capacity, per_tx, slots = lock_table_capacity(settings)
    if capacity <= 0 or in_use < capacity * LOCK_TABLE_WARNING:
        return None
    return Finding(
        code="postgres-lock-table",
        severity=Severity.WARNING,
        title=(
            f"{label}: {in_use} locks in use of about {capacity} the lock table holds "
            f"(max_locks_per_transaction {per_tx} x {slots} backend slots)"
        ),
        breaks=(
            "advisory locks share the server's lock table with every transaction: when it is "
            "full, lock calls and ordinary queries fail with 'out of shared memory'"
        ),
        fix="raise max_locks_per_transaction (needs a restart), or hold fewer locks at once",
        details={"in_use": in_use, "capacity": capacity, "max_locks_per_transaction": per_tx},
    )


def durability_findings(
    settings: Mapping[str, str], mode: str, standbys: int, label: str
) -> list[Finding]:
    """Commits that a crash or a failover can lose: fencing epochs and (lease) held rows."""
    out: list[Finding] = []
    commit = settings.get("synchronous_commit", "on")
    if commit in ("off", "local") and not (commit == "local" and standbys == 0):
        held = " and held lease rows" if mode == "lease" else ""
        out.append(
            Finding(
                code="postgres-synchronous-commit",
                severity=Severity.WARNING,
                title=f"{label}: synchronous_commit is {commit}",
                breaks=(
                    f"a crash (or failover) can lose the last commits: fencing epochs{held} "
                    "go back, so a token is handed out twice"
                    + (" and a second client gets a lock that is held" if mode == "lease" else "")
                ),
                fix="set synchronous_commit = on (for the lock role at least)",
                details={"synchronous_commit": commit, "standbys": standbys},
            )
        )
    names = settings.get("synchronous_standby_names", "").strip()
    if mode == "lease" and standbys > 0 and not names:
        out.append(
            Finding(
                code="postgres-async-replication",
                severity=Severity.WARNING,
                title=f"{label}: {standbys} standby(s) replicate asynchronously",
                breaks=(
                    "a failover to a standby that missed the last commits forgets lease rows: "
                    "a second client gets a lock whose holder still runs until its next renewal"
                ),
                fix=(
                    "set synchronous_standby_names (with synchronous_commit = on or "
                    "remote_apply), or keep a promoted standby out of service for lease_time"
                ),
                details={"standbys": standbys},
            )
        )
    return out


# -- the run --------------------------------------------------------------------------


async def diagnose_postgres(
    connect: Callable[[], Awaitable[Any]],
    drop: Callable[[Any], Awaitable[None]],
    *,
    mode: str,
    label: str,
    interval: float,
    timeout: float,
    listen: Callable[[], Awaitable[Any]] | None = None,
    server_time: Callable[[], Awaitable[float]] | None = None,
) -> Diagnosis:
    """Every PostgreSQL check, on a connection of its own.

    :param connect: opens the connection the checks use (``drop`` closes it)
    :param mode: ``"advisory"`` or ``"lease"``
    :param interval: seconds between a holder's statements (heartbeat or renewal)
    :param timeout: the self-test's budget (``heartbeat`` or ``lease_time``)
    :param listen: ``mode=lease``: opens the release listener's connection
    :param server_time: reads the server clock (on the backend's own session or pool)
    """
    conn = await connect()
    try:
        probe = await probe_session(conn, statements=2)
        settings = await read_settings(conn)
        in_use = int(await conn.fetchval("SELECT count(*) FROM pg_locks", timeout=CHECK_TIMEOUT))
        standbys = int(
            await conn.fetchval("SELECT count(*) FROM pg_stat_replication", timeout=CHECK_TIMEOUT)
        )
        facts = await read_security(conn, CHECK_TIMEOUT)
    finally:
        await drop(conn)
    findings: list[Finding] = []
    pooled = pooler_finding(probe, mode, label)
    if pooled is not None:
        findings.append(pooled)
    if mode == "advisory":
        keep = keepalive_finding(settings, label)
        if keep is not None:
            findings.append(keep)
    idle = idle_session_finding(settings, mode, interval, label)
    if idle is not None:
        findings.append(idle)
    table = capacity_finding(settings, in_use, label)
    if table is not None:
        findings.append(table)
    findings.extend(durability_findings(settings, mode, standbys, label))
    exposed = (
        plaintext_finding(facts, pooled=probe.pooled, label=label),
        superuser_finding(facts, label),
    )
    findings.extend(f for f in exposed if f is not None)
    if listen is not None:
        listener = await listen()
        try:
            heard = listener_finding(await probe_session(listener, statements=2), label)
        finally:
            listener.terminate()
        if heard is not None:
            findings.append(heard)

    return Diagnosis(
        findings=findings,
        timeout=timeout,
        timeout_name="heartbeat" if mode == "advisory" else "lease_time",
        server_time=None if pooled is not None else server_time,
    )
