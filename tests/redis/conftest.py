"""Fixtures of the Redis backend tests: real servers, a unique key prefix per test.

Every test gets its own ``key_prefix`` and, at the end, asserts that no key
with it is left on the server (after the short time a crashed holder's lease
needs to lapse).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio

import aiolocks
from aiolocks.testing.servers import RedisServer

from ..polling import eventually

pytestmark = pytest.mark.redis


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test only."""
    return f"aiolocks-test-{uuid.uuid4().hex[:10]}:"


@pytest_asyncio.fixture
async def raw(redis_server: RedisServer, prefix: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A plain client on the shared server; checks at teardown that no key of ours is left."""
    client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        yield client
        await assert_no_keys(client, prefix)
    finally:
        await client.aclose()


@pytest.fixture
def url(redis_server: RedisServer, prefix: str) -> str:
    """The backend URL of the shared server with this test's prefix."""
    return f"{redis_server.url}?key_prefix={prefix}"


async def assert_no_keys(client: redis.asyncio.Redis, prefix: str, within: float = 5.0) -> None:
    """No key with ``prefix`` (leases of killed holders may need ``within`` s to lapse)."""
    left: list[bytes | str] = []

    async def gone() -> bool:
        left[:] = await client.keys(f"{prefix}*")
        return not left

    try:
        await eventually(gone, within, interval=0.05)
    except AssertionError:
        raise AssertionError(f"library keys left behind: {left}") from None


async def command_calls(client: redis.asyncio.Redis) -> dict[str, int]:
    """``INFO commandstats`` as {command: calls}, without INFO/CONFIG themselves."""
    info = await client.info("commandstats")
    calls = {}
    for key, value in info.items():
        name = key.removeprefix("cmdstat_")
        if name in ("info", "config|resetstat", "config"):
            continue
        calls[name] = int(value["calls"])
    return calls


async def listening_for_grants(raw: redis.asyncio.Redis, *backends: aiolocks.Backend) -> None:
    """Wait until each backend listens for grants: the server has its grant
    channel subscribed, and each of its waiters waits on its doorbell, not
    rung (it took the look a confirmed subscription asks for): those in the
    lock's queue listening on that channel, the others in the process."""
    channels = [backend._driver.grant_channel for backend in backends]

    def parked(backend: aiolocks.Backend) -> bool:
        driver = backend._driver
        assert driver.node.hub is not None
        waiting = list(driver._queued.values())
        return (
            driver.node.hub.is_confirmed(driver.grant_channel)
            and bool(waiting)
            and all(
                (a.listening or a.local)
                and a.wake is not None
                and a.wake._future is not None  # in its wait
                and not a.wake.is_set()
                for a in waiting
            )
        )

    async def check() -> bool:
        subscribed = all(n == 1 for _, n in await raw.pubsub_numsub(*channels))
        return subscribed and all(parked(backend) for backend in backends)

    await eventually(check, what=f"{len(channels)} process(es) listening for grants")


async def hold_expiries(raw: redis.asyncio.Redis, key: str) -> tuple[int, dict[str, int]]:
    """The server's clock and each hold's expiry in the holders hash ``key``
    (ms, from a field's ``<expiry>|...`` value), read in one transaction;
    ``raw`` decodes replies (as the ``raw`` fixture does)."""
    async with raw.pipeline(transaction=True) as pipe:
        pipe.time()
        pipe.hgetall(key)
        (seconds, micros), fields = await pipe.execute()
    now = int(seconds) * 1000 + int(micros) // 1000
    holds = {
        field: int(value.partition("|")[0])
        for field, value in fields.items()
        if field != "#" and not field.startswith("!")
    }
    return now, holds


async def renewed_past_expiry(raw: redis.asyncio.Redis, key: str, holds: int) -> None:
    """Wait until each of the ``holds`` holds in ``key`` is still live on the
    server after the expiry it has now: the watchdog renewed it.

    The passage of time is the point here (a lease outliving the expiry it
    had), so this waits for the server's clock to pass it, and checks the
    holds' expiries then, rather than trusting a sleep.
    """
    _, first = await hold_expiries(raw, key)
    assert len(first) == holds, first

    async def outlived() -> bool:
        now, current = await hold_expiries(raw, key)
        return current.keys() == first.keys() and all(
            first[field] < now < current[field] for field in first
        )

    await eventually(
        outlived, 10, what=f"the holds of {key} to outlive their expiry", interval=0.05
    )


class Alone:
    """Tasks taking one mutex: checks that only one is inside at a time and
    records the fencing tokens in the order the holds began."""

    def __init__(self) -> None:
        self.inside = 0
        self.tokens: list[int] = []

    async def hold(self, lock: aiolocks.Mutex, pause: float = 0.0) -> None:
        """Hold ``lock`` for ``pause`` s (at least one event-loop step), alone."""
        async with lock:
            self.inside += 1
            assert self.inside == 1
            assert lock.fencing_token is not None
            self.tokens.append(lock.fencing_token)
            await asyncio.sleep(pause)
            self.inside -= 1
