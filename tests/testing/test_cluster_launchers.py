"""The launcher options the cluster fault runs need: standbys, cluster replicas, peer routes."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from aiolocks.testing import EtcdCluster, PostgresCommandError, PostgresServer, RedisCluster
from aiolocks.testing.servers import LOCALHOST, ZooKeeperEnsemble

pytestmark = pytest.mark.slow


def _eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def _primary_of(server: PostgresServer) -> PostgresServer | None:
    return server.standby_of  # read fresh (promote() changes it)


@pytest.mark.postgres
def test_postgres_standby_promote_and_rebuild() -> None:
    """A streaming standby follows, is promoted, and the old primary becomes its standby."""
    with PostgresServer() as primary, PostgresServer(standby_of=primary) as standby:
        assert standby.standby_of is primary
        assert standby.in_recovery() and not primary.in_recovery()
        primary.query("CREATE TABLE launcher_t (x int)")
        primary.query("INSERT INTO launcher_t VALUES (1)")

        def replicated() -> bool:
            try:
                return standby.query("SELECT x FROM launcher_t") == [("1",)]
            except PostgresCommandError:  # the table itself is not replayed yet
                return False

        _eventually(replicated)
        primary.kill()
        standby.promote()
        assert not standby.in_recovery()
        assert _primary_of(standby) is None
        standby.query("INSERT INTO launcher_t VALUES (2)")
        primary.rebuild_as_standby(standby)
        assert primary.in_recovery() and primary.standby_of is standby
        rows = primary.query("SELECT x FROM launcher_t ORDER BY x")
        assert rows == [("1",), ("2",)]


@pytest.mark.redis
def test_redis_cluster_with_replicas() -> None:
    """Each master gets its replica: masters first in ``nodes``, replicas in sync."""
    with RedisCluster(3, replicas=1) as cluster:
        nodes = cluster.nodes
        assert len(nodes) == 6
        roles = [node.info("replication") for node in nodes]
        assert [info["role"] for info in roles] == ["master"] * 3 + ["slave"] * 3
        master_ports = {str(node.port) for node in nodes[:3]}
        followed = [info["master_port"] for info in roles[3:]]
        assert sorted(followed) == sorted(master_ports)
        assert all(info["master_link_status"] == "up" for info in roles[3:])
        assert "cluster_state:ok" in str(nodes[0].command("CLUSTER", "INFO"))


def test_redis_cluster_rejects_negative_replicas() -> None:
    with pytest.raises(ValueError, match="replicas must be >= 0"):
        RedisCluster(3, replicas=-1)


@pytest.mark.zookeeper
def test_zookeeper_ensemble_peer_route_is_asked_for_every_link() -> None:
    """Each member asks the route for both peer ports of every other member."""
    asked: set[tuple[int, int, int]] = set()

    def route(source: int, target: int, port: int) -> tuple[str, int]:
        asked.add((source, target, port))
        return LOCALHOST, port  # direct: the ensemble must form as usual

    with ZooKeeperEnsemble(3, peer_route=route) as ensemble:
        ensemble.wait_for_leader()
        ports = {m.server_id: (m.quorum_port, m.election_port) for m in ensemble.members}
        expected = {
            (source, target, port)
            for source in ports
            for target in ports
            if source != target
            for port in ports[target]
        }
        assert asked == expected


@pytest.mark.etcd
def test_etcd_cluster_peer_route_sets_the_advertised_peer_urls() -> None:
    """Members advertise the routed peer address; the cluster forms through it."""
    asked: dict[str, int] = {}

    def route(name: str, port: int) -> tuple[str, int]:
        asked[name] = port
        return LOCALHOST, port  # direct: the cluster must form as usual

    with EtcdCluster(3, peer_route=route) as cluster:
        cluster.wait_for_leader()
        assert asked == {m.name: m.peer_port for m in cluster.members}
        assert all(m.advertised_peer_url == m.peer_url for m in cluster.members)
        listed = cluster.etcdctl("member", "list")
        assert all(m.peer_url in listed for m in cluster.members)
