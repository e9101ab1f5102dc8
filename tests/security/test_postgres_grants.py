"""The least-privilege PostgreSQL grants of docs/security.md are enough, in both modes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

import aiolocks
from aiolocks.testing import PostgresServer

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
            f"DROP TABLE IF EXISTS {prefix}_fencing, {prefix}_leases CASCADE;"
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
    postgres_server: PostgresServer, locker: tuple[str, str]
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
            with pytest.raises(aiolocks.AccessDeniedError):
                async with backend.mutex("sec/pg-denied"):
                    pytest.fail("acquired without the grants")
    except aiolocks.AccessDeniedError:
        pass  # refused already at connect (the schema check): also right
    finally:
        await admin.execute(f"DROP ROLE {role}")
        await admin.close()
