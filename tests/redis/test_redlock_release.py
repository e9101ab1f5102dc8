"""Redlock release and clean-up with a master down: bounded per master, never the lease."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio

import aiolocks
from aiolocks.redis._driver import LockKeys, RedisNode
from aiolocks.redis._redlock import RedlockDriver
from aiolocks.testing.proxy import TcpProxy
from aiolocks.testing.servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]

#: long, so "returned before the lease ran out" has a wide margin on a loaded machine
LEASE = 30.0


def _driver(backend: aiolocks.Backend) -> RedlockDriver:
    driver = backend._engine.driver
    assert isinstance(driver, RedlockDriver)
    return driver


def _count_releases(node: RedisNode) -> list[float]:
    """Record (on the real node) when each ``release.lua`` is sent to it."""
    sent: list[float] = []
    real = node.release

    async def release(
        keys: LockKeys,
        member: str,
        fields: Sequence[str],
        tombstone_ms: int = 0,
        publish: bool = True,
    ) -> int:
        sent.append(time.monotonic())
        return await real(keys, member, fields, tombstone_ms, publish)

    node.release = release  # type: ignore[method-assign]
    return sent


async def _keys(server: RedisServer, pattern: str) -> list[Any]:
    raw = redis.asyncio.Redis(host=server.host, port=server.port)
    try:
        return list(await raw.keys(pattern))
    finally:
        await raw.aclose()


async def test_release_with_a_killed_master_does_not_wait_for_the_lease() -> None:
    prefix = f"rl-{uuid.uuid4().hex[:8]}:"
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        url = (
            f"redlock://{a.host}:{a.port},{b.host}:{b.port},{c.host}:{c.port}"
            f"?key_prefix={prefix}&lease_time={LEASE:g}&connect_timeout=1"
        )
        async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
            driver = _driver(one)
            bound = driver.cleanup_bound(LEASE)
            assert bound == 1  # min(lease / 5, connect_timeout)
            lock, rival = one.mutex("x"), two.mutex("x")
            for round_ in range(3):
                await lock.acquire()
                if round_ == 0:
                    c.kill()
                sent = _count_releases(driver.nodes[2])
                started = time.monotonic()
                await lock.release()
                elapsed = time.monotonic() - started
                # the dead master was tried, and given up on after a few tries
                # (retrying until the lease would be ~20 tries at a 1 s cap)
                assert 1 <= len(sent) <= 12, sent
                assert sent[-1] - started < bound + 1
                assert elapsed < LEASE / 3, elapsed
                # the live masters let the next holder in at once
                assert await _keys(a, f"{prefix}*") == []
                assert await _keys(b, f"{prefix}*") == []
                assert await rival.acquire(timeout=0)
                await rival.release()


async def test_stalled_masters_bound_release_and_abandon() -> None:
    """Masters that accept bytes and never answer (a partition) bound each clean-up too."""
    prefix = f"rl-{uuid.uuid4().hex[:8]}:"
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        proxies = [TcpProxy(s.host, s.port) for s in (a, b, c)]
        for p in proxies:
            await p.start()
        try:
            url = (
                "redlock://"
                + ",".join(p.netloc for p in proxies)
                + f"?key_prefix={prefix}&lease_time={LEASE:g}&connect_timeout=1"
            )
            async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
                lock, rival = one.mutex("y"), two.mutex("y")
                await rival.acquire()
                proxies[2].stall()
                # contended: the acquire gives up at its timeout and cleans up on
                # every master it wrote to, the stalled one within the bound
                started = time.monotonic()
                assert await lock.acquire(timeout=0.5) is False
                assert time.monotonic() - started < LEASE / 3
                started = time.monotonic()
                await rival.release()
                assert time.monotonic() - started < LEASE / 3
                # two live masters of three: the lock is free again at once
                assert await lock.acquire(timeout=0)
                await lock.release()
                for server in (a, b):
                    assert await _keys(server, f"{prefix}*") == []
        finally:
            for p in proxies:
                await p.stop()
