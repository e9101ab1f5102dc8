"""The etcd launchers of aiolocks.testing: builds, restart with data, pause, clusters."""

from __future__ import annotations

import pytest

from aiolocks.testing import (
    EtcdCluster,
    EtcdServer,
    ServerError,
    ServerNotManagedError,
    etcd_flavors,
)
from aiolocks.testing.pytest_plugin import require_managed

pytestmark = pytest.mark.etcd


def test_each_build_reports_its_version(etcd: EtcdServer) -> None:
    require_managed(etcd)
    expected = {"debian": "3.4.", "wheel": "3.5."}[etcd.flavor]
    assert etcd.version().startswith(expected)
    assert etcd.health()
    assert etcd.is_leader()
    assert etcd.url == f"etcd://127.0.0.1:{etcd.port}"


def test_restart_keeps_port_and_data_and_pause_freezes() -> None:
    with EtcdServer() as server:
        port = server.port
        server.etcdctl("put", "kept", "yes")
        server.stop()
        assert not server.running
        server.start()
        assert server.port == port
        assert "yes" in server.etcdctl("get", "kept")
        server.pause()
        assert server.paused
        with pytest.raises(TimeoutError):  # accepted by the kernel, never answered
            server.health(timeout=0.3)
        server.resume()
        assert server.health(timeout=5.0)
        server.pause()  # a paused server still stops cleanly
        directory = server.directory
        assert directory is not None and directory.exists()
    assert not server.running
    assert not directory.exists()


def test_external_servers_cannot_be_controlled() -> None:
    server = EtcdServer.external("etcd://10.0.0.1:2379,10.0.0.2:2379/prefix")
    assert server.endpoints == ("10.0.0.1:2379", "10.0.0.2:2379")
    assert not server.managed
    with pytest.raises(ServerNotManagedError):
        server.start()
    cluster = EtcdCluster.external("10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")
    assert cluster.url == "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379"
    with pytest.raises(ServerNotManagedError):
        cluster.leader()
    with pytest.raises(ValueError, match="host:port"):
        EtcdServer.external("nohost")


def test_bad_flavor_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="flavor 'docker'"):
        EtcdServer(flavor="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one member"):
        EtcdCluster(size=0)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", etcd_flavors())
def test_cluster_elects_a_new_leader_when_the_leader_dies(flavor: str) -> None:
    with EtcdCluster(flavor="wheel" if flavor == "wheel" else "debian") as cluster:
        assert len(cluster.members) == 3
        leader = cluster.leader()
        assert len(cluster.followers()) == 2
        cluster.etcdctl("put", "replicated", "1")
        leader.kill()
        new_leader = cluster.wait_for_leader()
        assert new_leader is not leader
        leader.start()
        cluster.wait_for_leader()
        # A linearizable read on the member that came back: it has caught up.
        assert "replicated" in leader.etcdctl("get", "replicated")
        with pytest.raises(ServerError):
            leader.kill()
            leader.pause()
        leader.start()
        cluster.wait_for_leader()


def test_plugin_fixtures(
    etcd_server: EtcdServer, etcd_cluster: EtcdCluster, etcd_restartable: EtcdServer
) -> None:
    assert etcd_server.url.startswith("etcd://")
    assert "OK" in etcd_server.etcdctl("put", "fixture", "1")
    assert len(etcd_cluster.endpoints) == 3
    if etcd_cluster.managed:
        assert etcd_cluster.leader() in etcd_cluster.members
    etcd_restartable.kill()
    assert not etcd_restartable.running
    etcd_restartable.start()
    assert etcd_restartable.health()
