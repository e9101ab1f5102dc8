"""The least-privilege PostgreSQL grants of docs/security.md are enough, in both modes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

import aiolocks
from aiolocks.testing import PostgresServer

from ..refusals import assert_acquire_refused

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


@pytest_asyncio.fixture
async def locker(postgres_server: PostgresServer) -> AsyncIterator[tuple[str, str]]:
    """(role, table prefix): tables made by the owner, a role with only the documented grants."""
    tag = uuid.uuid4().hex[:8]
    role, prefix = f"locker_{tag}", f"sec_{tag}"
    owner_url = f"{postgres_server.url}?table_prefix={prefix}&mode=lease"
    async with aiolocks.connect(owner_url):  # creates the tables, sequence and function
        pass
    admin = await asyncpg.connect(postgres_server.url)
    database = postgres_server.database
    grants = f"""
        CREATE ROLE {role} LOGIN;
        GRANT CONNECT ON DATABASE {database} TO {role};
        GRANT USAGE ON SCHEMA public TO {role};
        GRANT SELECT, INSERT, UPDATE, DELETE ON {prefix}_fencing, {prefix}_leases TO {role};
        GRANT USAGE ON SEQUENCE {prefix}_fencing_seq TO {role};
        GRANT EXECUTE ON FUNCTION {prefix}_lease_acquire_v2(text, int8, text, text, int4, float8)
            TO {role};
    """
    try:
        await admin.execute(grants)
        yield role, prefix
    finally:
        await admin.execute(
            f"DROP TABLE IF EXISTS {prefix}_fencing, {prefix}_leases, {prefix}_records CASCADE;"
            f"DROP SEQUENCE IF EXISTS {prefix}_fencing_seq;"
            f"DROP FUNCTION IF EXISTS {prefix}_lease_acquire_v2;"
            f"DROP OWNED BY {role}; DROP ROLE {role};"
        )
        await admin.close()


@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_documented_grants_suffice(
    postgres_server: PostgresServer, locker: tuple[str, str], mode: str
) -> None:
    role, prefix = locker
    url = (
        f"postgresql://{role}@{postgres_server.host}:{postgres_server.port}/"
        f"{postgres_server.database}?table_prefix={prefix}&create_tables=false&mode={mode}"
    )
    async with aiolocks.connect(url) as backend:
        async with backend.mutex("sec/pg") as held:
            assert held.fencing_token is not None
        async with backend.semaphore("sec/pg-sem", 2).lease():
            pass


async def test_role_without_grants_is_access_denied(
    postgres_server: PostgresServer, locker: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, prefix = locker
    role = f"nogrant_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres_server.url)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        url = (
            f"postgresql://{role}@{postgres_server.host}:{postgres_server.port}/"
            f"{postgres_server.database}?mode=lease&create_tables=false&table_prefix={prefix}"
        )
        async with aiolocks.connect(url, on_unavailable="local") as backend:
            # PostgreSQL rolled the refused statement back: no clean-up to fail, no warning.
            await assert_acquire_refused(backend, "sec/pg-denied", caplog)
    except aiolocks.AccessDeniedError:
        pass  # refused already at connect (the schema check): also right
    finally:
        await admin.execute(f"DROP ROLE {role}")
        await admin.close()


async def _advisory_locks_of(admin: asyncpg.Connection, role: str) -> int:
    """How many advisory locks the sessions of ``role`` hold."""
    return int(
        await admin.fetchval(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND a.usename = $1",
            role,
        )
    )


@pytest.mark.parametrize("revoke", ["sequence", "fencing"])
@pytest.mark.parametrize("family", ["mutex", "read", "semaphore"])
async def test_advisory_privilege_error_is_access_denied(
    postgres_server: PostgresServer, locker: tuple[str, str], revoke: str, family: str
) -> None:
    """A lock call refused a privilege raises AccessDeniedError: no local hold, no lock left."""
    role, prefix = locker
    admin = await asyncpg.connect(postgres_server.url)
    try:
        if revoke == "sequence":  # the advisory token: nextval is refused
            await admin.execute(f"REVOKE USAGE ON SEQUENCE {prefix}_fencing_seq FROM {role}")
        else:  # a new name's fencing row: the INSERT is refused
            await admin.execute(f"REVOKE INSERT, UPDATE ON {prefix}_fencing FROM {role}")
        url = (
            f"postgresql://{role}@{postgres_server.host}:{postgres_server.port}/"
            f"{postgres_server.database}?table_prefix={prefix}&create_tables=false"
            "&mode=advisory"
        )
        async with aiolocks.connect(url, on_unavailable="local") as backend:
            name = f"sec/pg-priv-{family}"
            lock = (
                backend.mutex(name)
                if family == "mutex"
                else backend.read_write_lock(name).read
                if family == "read"
                else backend.semaphore(name, 2).lease()
            )
            with pytest.raises(aiolocks.AccessDeniedError, match="refused access"):
                async with lock:
                    pytest.fail("acquired without the privilege")
            # the failed call's session lock, if the server took it, was given back
            assert await _advisory_locks_of(admin, role) == 0
    finally:
        await admin.close()
