"""The PostgreSQL and pgbouncer launchers of aiolocks.testing, against the real binaries."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path

import pytest

from aiolocks.testing import (
    PgBouncer,
    PgWireConnection,
    PostgresCommandError,
    PostgresServer,
    ServerNotManagedError,
)
from aiolocks.testing.pytest_plugin import require_managed

from .conftest import Connect

pytestmark = pytest.mark.postgres


def test_server_answers_queries_and_reports_errors(postgres_server: PostgresServer) -> None:
    assert postgres_server.query("SELECT 1 + 1, NULL::text") == [("2", None)]
    with pytest.raises(PostgresCommandError) as info:
        postgres_server.query("SELECT * FROM no_such_table_here")
    assert info.value.sqlstate == "42P01"
    # The connection that raised still works: errors are read up to ReadyForQuery.
    with postgres_server.connect_wire() as conn:
        with pytest.raises(PostgresCommandError):
            conn.query("SELECT 1/0")
        assert conn.query("SELECT 'still here'") == [("still here",)]


def test_managed_server_runs_as_an_unprivileged_user(postgres_server: PostgresServer) -> None:
    require_managed(postgres_server)
    assert postgres_server.running and postgres_server.data_dir is not None
    assert postgres_server.pid is not None
    owner = Path(f"/proc/{postgres_server.pid}").stat().st_uid
    # PostgreSQL refuses root: as root we run it as the postgres OS user.
    expected = pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert owner == expected != 0
    assert (postgres_server.data_dir / "PG_VERSION").is_file()
    # fsync is off for speed, synchronous_commit stays on so a crash keeps commits.
    assert postgres_server.query("SHOW fsync") == [("off",)]
    assert postgres_server.query("SHOW synchronous_commit") == [("on",)]
    assert postgres_server.query("SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == [
        ("t",)
    ]


def test_restart_and_crash_keep_committed_rows(postgres_restartable: PostgresServer) -> None:
    pg = postgres_restartable
    port = pg.port
    pg.query("CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)")
    pg.restart()
    pg.query("INSERT INTO kept VALUES (2)")
    pg.kill()  # SIGKILL right after a commit: the WAL is in the page cache
    assert not pg.running
    pg.start()
    assert pg.port == port
    assert pg.query("SELECT x FROM kept ORDER BY x") == [("1",), ("2",)]


@pytest.mark.asyncio
async def test_terminate_backends_ends_the_named_sessions(
    postgres_server: PostgresServer, connect: Connect, unique: str
) -> None:
    victim = await connect(server_settings={"application_name": unique})
    bystander = await connect()
    ended = asyncio.Event()
    victim.add_termination_listener(lambda _conn: ended.set())
    pid = victim.get_server_pid()
    assert postgres_server.backend_pids(application_name=unique) == [pid]
    assert postgres_server.terminate_backends(application_name=unique) == 1
    await asyncio.wait_for(ended.wait(), 30)
    assert victim.is_closed()
    assert await bystander.fetchval("SELECT 1") == 1
    assert postgres_server.backend_pids(application_name=unique) == []


@pytest.mark.asyncio
async def test_pgbouncer_pools_transactions(pgbouncer: PgBouncer, connect_bouncer: Connect) -> None:
    assert pgbouncer.pool_mode == "transaction"
    conn = await connect_bouncer()
    assert await conn.fetchval("SELECT current_setting('server_version_num')::int >= 120000")
    # The admin console answers SHOW commands, here one pool per database/user.
    pools = pgbouncer.admin("SHOW POOLS")
    assert any(row[0] == pgbouncer.database and row[-1] == "transaction" for row in pools)


def test_external_servers_are_not_managed() -> None:
    pg = PostgresServer.external("postgresql://alice:s%40cret@db.example:5433/app")
    assert (pg.host, pg.port, pg.user, pg.database) == ("db.example", 5433, "alice", "app")
    assert not pg.managed
    with pytest.raises(ServerNotManagedError):
        pg.stop()
    bouncer = PgBouncer.external("postgres://bob@pool.example/app", pg)
    assert (bouncer.port, bouncer.server) == (6432, pg)
    with pytest.raises(ValueError, match="postgresql://"):
        PostgresServer.external("redis://127.0.0.1:6379")
    with pytest.raises(ValueError, match="pool_mode"):
        PgBouncer(pg, pool_mode="sessions")


def test_wire_client_password_authentication(postgres_restartable: PostgresServer) -> None:
    pg = postgres_restartable
    pg.query("CREATE ROLE scram_user LOGIN PASSWORD 'pw''1'")
    hba = pg.data_dir / "pg_hba.conf" if pg.data_dir is not None else None
    assert hba is not None
    hba.write_text("host all scram_user 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    pg.query("SELECT pg_reload_conf()")
    with PgWireConnection(pg.host, pg.port, user="scram_user", password="pw'1") as conn:
        assert conn.query("SELECT current_user") == [("scram_user",)]
    with pytest.raises(PostgresCommandError) as info:
        PgWireConnection(pg.host, pg.port, user="scram_user", password="wrong")
    assert info.value.sqlstate == "28P01"
