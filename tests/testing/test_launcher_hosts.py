"""``host=`` of the launchers: each server on its own loopback address, as on separate machines.

Linux routes all of ``127.0.0.0/8`` to the loopback interface, so a member
can bind ``127.0.0.21`` without any setup. What must hold: the server binds
that address only (nothing answers on ``127.0.0.1`` at its port), and what
it tells its peers and clients (ZooKeeper's ``server.N`` lines, etcd's
advertised URLs, a Redis replica's or node's announced address, a standby's
``primary_conninfo``) names that address, not the connection's source
address (which on loopback is ``127.0.0.1``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from aiolocks.testing import (
    EtcdCluster,
    EtcdServer,
    PostgresServer,
    RedisCluster,
    RedisSentinelSet,
    RedisServer,
)
from aiolocks.testing.servers import ZooKeeperEnsemble, ZooKeeperServer

pytestmark = pytest.mark.slow


def _refused(host: str, port: int) -> bool:
    """Whether nothing accepts a connection on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return False
    except OSError:
        return True


def _addresses(first: int, count: int) -> list[str]:
    return [f"127.0.0.{first + i}" for i in range(count)]


LAUNCHERS: dict[str, Callable[[object], object]] = {
    "ZooKeeperServer": lambda host: ZooKeeperServer(host=host),  # type: ignore[arg-type]
    "ZooKeeperEnsemble": lambda host: ZooKeeperEnsemble(3, host=host),  # type: ignore[arg-type]
    "EtcdServer": lambda host: EtcdServer(host=host),  # type: ignore[arg-type]
    "EtcdCluster": lambda host: EtcdCluster(3, host=host),  # type: ignore[arg-type]
    "RedisServer": lambda host: RedisServer(host=host),  # type: ignore[arg-type]
    "RedisSentinelSet": lambda host: RedisSentinelSet(host=host),  # type: ignore[arg-type]
    "RedisCluster": lambda host: RedisCluster(3, host=host),  # type: ignore[arg-type]
    "PostgresServer": lambda host: PostgresServer(host=host),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("host", ["localhost", "::1", "127.0.0.300", "", 21])
def test_host_must_be_an_ipv4_literal(launcher: str, host: object) -> None:
    """A name, an IPv6 or malformed address is refused when the launcher is made."""
    with pytest.raises(ValueError, match="IPv4 address literal"):
        LAUNCHERS[launcher](host)


@pytest.mark.parametrize("launcher", ["ZooKeeperEnsemble", "EtcdCluster", "RedisCluster"])
def test_one_address_per_member(launcher: str) -> None:
    """A sequence of addresses must have one per member (or per node)."""
    with pytest.raises(ValueError, match=r"one address per (member|node) \(3\), got 2"):
        LAUNCHERS[launcher](["127.0.0.21", "127.0.0.22"])


def test_sentinel_set_wants_an_address_per_process() -> None:
    """Master, replica and each sentinel: 2 + 3 addresses."""
    with pytest.raises(ValueError, match=r"\(master, replica, sentinels\) \(5\), got 3"):
        RedisSentinelSet(host=_addresses(21, 3))


@pytest.mark.zookeeper
def test_zookeeper_ensemble_members_on_their_own_addresses() -> None:
    """Each member serves on its address (client, quorum, election); a leader is elected."""
    hosts = _addresses(41, 3)
    with ZooKeeperEnsemble(3, host=hosts) as ensemble:
        assert [member.host for member in ensemble.members] == hosts
        assert ensemble.hosts == ",".join(f"{m.host}:{m.port}" for m in ensemble.members)
        ensemble.wait_for_leader()
        for member in ensemble.members:
            assert member.mode() in ("leader", "follower")
            assert _refused("127.0.0.1", member.port)
            assert _refused("127.0.0.1", member.election_port)


@pytest.mark.etcd
def test_etcd_cluster_members_on_their_own_addresses() -> None:
    """Each member listens and advertises on its address; the cluster elects a leader."""
    hosts = _addresses(44, 3)
    with EtcdCluster(3, host=hosts) as cluster:
        assert cluster.endpoints == tuple(
            f"{host}:{m.port}" for host, m in zip(hosts, cluster.members, strict=True)
        )
        listed = cluster.etcdctl("member", "list")
        for host, member in zip(hosts, cluster.members, strict=True):
            assert f"http://{host}:{member.peer_port}" in listed
            assert f"http://{host}:{member.port}" in listed
            assert _refused("127.0.0.1", member.port)
            assert _refused("127.0.0.1", member.peer_port)


@pytest.mark.redis
def test_sentinel_set_processes_on_their_own_addresses() -> None:
    """The sentinels report the master's and the replica's own addresses, and each other's."""
    hosts = _addresses(47, 5)
    with RedisSentinelSet(host=hosts) as sentinels:
        master, replica = sentinels.master, sentinels.replica
        assert (master.host, replica.host) == (hosts[0], hosts[1])
        assert sentinels.sentinel_addresses == [
            (h, s.port) for h, s in zip(hosts[2:], sentinels.sentinels, strict=True)
        ]
        assert master.info("replication")["slave0"].startswith(f"ip={hosts[1]},")
        for sentinel in sentinels.sentinels:
            assert sentinel.master_address() == (hosts[0], master.port)
            replicas = sentinel.command("SENTINEL", "REPLICAS", sentinels.service_name)
            assert isinstance(replicas, list) and hosts[1] in str(replicas[0])
            peers = str(sentinel.command("SENTINEL", "SENTINELS", sentinels.service_name))
            assert "127.0.0.1" not in peers
        assert _refused("127.0.0.1", master.port)


@pytest.mark.redis
def test_redis_cluster_nodes_on_their_own_addresses() -> None:
    """Every node knows every other by its own address (``CLUSTER NODES``)."""
    hosts = _addresses(52, 6)
    with RedisCluster(3, replicas=1, host=hosts) as cluster:
        assert cluster.addresses == [(h, n.port) for h, n in zip(hosts, cluster.nodes, strict=True)]
        for node in cluster.nodes:
            listed = str(node.command("CLUSTER", "NODES"))
            for host, other in zip(hosts, cluster.nodes, strict=True):
                assert f"{host}:{other.port}@" in listed
            assert _refused("127.0.0.1", node.port)


@pytest.mark.postgres
def test_postgres_standby_on_its_own_address() -> None:
    """The standby streams from the primary's own address; each listens on its address only."""
    with (
        PostgresServer(host="127.0.0.58") as primary,
        PostgresServer(standby_of=primary, host="127.0.0.59") as standby,
    ):
        assert standby.in_recovery()
        rows = standby.query("SELECT setting FROM pg_settings WHERE name = 'primary_conninfo'")
        assert "host=127.0.0.58" in str(rows[0][0])
        assert primary.url.startswith("postgresql://postgres@127.0.0.58:")
        for server in (primary, standby):
            assert _refused("127.0.0.1", server.port)


@pytest.mark.parametrize(
    "announce", [("localhost", 7000), ("127.0.0.10", 0), ("127.0.0.10", 70000), ("127.0.0.10", "1")]
)
def test_redis_announce_is_checked(announce: tuple[str, int]) -> None:
    """``announce=(ip, port)``: an IPv4 literal and a TCP port, refused before any start."""
    with pytest.raises(ValueError, match=r"IPv4 address literal|port must be 1-65535"):
        RedisServer(announce=announce)


@pytest.mark.redis
def test_sentinel_set_route_is_what_everyone_is_told() -> None:
    """With ``route``, the servers announce the routed address and the sentinels report it."""
    asked: list[tuple[int, str, int]] = []

    def route(index: int, host: str, port: int) -> tuple[str, int]:
        asked.append((index, host, port))
        return host, port  # direct: the set must form as usual

    hosts = _addresses(60, 5)
    with RedisSentinelSet(host=hosts, route=route) as sentinels:
        master, replica = sentinels.master, sentinels.replica
        assert asked == [(0, hosts[0], master.port), (1, hosts[1], replica.port)]
        assert master.announced == (hosts[0], master.port)
        assert master.info("replication")["slave0"].startswith(
            f"ip={hosts[1]},port={replica.port},"
        )
        for sentinel in sentinels.sentinels:
            assert sentinel.master_address() == master.announced


def test_redis_cluster_route_names_one_address_per_node() -> None:
    """A node announces one address: its client and bus routes must agree on it."""
    answers = iter(["127.0.0.10", "127.0.0.11"])

    def route(index: int, host: str, port: int) -> tuple[str, int]:
        return next(answers), port

    expected = r"must be on one address, not 127\.0\.0\.10 and 127\.0\.0\.11"
    with pytest.raises(ValueError, match=expected):
        RedisCluster(1, route=route).start()


@pytest.mark.redis
def test_redis_cluster_route_is_what_everyone_is_told() -> None:
    """With ``route``, each node is asked for its client and bus port and announces the answers."""
    asked: list[tuple[int, str]] = []

    def route(index: int, host: str, port: int) -> tuple[str, int]:
        asked.append((index, host))
        return host, port  # direct: the cluster must form as usual

    hosts = _addresses(65, 3)
    with RedisCluster(3, host=hosts, route=route) as cluster:
        assert asked == [(i, host) for i, host in enumerate(hosts) for _ in range(2)]
        assert cluster.addresses == [node.announced for node in cluster.nodes]
        assert cluster.addresses == [(h, n.port) for h, n in zip(hosts, cluster.nodes, strict=True)]


@pytest.mark.zookeeper
@pytest.mark.etcd
@pytest.mark.redis
def test_single_servers_on_their_own_addresses() -> None:
    """ZooKeeper, etcd and Redis alone: serving on ``host``, nothing on ``127.0.0.1``."""
    with (
        ZooKeeperServer(host="127.0.0.68") as zookeeper,
        EtcdServer(host="127.0.0.69") as etcd,
        RedisServer(host="127.0.0.70") as redis,
    ):
        assert zookeeper.hosts == f"127.0.0.68:{zookeeper.port}"
        assert zookeeper.mode() == "standalone"
        assert etcd.url == f"etcd://127.0.0.69:{etcd.port}" and etcd.health()
        assert redis.url == f"redis://127.0.0.70:{redis.port}" and redis.ping()
        assert redis.announced == ("127.0.0.70", redis.port)
        for port in (zookeeper.port, etcd.port, etcd.peer_port, redis.port):
            assert _refused("127.0.0.1", port)
