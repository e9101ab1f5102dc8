"""The real-server launchers, the pytest fixtures built on them and the TCP fault proxy."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiozk
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel

from aiolocks.testing import (
    RedisCluster,
    RedisSentinelSet,
    RedisServer,
    RedisServerGroup,
    ServerNotInstalledError,
    ServerNotManagedError,
    ServerStartError,
    TcpProxy,
    ZooKeeperEnsemble,
    ZooKeeperServer,
    free_port,
    pytest_plugin,
)
from aiolocks.testing.pytest_plugin import require_managed


def _refuses(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return False
    except ConnectionRefusedError:
        return True


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _zk_client(hosts: str, session_timeout: float = 10.0) -> aiozk.ZKClient:
    client = aiozk.ZKClient(hosts, session_timeout=session_timeout)
    await asyncio.wait_for(client.start(), 20)
    return client


# --------------------------------------------------------------------------- ZooKeeper


@pytest.mark.asyncio
async def test_zookeeper_server_serves_aiozk(zookeeper_server: ZooKeeperServer) -> None:
    assert zookeeper_server.url == f"zk://{zookeeper_server.hosts}"
    client = await _zk_client(zookeeper_server.hosts)
    try:
        path = f"/aiolocks-test-{uuid.uuid4().hex}"
        await client.create(path, data=b"hello")
        assert await client.get_data(path) == b"hello"
        await client.get_data(path, watch=True)
        await client.delete(path)
    finally:
        await client.close()
    srvr = zookeeper_server.four_letter("srvr")
    assert "Mode: standalone" in srvr
    assert "zk_version" in zookeeper_server.four_letter("mntr")
    assert "connections watching" in zookeeper_server.four_letter("wchs")
    assert "/127.0.0.1" in zookeeper_server.four_letter("cons")


def test_zookeeper_settings(zookeeper_server: ZooKeeperServer) -> None:
    require_managed(zookeeper_server)
    conf = zookeeper_server.four_letter("conf")
    assert "tickTime=200" in conf
    assert "minSessionTimeout=400" in conf
    assert "maxSessionTimeout=60000" in conf
    assert zookeeper_server.log_path is not None
    assert zookeeper_server.log_path.is_file()
    assert "checkIntervalMs=500" in zookeeper_server.log_path.read_text()


@pytest.mark.asyncio
async def test_zookeeper_restart_keeps_port_and_data(
    zookeeper_restartable: ZooKeeperServer,
) -> None:
    server = zookeeper_restartable
    port, first_pid = server.port, server.pid
    assert first_pid is not None
    path = f"/restart-{uuid.uuid4().hex}"
    # Fresh clients on each side of the restart: aiozk 0.32 does not notice a
    # closed server connection until a request or heartbeat times out.
    client = await _zk_client(server.hosts)
    try:
        await client.create(path, data=b"kept")
    finally:
        await client.close()

    server.stop()
    assert not server.running
    assert _process_gone(first_pid)
    assert _refuses(port)

    server.start()
    assert server.port == port
    second_pid = server.pid
    assert second_pid not in (None, first_pid)
    client = await _zk_client(server.hosts)
    try:
        assert await client.get_data(path) == b"kept"  # the data dir survived
    finally:
        await client.close()

    server.kill()
    assert second_pid is not None
    assert _process_gone(second_pid)
    assert _refuses(port)
    server.start()
    assert "Mode: standalone" in server.four_letter("srvr")
    client = await _zk_client(server.hosts)
    try:
        assert await client.get_data(path) == b"kept"  # forceSync=no survives kill -9
    finally:
        await client.close()


def test_zookeeper_external_is_not_managed() -> None:
    server = ZooKeeperServer.external("zk://10.0.0.1:2181,10.0.0.2:2182")
    assert not server.managed
    assert server.hosts == "10.0.0.1:2181,10.0.0.2:2182"
    assert server.url == "zk://10.0.0.1:2181,10.0.0.2:2182"
    assert (server.host, server.port) == ("10.0.0.1", 2181)
    with pytest.raises(ServerNotManagedError):
        server.stop()
    with pytest.raises(ServerNotManagedError):
        server.start()
    server.close()  # a no-op for external servers
    with pytest.raises(pytest.skip.Exception):
        require_managed(server)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_zookeeper_ensemble_survives_leader_kill(
    zookeeper_ensemble: ZooKeeperEnsemble,
) -> None:
    require_managed(zookeeper_ensemble)
    ensemble = zookeeper_ensemble
    assert len(ensemble.members) == 3
    assert ensemble.url == f"zk://{ensemble.hosts}"
    leader = ensemble.leader()
    assert leader.mode() == "leader"
    assert sorted(m.mode() or "" for m in ensemble.members) == ["follower", "follower", "leader"]
    assert len(ensemble.followers()) == 2

    path = f"/ensemble-{uuid.uuid4().hex}"
    client = await _zk_client(ensemble.hosts)
    try:
        await client.create(path, data=b"before")
    finally:
        await client.close()

    leader.kill()
    try:
        new_leader = ensemble.wait_for_leader(timeout=30)
        assert new_leader is not leader
        assert not leader.running
        # The ensemble stays usable with two of three members. (A fresh client:
        # aiozk 0.32 does not notice a dropped connection until a timeout.)
        client = await _zk_client(ensemble.hosts)
        try:
            assert await client.get_data(path) == b"before"
            await client.set_data(path, b"after")
            assert await client.get_data(path) == b"after"
            await client.delete(path)
        finally:
            await client.close()
    finally:
        # Cleanup path: give the shared ensemble its third member back.
        leader.start()
        ensemble.wait_for_leader(timeout=30)
    assert leader.mode() == "follower"


# --------------------------------------------------------------------------- Redis


@pytest.mark.asyncio
async def test_redis_server_serves_redis_py(redis_server: RedisServer) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        key = f"aiolocks-test-{uuid.uuid4().hex}"
        assert await client.set(key, "v", px=10_000)
        assert await client.get(key) == b"v"
        await client.delete(key)
    finally:
        await client.aclose()
    stats = redis_server.info("commandstats")
    assert "cmdstat_set" in stats
    assert redis_server.command("PING") == "PONG"
    assert redis_server.ping()


def test_redis_restart_and_kill(redis_restartable: RedisServer) -> None:
    server = redis_restartable
    port, pid = server.port, server.pid
    assert pid is not None
    assert server.url == f"redis://127.0.0.1:{port}"
    server.command("SET", "k", "v")
    assert server.command("GET", "k") == "v"
    assert server.command("CONFIG", "RESETSTAT") == "OK"
    assert server.command("CONFIG", "GET", "save") == ["save", ""]

    server.stop()
    assert _process_gone(pid)
    assert _refuses(port)
    server.start()
    assert server.port == port
    assert server.command("GET", "k") is None  # no persistence

    server.command("SET", "k", "v")
    server.kill()
    assert not server.ping()
    server.start()
    assert server.ping()
    assert server.log_path is not None
    assert "Ready to accept connections" in server.log_path.read_text()


def test_start_failure_reports_log_tail() -> None:
    server = RedisServer(extra_args=("--no-such-directive", "yes"))
    try:
        with pytest.raises(ServerStartError, match="no-such-directive") as caught:
            server.start()
        assert caught.value.log_path is not None
        assert not server.running
    finally:
        server.close()


def test_missing_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOLOCKS_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(ServerNotInstalledError):
        RedisServer().start()

    monkeypatch.delenv("AIOLOCKS_SKIP_MISSING_SERVERS", raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install .*redis-server"):
        pytest_plugin._launch(RedisServer, "AIOLOCKS_REDIS_URL")
    monkeypatch.setenv("AIOLOCKS_SKIP_MISSING_SERVERS", "1")
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install .*redis-server"):
        pytest_plugin._launch(RedisServer, "AIOLOCKS_REDIS_URL")


def test_redis_external_is_not_managed(redis_server: RedisServer) -> None:
    external = RedisServer.external(redis_server.url)
    assert not external.managed
    assert external.url == redis_server.url
    assert external.command("PING") == "PONG"
    with pytest.raises(ServerNotManagedError):
        external.kill()


def test_redis_servers5(redis_servers5: RedisServerGroup) -> None:
    assert len(redis_servers5) == 5
    assert len(set(redis_servers5.urls)) == 5
    assert all(server.ping() for server in redis_servers5)


@pytest.mark.asyncio
async def test_redis_cluster_state_ok(redis_cluster: RedisCluster) -> None:
    assert redis_cluster.url.startswith("redis+cluster://")
    for node in redis_cluster.nodes:
        info = node.command("CLUSTER", "INFO")
        assert isinstance(info, str)
        assert "cluster_state:ok" in info
    host, port = redis_cluster.addresses[0]
    client = AsyncRedisCluster(host=host, port=port)
    try:
        keys = [f"aiolocks-test-{uuid.uuid4().hex}-{i}" for i in range(20)]
        for key in keys:
            await client.set(key, key, px=10_000)
        assert [await client.get(key) for key in keys] == [key.encode() for key in keys]
        owners = {getattr(client.get_node_from_key(key), "port", None) for key in keys}
        assert len(owners) > 1  # the keys are spread over the masters
        for key in keys:
            await client.delete(key)
    finally:
        await client.aclose()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_redis_sentinel_failover() -> None:
    with RedisSentinelSet() as sentinel_set:
        assert sentinel_set.url.endswith("/mymaster")
        old_master = sentinel_set.master
        # redis-py's Sentinel.__init__ has no annotations.
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            sentinel_set.sentinel_addresses, socket_timeout=2.0
        )
        try:
            assert await sentinel.discover_master("mymaster") == old_master.address
            client = sentinel.master_for("mymaster")
            try:
                await client.set("k", "v")
                # Replication is asynchronous: make sure the replica has it.
                assert await client.execute_command("WAIT", 1, 5000) == 1
            finally:
                await client.aclose()

            started = time.monotonic()
            new_master = sentinel_set.kill_master(timeout=30)
            assert time.monotonic() - started < 30
            assert new_master.port != old_master.port
            assert sentinel_set.master is new_master
            assert sentinel_set.replica is old_master
            assert await sentinel.discover_master("mymaster") == new_master.address
            assert new_master.command("GET", "k") == "v"  # replicated before the kill
        finally:
            for connection in sentinel.sentinels:
                await connection.aclose()


# --------------------------------------------------------------------------- TCP proxy


class _RespClient:
    """A raw RESP connection, so the proxy's effect is not hidden by client retries."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int) -> _RespClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def send_ping(self) -> None:
        self.writer.write(b"*1\r\n$4\r\nPING\r\n")

    async def ping(self) -> bytes:
        self.send_ping()
        return await self.reader.readline()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


@pytest_asyncio.fixture
async def proxy(redis_server: RedisServer) -> AsyncIterator[TcpProxy]:
    async with TcpProxy(redis_server.host, redis_server.port) as tcp_proxy:
        yield tcp_proxy


@pytest.mark.asyncio
async def test_proxy_forwards(proxy: TcpProxy) -> None:
    assert proxy.address == ("127.0.0.1", proxy.port)
    assert proxy.netloc == f"127.0.0.1:{proxy.port}"
    client = aioredis.Redis(host=proxy.host, port=proxy.port)
    try:
        assert await client.ping()
        key = f"aiolocks-test-{uuid.uuid4().hex}"
        await client.set(key, b"x" * 200_000, px=10_000)
        assert await client.get(key) == b"x" * 200_000
    finally:
        await client.aclose()
    assert proxy.connections_total >= 1


@pytest.mark.asyncio
async def test_proxy_cut_closes_live_connections(proxy: TcpProxy) -> None:
    first = await _RespClient.connect(proxy.port)
    second = await _RespClient.connect(proxy.port)
    try:
        assert await first.ping() == b"+PONG\r\n"
        assert await second.ping() == b"+PONG\r\n"
        assert proxy.active_connections == 2
        assert proxy.cut() == 2
        assert proxy.active_connections == 0
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            data = await asyncio.wait_for(first.reader.read(1), 5)
            if not data:
                raise ConnectionResetError("EOF")
    finally:
        await first.close()
        await second.close()
    # New connections are still accepted after a cut.
    third = await _RespClient.connect(proxy.port)
    try:
        assert await third.ping() == b"+PONG\r\n"
        assert proxy.connections_total == 3
    finally:
        await third.close()


@pytest.mark.asyncio
async def test_proxy_refuse(proxy: TcpProxy) -> None:
    old = await _RespClient.connect(proxy.port)
    try:
        assert await old.ping() == b"+PONG\r\n"
        proxy.refuse()
        refused = await _RespClient.connect(proxy.port)
        try:
            assert await asyncio.wait_for(refused.reader.read(), 5) == b""
        finally:
            await refused.close()
        assert await old.ping() == b"+PONG\r\n"  # live connections are untouched
        proxy.refuse(False)
        fresh = await _RespClient.connect(proxy.port)
        try:
            assert await fresh.ping() == b"+PONG\r\n"
        finally:
            await fresh.close()
    finally:
        await old.close()


@pytest.mark.asyncio
async def test_proxy_stall_holds_bytes_until_healed(proxy: TcpProxy) -> None:
    client = await _RespClient.connect(proxy.port)
    try:
        assert await client.ping() == b"+PONG\r\n"
        proxy.stall()
        client.send_ping()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.reader.readline(), 0.3)
        assert proxy.active_connections == 1  # the socket stays open
        proxy.stall(False)
        assert await asyncio.wait_for(client.reader.readline(), 5) == b"+PONG\r\n"
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_proxy_cut_during_stall(proxy: TcpProxy) -> None:
    client = await _RespClient.connect(proxy.port)
    try:
        await asyncio.wait_for(proxy.wait_for_connections(1), 5)
        proxy.stall()
        client.send_ping()
        assert proxy.cut() == 1
        # EOF, or a reset because the proxy never read the held-back PING.
        try:
            assert await asyncio.wait_for(client.reader.read(), 5) == b""
        except ConnectionResetError:
            pass
    finally:
        await client.close()
        proxy.heal()


@pytest.mark.asyncio
async def test_proxy_delay(proxy: TcpProxy) -> None:
    client = await _RespClient.connect(proxy.port)
    try:
        assert await client.ping() == b"+PONG\r\n"
        proxy.delay(0.25)
        started = time.monotonic()
        # Pipelined requests: latency adds once per direction, not per chunk.
        for _ in range(3):
            client.send_ping()
            await client.writer.drain()
            await asyncio.sleep(0.01)
        assert await client.reader.readexactly(21) == b"+PONG\r\n" * 3
        elapsed = time.monotonic() - started
        assert 0.5 <= elapsed < 1.5
        proxy.delay(0)
        started = time.monotonic()
        assert await client.ping() == b"+PONG\r\n"
        assert time.monotonic() - started < 0.25
    finally:
        await client.close()
    with pytest.raises(ValueError, match="delay"):
        proxy.delay(-1)


@pytest.mark.asyncio
async def test_proxy_stop_closes_everything(redis_server: RedisServer) -> None:
    tcp_proxy = await TcpProxy(redis_server.host, redis_server.port).start()
    port = tcp_proxy.port
    client = await _RespClient.connect(port)
    try:
        assert await client.ping() == b"+PONG\r\n"
        tcp_proxy.stall()
        await tcp_proxy.stop()
        assert tcp_proxy.active_connections == 0
        assert await asyncio.wait_for(client.reader.read(), 5) == b""
        assert _refuses(port)
        # It can listen again on the same port.
        tcp_proxy.heal()
        await tcp_proxy.start()
        assert tcp_proxy.port == port
        again = await _RespClient.connect(port)
        try:
            assert await again.ping() == b"+PONG\r\n"
        finally:
            await again.close()
    finally:
        await client.close()
        await tcp_proxy.stop()


@pytest.mark.asyncio
async def test_proxy_in_front_of_zookeeper(zookeeper_server: ZooKeeperServer) -> None:
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as tcp_proxy:
        client = await _zk_client(tcp_proxy.netloc)
        try:
            assert await client.exists("/")
            assert tcp_proxy.active_connections >= 1
        finally:
            await client.close()


# --------------------------------------------------------------------------- helpers


def test_free_port_is_outside_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20
    assert all(port < low for port in ports)
    assert all(_refuses(port) for port in ports)
