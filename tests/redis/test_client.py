"""The Redis client layer (``aiolocks/redis/_client.py``): the redis-py client aiolocks
builds from a URL, its connections and its pool, and the narrow interface the recipe uses.

The connections and the pool trade redis-py's generic paths for cheaper ones
(hiredis packing, no task per write, an idle list in front of redis-py's
pool), through redis-py's public methods only. These tests pin that nothing
else changes: replies, bounds on stalled writes, waiting for a connection,
redis-py's own pool operations, and a cancelled command never handing a
half-used connection on. The last tests check that redis-py's clients (plain,
Sentinel, Cluster, Redlock's, and one passed in) have every call of the
recipe's protocols, taking the arguments the recipe passes.
"""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import time
import typing
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolocks
from aiolocks.redis import RedisBackend
from aiolocks.redis._client import (
    POOL_SIZE,
    RedisClusterCommands,
    RedisCommands,
    RedisPipeline,
    RedisPubSub,
    RedisScript,
    RedisServerCommands,
)
from aiolocks.testing.proxy import TcpProxy
from aiolocks.testing.servers import RedisServer

from ..polling import eventually

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
            try:
                expected = b"".join(theirs.pack_command(*args))
            except DataError:  # some redis-py versions refuse bytearray: nothing to compare
                pytest.skip(f"this redis-py {redis.__version__} does not pack {args!r}")
            assert b"".join(ours.pack_command(*args)) == expected
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


async def _our_connections(raw: redis.asyncio.Redis) -> set[int]:
    """Server-side ids of every connection but ``raw``'s own (the server is ours alone)."""
    clients = await raw.client_list()
    return {int(c["id"]) for c in clients} - {int(await raw.client_id())}


async def test_more_commands_than_connections_wait_for_one(
    redis_server: RedisServer, raw: redis.asyncio.Redis
) -> None:
    async with aiolocks.connect(redis_server.url) as backend:
        client = _client(backend)
        pool = client.connection_pool
        replies = await asyncio.gather(*(client.echo(str(i)) for i in range(POOL_SIZE * 3)))
        assert replies == [str(i).encode() for i in range(POOL_SIZE * 3)]
        # every connection made is back and reusable; no more were made
        assert len(pool.idle) == POOL_SIZE
        assert len(await _our_connections(raw)) == POOL_SIZE
        assert await client.echo("again") == b"again"
        assert len(await _our_connections(raw)) == POOL_SIZE


async def test_a_command_waiting_for_a_connection_times_out_and_can_be_cancelled(
    redis_server: RedisServer,
) -> None:
    async with (
        TcpProxy(redis_server.host, redis_server.port) as proxy,
        aiolocks.connect(f"redis://{proxy.netloc}?connect_timeout=0.5") as backend,
    ):
        client = _client(backend)
        pool = client.connection_pool
        # redis-py before 5.3 wants a command name here; later ones warn about it
        legacy = inspect.signature(redis.asyncio.ConnectionPool.get_connection).parameters
        name = ("PING",) if legacy["command_name"].default is inspect.Parameter.empty else ()
        taken = [await pool.get_connection(*name) for _ in range(POOL_SIZE)]
        with pytest.raises(RedisConnectionError, match="No connection available"):
            await client.ping()
        waiting = asyncio.create_task(client.ping())
        await asyncio.sleep(0)
        assert len(pool.waiters) == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not pool.waiters
        # a give-back wakes the next waiter, which gets its answer
        waiting = asyncio.create_task(client.ping())
        await asyncio.sleep(0)
        await pool.release(taken.pop())
        assert await waiting
        for connection in taken:
            await pool.release(connection)
        assert len(pool.idle) == POOL_SIZE


async def test_disconnect_and_reconnect_marks_reach_idle_connections(
    redis_server: RedisServer, raw: redis.asyncio.Redis
) -> None:
    """redis-py's own pool operations still see the connections kept idle here."""
    async with aiolocks.connect(redis_server.url) as backend:
        client = _client(backend)
        pool = client.connection_pool
        await asyncio.gather(*(client.ping() for _ in range(3)))
        before = await _our_connections(raw)
        assert len(before) == 3 == len(pool.idle)
        if pool.has_reconnect_marks:  # redis-py 7.0 and later
            # marked for reconnect (what redis-py does on a maintenance
            # event): the next use of each connection reconnects it first
            await pool.update_active_connections_for_reconnect()
            await asyncio.gather(*(client.ping() for _ in range(3)))
            after = await _our_connections(raw)
            assert len(after) == 3 and not after & before
        # disconnect() closes idle connections too; they reconnect on use
        await pool.disconnect()
        await eventually_empty(raw)
        assert await client.ping()
        assert len(await _our_connections(raw)) == 1


async def eventually_empty(raw: redis.asyncio.Redis) -> None:
    """Wait (bounded) until the server has no connection but ``raw``'s."""

    async def empty() -> bool:
        return not await _our_connections(raw)

    await eventually(empty, what="the server to have no connection of ours")


@pytest.mark.parametrize("where", ["write", "read"])
async def test_a_cancelled_command_never_returns_its_connection_half_used(
    redis_server: RedisServer, where: str
) -> None:
    """Cancel a command while its request or its reply is in flight: the reply
    must not be read by the next command that gets the connection."""
    async with (
        TcpProxy(redis_server.host, redis_server.port) as proxy,
        aiolocks.connect(f"redis://{proxy.netloc}?connect_timeout=5") as backend,
    ):
        client = _client(backend)
        await client.set("k", "first")
        proxy.stall()
        # a write big enough to wait for the stalled peer, or a reply held back
        big = b"x" * (8 << 20)
        task = asyncio.create_task(client.set("k", big) if where == "write" else client.get("k"))
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proxy.heal()
        # one connection: the next commands must get their own replies
        await client.set("k", "second")
        for i in range(20):
            assert await client.echo(f"e{i}") == f"e{i}".encode()
        # (the cancelled write may still reach the server later: closing a
        # stream sends what it had buffered; redis-py 5.0 closes, it does not abort)
        assert await client.get("k") in ((b"second", big) if where == "write" else (b"second",))
        assert len(client.connection_pool.idle) == 1


# -- the narrow interface: redis-py's clients have every call the recipe makes ----------

#: each call the recipe makes, as it makes it: protocol -> method -> (args, kwargs)
RECIPE_CALLS: dict[type, dict[str, tuple[tuple[Any, ...], dict[str, Any]]]] = {
    RedisCommands: {
        "evalsha": (("0" * 40, 1, "k", "arg", 1), {}),
        "eval": (("return 1", 1, "k", "arg", 1), {}),
        "script_load": (("return 1",), {}),
        "register_script": (("return 1",), {}),
        "hget": (("k", "field"), {}),
        "config_get": (("notify-keyspace-events",), {}),
        "config_set": (("notify-keyspace-events", "Kghxe"), {}),
        "pipeline": ((), {"transaction": False}),
        "pubsub": ((), {}),
        "aclose": ((), {}),
    },
    RedisClusterCommands: {
        "initialize": ((), {}),
        "get_nodes": ((), {}),
        "get_node_from_key": (("k",), {}),
    },
    RedisServerCommands: {"connection_pool": ((), {})},
    RedisPipeline: {
        "evalsha": (("0" * 40, 1, "k", 30000, "field"), {}),
        "execute_command": (("WAIT", 1, 100), {}),
        "rpushx": (("k", "member"), {}),
        "pexpire": (("k", 1000), {}),
        "execute": ((), {"raise_on_error": False}),
    },
    RedisPubSub: {
        "subscribe": (("channel",), {}),
        "unsubscribe": (("channel",), {}),
        "get_message": ((), {"timeout": None}),
        "aclose": ((), {}),
    },
    RedisScript: {"sha": ((), {})},
}


def _own_members(protocol: type) -> set[str]:
    """The names ``protocol`` itself declares (methods, properties, attributes)."""
    names = {name for name in vars(protocol) if not name.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


async def test_the_table_names_every_member_of_every_protocol() -> None:
    """A method added to a protocol must be added to the check below, as the
    protocol allows it to be called."""
    for protocol, calls in RECIPE_CALLS.items():
        assert set(calls) == _own_members(protocol), protocol.__name__
        for name, (args, kwargs) in calls.items():
            declared = inspect.getattr_static(protocol, name, None)
            if callable(declared):
                inspect.signature(declared).bind(protocol, *args, **kwargs)


async def _check_protocol(obj: Any, protocol: type) -> None:
    """``obj`` has each member of ``protocol``; each method takes the recipe's call, and
    those the protocol says are awaited return an awaitable (closed unsent: no I/O)."""
    for name, (args, kwargs) in RECIPE_CALLS[protocol].items():
        what = f"{type(obj).__name__}.{name} ({protocol.__name__})"
        assert hasattr(obj, name), f"redis-py has no {what}"
        declared = inspect.getattr_static(protocol, name, None)
        if not callable(declared):  # an attribute or a property
            continue
        method = getattr(obj, name)
        try:
            inspect.signature(method).bind(*args, **kwargs)
        except TypeError as exc:
            raise AssertionError(f"{what} does not take {args}, {kwargs}: {exc}") from None
        returns = typing.get_type_hints(declared).get("return")
        if typing.get_origin(returns) is not collections.abc.Awaitable:
            continue
        result = method(*args, **kwargs)
        assert inspect.isawaitable(result), f"{what} returned {result!r}, not an awaitable"
        if inspect.iscoroutine(result):
            result.close()  # never sent


async def _check_client(client: Any, extension: type) -> None:
    await _check_protocol(client, RedisCommands)
    await _check_protocol(client, extension)
    script = client.register_script("return 1")
    await _check_protocol(script, RedisScript)
    assert isinstance(script.sha, str) and len(script.sha) == 40
    await _check_protocol(client.pipeline(transaction=False), RedisPipeline)
    pubsub = client.pubsub()
    try:
        await _check_protocol(pubsub, RedisPubSub)
    finally:
        await pubsub.aclose()
    if extension is RedisServerCommands:
        assert isinstance(client.connection_pool.connection_kwargs.get("db", 0), int)
    else:
        owner = client.get_node_from_key("k")
        assert owner in client.get_nodes()
        pubsub = client.pubsub(node=owner)
        try:
            await _check_protocol(pubsub, RedisPubSub)
        finally:
            await pubsub.aclose()


CLUSTER_PUBSUB = hasattr(redis.asyncio.RedisCluster, "pubsub")


@pytest.mark.parametrize(
    "topology",
    [
        "plain",
        "sentinel",
        pytest.param(
            "cluster",
            marks=pytest.mark.skipif(
                not CLUSTER_PUBSUB,
                reason="redis-py before 8.0 has no pub/sub on its asyncio cluster client",
            ),
        ),
        "redlock",
    ],
)
async def test_the_clients_aiolocks_builds_have_the_recipes_interface(
    request: pytest.FixtureRequest, topology: str
) -> None:
    """Every call of :class:`RedisCommands` (and its pipeline, pub/sub and script
    objects) exists on redis-py's clients, plain, Sentinel, Cluster and Redlock's,
    and takes the arguments the recipe passes: a redis-py that renamed or
    reshaped one fails here."""
    if topology == "plain":
        url = request.getfixturevalue("redis_server").url
    elif topology == "sentinel":
        url = request.getfixturevalue("redis_sentinel").url
    elif topology == "cluster":
        url = request.getfixturevalue("redis_cluster").url
    else:
        servers = list(request.getfixturevalue("redis_servers5"))[:3]
        url = "redlock://" + ",".join(f"{s.host}:{s.port}" for s in servers)
    async with aiolocks.connect(url) as backend:
        driver: Any = backend._driver
        nodes = driver.nodes if topology == "redlock" else [driver.node]
        extension = RedisClusterCommands if topology == "cluster" else RedisServerCommands
        for node in nodes:
            await _check_client(node.client, extension)


async def test_a_client_passed_in_has_the_recipes_interface(redis_server: RedisServer) -> None:
    """``RedisBackend(client)`` runs the recipe on the application's own redis-py client."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        await _check_client(client, RedisServerCommands)
    finally:
        await client.aclose()
