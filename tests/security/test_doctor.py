"""``doctor`` on an open Redis, on a locked-down one, and the CONFIG SET warning."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

import aiolocks
from aiolocks.testing.servers import RedisServer
from aiolocks.testing.tls import TlsFiles

from .conftest import LOCKER_PASSWORD, PREFIX, locker_url

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


async def test_open_server_findings(redis_server: RedisServer) -> None:
    url = f"{redis_server.url}/0?key_prefix=sec-{uuid.uuid4().hex[:8]}:"
    async with aiolocks.connect(url) as backend:
        report = await backend.doctor(self_test=False)
    findings = {f.code: f for f in report.findings}
    assert findings["redis-open"].severity is aiolocks.Severity.WARNING
    assert findings["redis-no-tls"].severity is aiolocks.Severity.INFO  # loopback
    assert "CONFIG SET" in findings["redis-config-set"].title


async def test_locked_down_server_has_no_such_findings(
    secure_redis: RedisServer, tls_files: TlsFiles
) -> None:
    url = (
        f"rediss://locker:{LOCKER_PASSWORD}@localhost:{secure_redis.tls_port}/0"
        f"?key_prefix={PREFIX}&keyspace_events=listen&ssl_ca_certs={tls_files.ca_cert}"
        f"&ssl_certfile={tls_files.client_cert}&ssl_keyfile={tls_files.client_key}"
    )
    async with aiolocks.connect(url) as backend:
        report = await backend.doctor(self_test=False)
    codes = set(report.codes())
    assert not codes & {"redis-open", "redis-no-tls", "redis-config-set"}, report.findings


async def _configured(server: RedisServer) -> None:
    """Wait (bounded) until the server publishes keyspace events (set in the background)."""
    async with asyncio.timeout(10):
        while server.command("CONFIG", "GET", "notify-keyspace-events")[1] == "":  # type: ignore[index]
            await asyncio.sleep(0.02)


async def test_config_set_is_logged_once(
    secure_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """An admin connection (the default user may CONFIG) with keyspace_events=auto."""
    secure_redis.command("CONFIG", "SET", "notify-keyspace-events", "")
    url = locker_url(secure_redis).replace(f"locker:{LOCKER_PASSWORD}", ":Adm1nS3cret")
    caplog.set_level(logging.WARNING, logger="aiolocks")
    try:
        async with aiolocks.connect(url) as backend:
            for _ in range(3):
                async with backend.mutex("sec/config-set"):
                    await _configured(secure_redis)
            await backend.doctor(self_test=False)
    finally:
        secure_redis.command("CONFIG", "SET", "notify-keyspace-events", "")
    changed = [r for r in caplog.records if "CONFIG SET" in r.getMessage()]
    assert len(changed) == 1, [r.getMessage() for r in caplog.records]
    assert "notify-keyspace-events" in changed[0].getMessage()
    assert "Adm1nS3cret" not in changed[0].getMessage()
