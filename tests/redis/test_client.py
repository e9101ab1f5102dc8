"""The redis-py client aiolocks builds from a URL: its connections and its pool.

Both trade redis-py's generic paths for cheaper ones (hiredis packing, no
timer on a write that cannot block, no lock/metrics/events on an idle
connection taken from the pool). These tests pin that nothing else changes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio
from redis.event import AsyncAfterConnectionReleasedEvent, AsyncEventListenerInterface
from redis.exceptions import DataError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolocks
from aiolocks.redis import RedisBackend
from aiolocks.redis._backend import POOL_SIZE
from aiolocks.testing.proxy import TcpProxy
from aiolocks.testing.servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


def _client(backend: aiolocks.Backend) -> Any:
    assert isinstance(backend, RedisBackend)
    return backend._driver.node.client


ARGUMENT_LISTS: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 2, "k1", "k2", "x", 1, 30000, "", "participant/task-1"),
    ("SCRIPT LOAD", "return 1"),
    (b"GET", b"key"),
    ("SET", "unicode-é-ø-😀", "value", "PX", 100),
    ("SET", "k", -17, "EX", 2**70),
    ("SET", "k", 0.1),
    ("SET", "k", 1e20),
    ("SET", "k", float("-inf")),
    ("SET", "k", bytearray(b"raw")),
    ("SET", "k", memoryview(b"view")),
    ("SET", "k", b"x" * 100_000),  # above redis-py's chunking cutoff
    ("SET", "", ""),
]


@pytest.mark.parametrize("args", ARGUMENT_LISTS, ids=range(len(ARGUMENT_LISTS)))
async def test_commands_are_packed_byte_for_byte_as_redis_py_packs_them(
    redis_server: RedisServer, args: tuple[Any, ...]
) -> None:
    plain = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        async with aiolocks.connect(redis_server.url) as backend:
            ours = _client(backend).connection_pool.make_connection()
            theirs = plain.connection_pool.make_connection()  # type: ignore[no-untyped-call]
            assert type(ours) is not type(theirs)  # the fast class is in use
            assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args))
    finally:
        await plain.aclose()


async def test_a_bool_argument_is_refused_as_redis_py_refuses_it(
    redis_server: RedisServer,
) -> None:
    async with aiolocks.connect(redis_server.url) as backend:
        connection = _client(backend).connection_pool.make_connection()
        with pytest.raises(DataError, match="bool"):
            connection.pack_command("SET", "k", True)


async def test_every_script_is_reloaded_after_a_script_flush(
    redis_server: RedisServer, raw: redis.asyncio.Redis, url: str
) -> None:
    async with aiolocks.connect(url) as backend:
        lock = backend.mutex("flushed")
        await raw.script_flush()
        assert await lock.acquire(timeout=0)  # acquire.lua
        await raw.script_flush()
        assert len(await lock.participants()) == 1  # inspect.lua
        await raw.script_flush()
        await lock.release()  # release.lua: nothing is left (raw checks at teardown)
        assert await lock.participants() == []


async def test_a_write_that_cannot_drain_is_still_bounded(redis_server: RedisServer) -> None:
    async with TcpProxy(redis_server.host, redis_server.port) as proxy:
        url = f"redis://{proxy.netloc}?connect_timeout=0.5"
        async with aiolocks.connect(url) as backend:
            client = _client(backend)
            await client.ping()
            proxy.stall()
            started = time.monotonic()
            with pytest.raises(RedisTimeoutError):
                # far more than the socket buffers take: drain() must wait
                await client.set("big", b"x" * (64 << 20))
            assert time.monotonic() - started < 5.0
            proxy.heal()
            assert await client.ping()  # the stalled connection was dropped, not reused


async def test_more_commands_than_connections_wait_for_one(redis_server: RedisServer) -> None:
    async with aiolocks.connect(redis_server.url) as backend:
        client = _client(backend)
        replies = await asyncio.gather(*(client.echo(str(i)) for i in range(POOL_SIZE * 3)))
        assert replies == [str(i).encode() for i in range(POOL_SIZE * 3)]
        pool = client.connection_pool
        assert len(pool._available_connections) <= POOL_SIZE
        assert not pool._in_use_connections


async def test_a_listener_on_released_connections_is_still_called(
    redis_server: RedisServer,
) -> None:
    seen: list[object] = []

    class Listener(AsyncEventListenerInterface):
        async def listen(self, event: object) -> None:
            seen.append(event)

    async with aiolocks.connect(redis_server.url) as backend:
        client = _client(backend)
        await client.ping()
        client.connection_pool._event_dispatcher.register_listeners(
            {AsyncAfterConnectionReleasedEvent: [Listener()]}
        )
        await client.ping()
        await client.ping()
        assert len(seen) == 2
        async with backend.mutex("observed"):
            pass
        assert len(seen) == 4  # acquire and release: one connection each
