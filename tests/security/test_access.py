"""A refused login, permission or certificate is AccessDeniedError, never an outage."""

from __future__ import annotations

import asyncio
import io
import uuid

import asyncpg
import pytest

import aiolocks
from aiolocks import cli
from aiolocks.redis._driver import RedisDriver
from aiolocks.testing import PostgresServer
from aiolocks.testing.servers import RedisServer

from ..refusals import assert_acquire_refused
from .conftest import LOCKER_PASSWORD, PREFIX, locker_url

pytestmark = pytest.mark.redis


@pytest.mark.asyncio
@pytest.mark.parametrize("on_unavailable", ["raise", "local"])
async def test_wrong_password_is_access_denied(
    secure_redis: RedisServer, on_unavailable: str
) -> None:
    url = locker_url(secure_redis, password="wrong-password")
    with pytest.raises(aiolocks.AccessDeniedError) as info:
        async with aiolocks.connect(url, on_unavailable=on_unavailable):
            pass
    assert not isinstance(info.value, aiolocks.BackendUnavailableError)
    assert isinstance(info.value, PermissionError)
    assert "wrong-password" not in str(info.value)


@pytest.mark.asyncio
async def test_missing_password_is_access_denied(secure_redis: RedisServer) -> None:
    with pytest.raises(aiolocks.AccessDeniedError, match="refused"):
        async with aiolocks.connect(f"redis://127.0.0.1:{secure_redis.port}/0"):
            pass


@pytest.mark.asyncio
async def test_acl_user_runs_every_lock_kind(secure_redis: RedisServer) -> None:
    """The least-privilege ACL line of docs/security.md is enough for the recipes."""
    name = f"acl/{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(locker_url(secure_redis, query="lease_time=5")) as backend:
        async with backend.mutex(name) as held:
            assert held.fencing_token is not None
        async with backend.mutex(f"{name}/fair", fair=True):
            pass
        async with backend.semaphore(f"{name}/sem", 2).lease():
            pass
        rw = backend.read_write_lock(f"{name}/rw")
        async with rw.read:
            pass
        async with rw.write:
            pass
        async with backend.semaphore_mutex(f"{name}/sm"):
            pass
        async with backend.mutex(name):
            assert [lock.name for lock in await backend.list_locks("acl/")] == [name]
    assert secure_redis.command("KEYS", f"{PREFIX}*") == []


@pytest.mark.asyncio
@pytest.mark.parametrize("on_unavailable", ["raise", "local"])
async def test_key_outside_acl_is_denied_not_degraded(
    secure_redis: RedisServer, on_unavailable: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = locker_url(secure_redis).replace(f"key_prefix={PREFIX}", "key_prefix=other:")
    async with aiolocks.connect(url, on_unavailable=on_unavailable) as backend:
        # The ACL refuses the script before it runs: nothing to clean up, no warning.
        await assert_acquire_refused(backend, "x", caplog, match="no permissions")


@pytest.mark.asyncio
async def test_password_rotation_is_denied_not_degraded(
    secure_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The password changes under a live backend: new connections are refused, no local lock.

    The refusal is final at once: redis-py reports it as a ``ConnectionError``,
    which the acquire once retried as an outage until ``connect_timeout`` ran
    out. With 60 s of that and no acquire deadline, a retried refusal would
    outlast the 30 s bound here.
    """
    url = locker_url(secure_redis, query="connect_timeout=60")
    async with aiolocks.connect(url, on_unavailable="local") as backend:
        async with backend.mutex("rotate"):
            pass
        secure_redis.command("ACL", "SETUSER", "locker", "resetpass", ">rotated-password")
        try:
            secure_redis.command("CLIENT", "KILL", "USER", "locker")
            await asyncio.wait_for(assert_acquire_refused(backend, "rotate", caplog), 30)
        finally:
            secure_redis.command("ACL", "SETUSER", "locker", "resetpass", f">{LOCKER_PASSWORD}")


@pytest.mark.asyncio
async def test_release_after_password_rotation_is_denied_at_once(secure_redis: RedisServer) -> None:
    """A hold's release refused by a rotated password raises at once, not after retries.

    The release once retried the refusal as an outage for up to
    ``min(lease, connect_timeout)`` (60 s here), outlasting the 30 s bound.
    """
    url = locker_url(secure_redis, query="connect_timeout=60&lease_time=120")

    async def hold_through_rotation(backend: aiolocks.Backend) -> None:
        async with backend.mutex("rotate-release"):
            secure_redis.command("ACL", "SETUSER", "locker", "resetpass", ">rotated-password")
            secure_redis.command("CLIENT", "KILL", "USER", "locker")

    async with aiolocks.connect(url, on_unavailable="local") as backend:
        try:
            with pytest.raises(aiolocks.AccessDeniedError, match="releasing 'rotate-release'"):
                await asyncio.wait_for(hold_through_rotation(backend), 30)
        finally:
            secure_redis.command("ACL", "SETUSER", "locker", "resetpass", f">{LOCKER_PASSWORD}")


@pytest.mark.asyncio
async def test_record_write_after_password_rotation_is_denied_at_once(
    secure_redis: RedisServer,
) -> None:
    """A record's write (the store behind elections and groups) refused by a rotated
    password raises at once: it once retried the refusal until ``connect_timeout`` (60 s)."""
    url = locker_url(secure_redis, query="connect_timeout=60")
    async with aiolocks.connect(url) as backend:
        driver = backend._driver
        assert isinstance(driver, RedisDriver)
        store = driver.records()
        assert await store.create("rotate-records/before", b"x", ttl=30) is not None
        secure_redis.command("ACL", "SETUSER", "locker", "resetpass", ">rotated-password")
        try:
            secure_redis.command("CLIENT", "KILL", "USER", "locker")
            with pytest.raises(aiolocks.AccessDeniedError, match="invalid username-password"):
                await asyncio.wait_for(store.create("rotate-records/after", b"y", ttl=30), 30)
        finally:
            secure_redis.command("ACL", "SETUSER", "locker", "resetpass", f">{LOCKER_PASSWORD}")


def test_cli_exits_77_on_access_denied(
    secure_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    status = cli.main(["status", locker_url(secure_redis, password="Wr0ngPassw0rd"), "jobs/x"])
    assert status == cli.EXIT_ACCESS_DENIED == 77
    assert "refused" in err.getvalue()
    assert "Wr0ngPassw0rd" not in err.getvalue()


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_postgres_role_refused_is_access_denied(
    postgres_server: PostgresServer, mode: str
) -> None:
    role = f"nologin_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(postgres_server.url)
    try:
        await admin.execute(f"CREATE ROLE {role} NOLOGIN")
        url = f"postgresql://{role}@{postgres_server.host}:{postgres_server.port}/postgres"
        with pytest.raises(aiolocks.AccessDeniedError, match="not permitted to log in"):
            async with aiolocks.connect(f"{url}?mode={mode}", on_unavailable="local"):
                pass
    finally:
        await admin.execute(f"DROP ROLE {role}")
        await admin.close()
