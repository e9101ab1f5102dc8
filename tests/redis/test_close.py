"""Closing a Redis backend leaves no connection open, on every topology.

A backend closed while a hold's body runs ends that body, whose block then
releases: that release races the close. A command that takes or opens a
connection after the client closed its pool leaves a socket that nobody
closes (seen as a ResourceWarning in some later test). Counted on the
server side: the backend's connections are all gone once it is closed.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

import aiolocks
from aiolocks.testing import RedisCluster, RedisServer
from aiolocks.testing.servers import RedisSentinelSet, RedisServerGroup

from ..polling import eventually

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


def _clients(servers: list[RedisServer]) -> int:
    """Normal client connections (pub/sub included) on ``servers``, ours and others'."""
    total = 0
    for server in servers:
        listing = server.command("CLIENT", "LIST", "TYPE", "normal")
        pubsub = server.command("CLIENT", "LIST", "TYPE", "pubsub")
        total += sum(1 for text in (listing, pubsub) for line in str(text).splitlines() if line)
    return total


@pytest.fixture(params=["plain", "sentinel", "cluster", "redlock"])
def topology(request: pytest.FixtureRequest) -> tuple[str, list[RedisServer]]:
    """A backend URL and the data servers it talks to."""
    if request.param == "plain":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.url, [server]
    if request.param == "sentinel":
        sentinels: RedisSentinelSet = request.getfixturevalue("redis_sentinel")
        return sentinels.url, [sentinels.master]
    if request.param == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return cluster.url, list(cluster.nodes)
    group: RedisServerGroup = request.getfixturevalue("redis_servers5")
    url = "redlock://" + ",".join(u.partition("://")[2] for u in group.urls)
    return url, list(group.servers)


async def test_close_with_running_holds_leaves_no_connection(
    topology: tuple[str, list[RedisServer]],
) -> None:
    url, servers = topology
    before = _clients(servers)
    backend = await aiolocks.connect(url)
    entered = asyncio.Event()
    bodies = []

    async def body(name: str) -> None:
        async with backend.mutex(name):
            entered.set()
            await asyncio.sleep(3600)

    for i in range(4):  # several holds: several releases racing the close
        entered.clear()
        bodies.append(asyncio.create_task(body(f"close/{uuid.uuid4().hex[:8]}-{i}")))
        await entered.wait()
    await backend.close()
    outcomes = await asyncio.gather(*bodies, return_exceptions=True)
    assert all(isinstance(o, aiolocks.LockLostError) for o in outcomes), outcomes
    for _ in range(3):
        await asyncio.sleep(0)
    # the server may take a moment to drop the closed sockets from its list
    await eventually(
        lambda: _clients(servers) <= before,
        5,
        what="the closed backend's connections to go (it left some open)",
        interval=0.02,
    )
