"""What the cluster fault runs found in the library, each as a deterministic test.

A finding the library does not handle yet is marked ``xfail(strict=True)``
with the reason: the test starts passing (and so fails as XPASS) when the
library is fixed, and the marker must then be removed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolocks
from aiolocks.redis import RedisBackend
from aiolocks.redis._client import _ClosedUnderWrite, _guard_cluster_writes
from aiolocks.testing import RedisCluster

pytestmark = [pytest.mark.redis]


@pytest.fixture
def broken_cluster() -> Iterator[RedisCluster]:
    """Three masters without replicas (the test takes a third of the slots away)."""
    cluster = RedisCluster(3)
    try:
        cluster.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        cluster.close()
        pytest.skip(f"cannot start a Redis Cluster here: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


def _name_on_second_node(cluster: RedisCluster) -> str:
    """A lock name whose keys (hash tag ``{mutex:<name>}``) live on a surviving node."""
    low, high = 16384 // 3, 2 * 16384 // 3  # the slots the launcher gives node 1
    for index in range(1000):
        name = f"clusterdown-probe-{index}"
        slot = int(str(cluster.nodes[1].command("CLUSTER", "KEYSLOT", f"{{mutex:{name}}}")))
        if low <= slot < high:
            return name
    raise AssertionError("no name found on node 1")


def _uncover_first_third(cluster: RedisCluster) -> None:
    """Every node forgets who serves node 0's slots: ``cluster_state:fail`` everywhere.

    With ``cluster-require-full-coverage yes`` (the default) every node then
    answers key commands with ``CLUSTERDOWN``, as while a master is lost and
    no replica has taken over yet; every node still runs and answers.
    """
    for node in cluster.nodes:
        node.command("CLUSTER", "DELSLOTS", *range(0, 16384 // 3))
    for node in cluster.nodes:
        assert "cluster_state:fail" in str(node.command("CLUSTER", "INFO"))


@pytest.mark.asyncio
async def test_cluster_down_is_backend_unavailable(broken_cluster: RedisCluster) -> None:
    """An acquire while the cluster is down says the backend is unavailable (retryable)."""
    name = _name_on_second_node(broken_cluster)
    backend = await aiolocks.connect(f"{broken_cluster.url}?connect_timeout=5")
    try:
        async with backend.mutex(name).hold(timeout=0):
            pass  # warm up: the client knows the slot map
        await asyncio.to_thread(_uncover_first_third, broken_cluster)
        # the node that serves the lock runs; only the cluster's state is "down"
        with pytest.raises(aiolocks.BackendUnavailableError):
            async with backend.mutex(name).hold(timeout=1):
                pass
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_write_into_a_connection_closed_under_it_is_a_connection_error(
    redis_cluster: RedisCluster,
) -> None:
    """A command whose connection redis-py closes under its write: ``ConnectionError``.

    Finding 3 of the cluster runs: during a primary's ``kill -9``, a command
    meets ``CLUSTERDOWN`` and redis-py's cluster client disconnects every
    connection of every node, those in use too. A write that had checked its
    connection and was waiting for its own ``wait_for`` task then found no
    stream: ``AttributeError: 'NoneType' object has no attribute
    'writelines'`` escaped ``hold()`` (reproduced with kill -9 under load).
    Here the same interleaving is made by hand on a connection of the client
    aiolocks builds: redis-py's ``ConnectionError`` (exactly that type, which
    its cluster client retries) must come out instead.
    """
    name = "closed-under-write"
    async with aiolocks.connect(f"{redis_cluster.url}?connect_timeout=5") as backend:
        assert isinstance(backend, RedisBackend)
        async with backend.mutex(name).hold(timeout=5):
            pass  # the client has met the cluster: its node for the lock is known
        client: Any = backend._driver.node.client
        node = client.get_node_from_key(f"{{mutex:{name}}}")
        connection = node.acquire_connection()
        try:
            await connection.connect()
            write = asyncio.create_task(
                connection.send_packed_command(connection.pack_command("PING"))
            )
            # one event-loop step: the write checked that the connection is open
            # and now waits for the task that will write (asyncio.wait_for, 3.11)
            await asyncio.sleep(0)
            if write.done():  # pragma: no cover - a Python whose wait_for does not yield
                pytest.skip("the write does not yield between its check and the write here")
            # what redis-py's handling of CLUSTERDOWN does to every connection
            await connection.disconnect(nowait=True)
            with pytest.raises(RedisConnectionError) as caught:
                await write
            assert type(caught.value) is RedisConnectionError, caught.value
        finally:
            await connection.disconnect()
            node.release(connection)
        async with backend.mutex(name).hold(timeout=5):
            pass  # the node's connections reconnect on their next use
        # every node the client met (built by redis-py from its keywords) is guarded
        assert all(issubclass(n.connection_class, _ClosedUnderWrite) for n in client.get_nodes())


def test_a_cluster_client_laid_out_otherwise_keeps_its_connections() -> None:
    """The version gate: a client without redis-py 8's connection keywords is left alone."""
    assert _guard_cluster_writes(object()) is False
