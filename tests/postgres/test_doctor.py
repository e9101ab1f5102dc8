"""``backend.doctor()`` on PostgreSQL: every finding seen present and absent on a real server.

Settings are changed per role (``ALTER ROLE … SET``) on a role made for the
test, so the shared server and the other tests never see them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
import pytest_asyncio

import aiolocks
import aiolocks.postgres
from aiolocks import Severity
from aiolocks.postgres._doctor import (
    capacity_finding,
    durability_findings,
    idle_session_finding,
    keepalive_finding,
    lock_table_capacity,
    read_settings,
)
from aiolocks.testing import PgBouncer, PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]

RoleUrl = Callable[..., Awaitable[str]]


@pytest_asyncio.fixture
async def role_url(postgres_server: PostgresServer) -> AsyncIterator[RoleUrl]:
    """Make a superuser role with the given settings; returns a URL logging in as it."""
    admin = await asyncpg.connect(postgres_server.url)
    made: list[str] = []

    async def make(query: str = "", **settings: str) -> str:
        role = f"doc_{uuid.uuid4().hex[:10]}"
        made.append(role)
        await admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
        for name, value in settings.items():
            await admin.execute(f"ALTER ROLE {role} SET {name} = '{value}'")
        url = f"postgresql://{role}@{postgres_server.host}:{postgres_server.port}/"
        return url + postgres_server.database + (f"?{query}" if query else "")

    try:
        yield make
    finally:
        for role in made:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
            )
        admin.terminate()


async def _codes(url: str, **options: object) -> dict[str, Severity]:
    async with aiolocks.connect(url, **options) as backend:
        report = await backend.doctor()
    assert report.self_test is not None and report.self_test.ok, report.render()
    return {f.code: f.severity for f in report.findings}


async def test_keepalive_idle_of_the_system_default_is_a_warning(role_url: RoleUrl) -> None:
    default = await _codes(await role_url(tcp_keepalives_idle="0"))
    assert default["postgres-tcp-keepalives"] is Severity.WARNING
    hours = await _codes(await role_url(tcp_keepalives_idle="7200"))
    assert "postgres-tcp-keepalives" in hours
    short = await _codes(await role_url(tcp_keepalives_idle="30"))
    assert "postgres-tcp-keepalives" not in short
    # lease mode does not depend on the session staying up
    lease = await _codes(await role_url("mode=lease", tcp_keepalives_idle="0"))
    assert "postgres-tcp-keepalives" not in lease


async def test_idle_session_timeout_against_the_heartbeat(role_url: RoleUrl) -> None:
    # heartbeat 10: a statement every 5 s; 8 s of idle timeout can end a holder
    tight = await _codes(await role_url("heartbeat=10", idle_session_timeout="8s"))
    assert tight["postgres-idle-session-timeout"] is Severity.CRITICAL
    loose = await _codes(await role_url("heartbeat=1", idle_session_timeout="8s"))
    assert "postgres-idle-session-timeout" not in loose
    off = await _codes(await role_url("heartbeat=10", idle_session_timeout="0"))
    assert "postgres-idle-session-timeout" not in off
    lease = await _codes(await role_url("mode=lease&lease_time=30", idle_session_timeout="8s"))
    assert lease["postgres-idle-session-timeout"] is Severity.WARNING
    short = await _codes(await role_url("mode=lease&lease_time=3", idle_session_timeout="8s"))
    assert "postgres-idle-session-timeout" not in short


async def test_synchronous_commit_off_is_a_warning(role_url: RoleUrl) -> None:
    off = await _codes(await role_url("mode=lease", synchronous_commit="off"))
    assert off["postgres-synchronous-commit"] is Severity.WARNING
    advisory = await _codes(await role_url(synchronous_commit="off"))
    assert "postgres-synchronous-commit" in advisory  # the fencing epochs
    on = await _codes(await role_url("mode=lease", synchronous_commit="on"))
    assert "postgres-synchronous-commit" not in on
    # no standby here: nothing replicates asynchronously
    assert "postgres-async-replication" not in off


async def test_lock_table_filling_up_is_a_warning(
    postgres_server: PostgresServer, role_url: RoleUrl
) -> None:
    url = await role_url()
    assert "postgres-lock-table" not in await _codes(url)
    filler = await asyncpg.connect(postgres_server.url)
    try:
        settings = await read_settings(filler)
        empty = capacity_finding(settings, 0, "x")
        assert empty is None
        capacity = lock_table_capacity(settings)[0]
        base = 7_000_000_000
        taken = await filler.fetchval(
            "SELECT count(pg_advisory_lock(k)) FROM generate_series($1::int8, $2::int8) AS k",
            base,
            base + capacity * 6 // 10,
        )
        assert taken > capacity // 2
        codes = await _codes(url)
        assert codes["postgres-lock-table"] is Severity.WARNING
    finally:
        filler.terminate()


async def test_pooler_is_critical_for_advisory_and_fine_for_lease(
    postgres_server: PostgresServer, pgbouncer: PgBouncer
) -> None:
    backend = aiolocks.postgres.PostgresBackend(pgbouncer.url)  # refuses to open
    try:
        report = await backend.doctor()
    finally:
        await backend.close()
    assert report.exit_status == 1
    assert report.get("backend-unreachable") is not None
    pooled = report.get("postgres-pooler")
    assert pooled is not None and pooled.severity is Severity.CRITICAL
    assert "mode=lease" in pooled.fix
    direct = await _codes(postgres_server.url)
    assert "postgres-pooler" not in direct
    # lease mode through the bouncer works; only the listener needs a direct session
    lease = await _codes(pgbouncer.url + "?mode=lease&lease_time=5")
    assert "postgres-pooler" not in lease
    assert lease["postgres-listen-pooled"] is Severity.WARNING
    async with aiolocks.postgres.PostgresBackend(
        pgbouncer.url + "?mode=lease&lease_time=5", listen_url=postgres_server.url
    ) as listening:
        listened = await listening.doctor()
    assert listened.get("postgres-listen-pooled") is None
    assert listened.self_test is not None and listened.self_test.ok


async def test_clock_offset_and_timeouts_are_measured(postgres_server: PostgresServer) -> None:
    async with aiolocks.connect(postgres_server.url + "?heartbeat=4") as backend:
        report = await backend.doctor()
    test = report.self_test
    assert test is not None and test.ok
    assert test.timeout == 4 and test.timeout_name == "heartbeat"
    assert test.clock_offset is not None and test.clock_uncertainty is not None
    assert report.get("clock-offset") is None  # same machine, same clock
    assert len(test.fencing_tokens) >= 2 and test.tokens_increasing
    async with aiolocks.connect(postgres_server.url + "?mode=lease&lease_time=9") as backend:
        lease = await backend.doctor()
    assert lease.self_test is not None and lease.self_test.timeout_name == "lease_time"
    assert lease.self_test.timeout == 9 and lease.self_test.clock_offset is not None


async def test_rules_on_values_a_test_server_cannot_show() -> None:
    # a streaming standby without synchronous_standby_names (no replica here)
    settings = {"synchronous_commit": "on", "synchronous_standby_names": ""}
    (found,) = durability_findings(settings, "lease", 1, "db")
    assert found.code == "postgres-async-replication"
    assert (
        durability_findings({**settings, "synchronous_standby_names": "s1"}, "lease", 1, "db") == []
    )
    assert durability_findings(settings, "advisory", 1, "db") == []
    # local commit is only a loss with a standby to fail over to
    assert durability_findings({"synchronous_commit": "local"}, "lease", 0, "db") == []
    assert durability_findings({"synchronous_commit": "local"}, "lease", 1, "db")
    # tcp_user_timeout alone bounds the wait too
    assert (
        keepalive_finding({"tcp_keepalives_idle": "0", "tcp_user_timeout": "20000"}, "db") is None
    )
    assert idle_session_finding({}, "advisory", 2.5, "db") is None
