"""What the cluster fault runs found in the library, each as a deterministic test.

A finding the library does not handle yet is marked ``xfail(strict=True)``
with the reason: the test starts passing (and so fails as XPASS) when the
library is fixed, and the marker must then be removed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import aiolocks
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
