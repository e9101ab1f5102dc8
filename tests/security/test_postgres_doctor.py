"""``doctor`` on an open PostgreSQL (no TLS, a superuser) and on a locked-down one."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

import aiolocks
from aiolocks import Severity
from aiolocks.postgres._doctor_security import SecurityFacts, plaintext_finding
from aiolocks.testing import PostgresServer
from aiolocks.testing.tls import TlsFiles

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("mode", ["advisory", "lease"])
@pytest.mark.asyncio
async def test_open_server_findings(postgres_server: PostgresServer, mode: str) -> None:
    """The plain test server: a superuser over loopback without TLS."""
    prefix = f"sec_{uuid.uuid4().hex[:8]}"
    url = f"{postgres_server.url}?mode={mode}&table_prefix={prefix}"
    async with aiolocks.connect(url) as backend:
        report = await backend.doctor(self_test=False)
    findings = {f.code: f for f in report.findings}
    assert findings["postgres-no-tls"].severity is Severity.INFO  # loopback
    assert findings["postgres-superuser"].severity is Severity.WARNING
    assert postgres_server.user in findings["postgres-superuser"].title
    admin = await asyncpg.connect(postgres_server.url)
    try:
        await admin.execute(
            f"DROP TABLE IF EXISTS {prefix}_fencing, {prefix}_leases, {prefix}_records CASCADE;"
            f"DROP SEQUENCE IF EXISTS {prefix}_fencing_seq;"
            f"DROP FUNCTION IF EXISTS {prefix}_lease_acquire_v2;"
        )
    finally:
        await admin.close()


def test_plaintext_is_a_warning_off_the_loopback() -> None:
    facts = SecurityFacts(ssl=False, client="192.0.2.7", role="locker", superuser=False)
    finding = plaintext_finding(facts, pooled=False, label="db")
    assert finding is not None and finding.severity is Severity.WARNING
    unix = SecurityFacts(ssl=False, client=None, role="locker", superuser=False)
    local = plaintext_finding(unix, pooled=False, label="db")
    assert local is not None and local.severity is Severity.INFO
    # behind a pooler the server sees the pooler's link, not ours
    assert plaintext_finding(facts, pooled=True, label="db") is None


@pytest.mark.parametrize("mode", ["advisory", "lease"])
@pytest.mark.asyncio
async def test_locked_down_server_has_no_such_findings(
    tls_postgres: PostgresServer, tls_files: TlsFiles, mode: str
) -> None:
    """TLS (verify-full) and a role with only the documented grants: neither finding."""
    tag = uuid.uuid4().hex[:8]
    role, prefix = f"locker_{tag}", f"sec_{tag}"
    tls = f"sslmode=verify-full&sslrootcert={tls_files.ca_cert}"
    base = f"@localhost:{tls_postgres.port}/{tls_postgres.database}?{tls}&table_prefix={prefix}"
    owner_url = f"postgresql://{tls_postgres.user}{base}"
    async with aiolocks.connect(f"{owner_url}&mode=lease"):  # the tables, sequence, function
        pass
    admin = await asyncpg.connect(tls_postgres.url)
    try:
        await admin.execute(
            f"""
            CREATE ROLE {role} LOGIN;
            GRANT CONNECT ON DATABASE {tls_postgres.database} TO {role};
            GRANT USAGE ON SCHEMA public TO {role};
            GRANT SELECT, INSERT, UPDATE, DELETE ON {prefix}_fencing, {prefix}_leases TO {role};
            GRANT USAGE ON SEQUENCE {prefix}_fencing_seq TO {role};
            GRANT EXECUTE ON FUNCTION {prefix}_lease_acquire_v2(text, int8, text, text, int4,
                float8) TO {role};
            """
        )
        url = f"postgresql://{role}{base}&create_tables=false&mode={mode}"
        async with aiolocks.connect(url) as backend:
            report = await backend.doctor(self_test=False)
        codes = set(report.codes())
        assert not codes & {"postgres-no-tls", "postgres-superuser"}, report.findings
        # the same role sees its own session's pg_stat_ssl row: without TLS it is reported
        plain = (
            f"postgresql://{role}@127.0.0.1:{tls_postgres.port}/{tls_postgres.database}"
            f"?sslmode=disable&table_prefix={prefix}&create_tables=false&mode={mode}"
        )
        async with aiolocks.connect(plain) as backend:
            report = await backend.doctor(self_test=False)
        assert report.codes().count("postgres-no-tls") == 1, report.findings
        assert "postgres-superuser" not in report.codes()
    finally:
        await admin.execute(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}';"
            f"DROP TABLE IF EXISTS {prefix}_fencing, {prefix}_leases, {prefix}_records CASCADE;"
            f"DROP SEQUENCE IF EXISTS {prefix}_fencing_seq;"
            f"DROP FUNCTION IF EXISTS {prefix}_lease_acquire_v2;"
            f"DROP OWNED BY {role}; DROP ROLE {role};"
        )
        await admin.close()
