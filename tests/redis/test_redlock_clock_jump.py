"""Redlock when masters drop the lock key early (a clock jump forward, a restart without data).

A master whose clock jumps forward expires the lock's key before the
lease runs out; a master restarted without persistence comes back empty.
When that happens on more masters than a quorum can spare, another client
can take the lock while the holder still believes it holds it (Kleppmann's
critique of Redlock). The jump is emulated the way it acts on the lock:
``PEXPIRE`` of the key to 1 ms on those masters, behind the library's back.

The holder must be told (``LockLostError``): at its watchdog's next renewal,
or at the latest when it releases and finds its field gone on a majority.
The lease here is long (30 s), so the watchdog does not renew during the
test: the release is what has to notice.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager

import pytest

import aiolocks
from aiolocks.testing.servers import RedisServer

from ..chaos.redlock import expire_now

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]

#: long: the watchdog's first renewal (a third of it) comes after the test
LEASE = 30.0


@pytest.fixture
def masters() -> Iterator[list[RedisServer]]:
    """Three independent masters of this test only (one is restarted by a test)."""
    servers = [RedisServer(), RedisServer(), RedisServer()]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.close()


def _url(servers: Sequence[RedisServer], prefix: str) -> str:
    hosts = ",".join(f"{s.host}:{s.port}" for s in servers)
    return f"redlock://{hosts}?key_prefix={prefix}&lease_time={LEASE:g}&connect_timeout=2"


@asynccontextmanager
async def _rivals(
    servers: Sequence[RedisServer],
) -> AsyncIterator[tuple[str, aiolocks.Mutex, aiolocks.Mutex]]:
    """A fresh prefix and mutex ``x`` of two clients over ``servers``."""
    prefix = f"jump-{uuid.uuid4().hex[:8]}:"
    async with (
        aiolocks.connect(_url(servers, prefix)) as one,
        aiolocks.connect(_url(servers, prefix)) as two,
    ):
        yield prefix, one.mutex("x"), two.mutex("x")


async def test_key_expired_early_on_a_majority_is_reported_at_release(
    masters: list[RedisServer],
) -> None:
    async with _rivals(masters) as (prefix, lock, rival):
        with pytest.raises(aiolocks.LockLostError, match="already gone"):
            async with lock:
                first = lock.fencing_token
                assert await expire_now(masters[:2], prefix) == 2
                # two masters of three let the rival in: both believe they hold it
                assert await rival.acquire(timeout=5)
                assert rival.fencing_token is not None and first is not None
                assert rival.fencing_token > first  # the fence still orders them
        assert lock.is_lost
        await rival.release()


async def test_key_expired_early_on_one_master_of_three_is_harmless(
    masters: list[RedisServer],
) -> None:
    """A minority of masters dropping the key: the lock is still held on a quorum."""
    async with _rivals(masters) as (prefix, lock, rival):
        async with lock:
            assert await expire_now(masters[:1], prefix) == 1
            assert await rival.acquire(timeout=0) is False
        assert not lock.is_lost
        assert await rival.acquire(timeout=5)
        await rival.release()


async def test_jump_on_one_master_and_restart_of_another_is_reported(
    masters: list[RedisServer],
) -> None:
    """Kleppmann's case: one master's clock jumps, another restarts empty."""
    prefix = f"jump-{uuid.uuid4().hex[:8]}:"
    async with aiolocks.connect(_url(masters, prefix)) as one:
        lock = one.mutex("x")
        with pytest.raises(aiolocks.LockLostError):
            async with lock:
                first = lock.fencing_token
                assert await expire_now(masters[:1], prefix) == 1
                await asyncio.to_thread(masters[1].kill)
                await asyncio.to_thread(masters[1].start)  # same port, no data
                # a client that connects now finds the lock free on two masters
                async with aiolocks.connect(_url(masters, prefix)) as two:
                    rival = two.mutex("x")
                    assert await rival.acquire(timeout=0)
                    assert rival.fencing_token is not None and first is not None
                    assert rival.fencing_token > first
                    await rival.release()
        assert lock.is_lost
