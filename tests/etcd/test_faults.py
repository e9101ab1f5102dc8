"""Faults under the client layer: member killed in a 3-member cluster, a member stalled or cut
behind a TCP proxy, every member unreachable (the lease ends on the client-side deadline)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import grpc
import pytest
import pytest_asyncio

from aiolocks import BackendUnavailableError
from aiolocks.etcd._client import Compare, EtcdClient, EventType, PutOp, Watch, WatchEvent
from aiolocks.testing import EtcdCluster, EtcdFlavor, EtcdServer, TcpProxy, etcd_flavors
from aiolocks.testing.pytest_plugin import require_managed

from ..polling import eventually

pytestmark = pytest.mark.etcd

PATIENCE = 30.0


async def _events(watch: Watch, count: int) -> list[WatchEvent]:
    found: list[WatchEvent] = []
    async with asyncio.timeout(PATIENCE):
        async for response in watch:
            found.extend(response.events)
            if len(found) >= count:
                return found
    raise AssertionError("the watch ended")


async def _wait_for(condition: Callable[[], object], what: str) -> None:
    await eventually(condition, PATIENCE, what=what, interval=0.05)


async def _create(client: EtcdClient, key: str) -> None:
    """Create ``key`` with a write that may be repeated on another member (create-if-absent).

    A plain put caught by a leader change fails after etcd's own request
    timeout and is not repeated (it may have been applied).
    """
    result = await client.txn(
        [Compare.create_revision(key, "==", 0)], [PutOp.of(key, "v")], [], retry=True
    )
    assert result.succeeded


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    """A private 3-member cluster (its members are killed here, so not the shared one)."""
    with EtcdCluster() as started:
        yield started


@pytest_asyncio.fixture
async def proxied(etcd: EtcdServer) -> AsyncIterator[TcpProxy]:
    """A TCP proxy in front of the shared server."""
    require_managed(etcd)
    async with TcpProxy(etcd.host, etcd.port) as proxy:
        yield proxy


@pytest.mark.slow
@pytest.mark.asyncio
async def test_member_killed_requests_keepalive_and_watch_fail_over(
    cluster: EtcdCluster,
) -> None:
    # etcd itself answers a write caught by a leader change only after ~5 s.
    async with EtcdClient(list(cluster.endpoints), request_timeout=15.0) as client:
        lease = await client.lease_grant(3)
        keeper = client.keep_alive(lease)
        await client.put("f/held", "v", lease=lease.id)
        watch = await client.watch("f/", prefix=True)
        victim = next(m for m in cluster.members if m.endpoint == client.endpoint)
        victim_id = victim.member_id()
        try:
            victim.kill()
            # A write that is safe to repeat (create-if-absent, as the lock
            # recipe's) goes on on the other members; so do the keep-alive
            # stream and the watch.
            created = await client.txn(
                [Compare.create_revision("f/after-kill", "==", 0)],
                [PutOp.of("f/after-kill", "1")],
                [],
                retry=True,
            )
            assert created.succeeded
            before = keeper.refreshes
            await _wait_for(lambda: keeper.refreshes >= before + 3, "refreshes after the kill")
            assert not keeper.expired
            assert client.endpoint != victim.endpoint
            events = await _events(watch, 1)
            assert [(e.type, e.kv.key) for e in events] == [(EventType.PUT, b"f/after-kill")]
            assert (await client.get("f/held")) is not None
            status = await client.status()
            assert status["member_id"] != victim_id
        finally:
            await watch.aclose()
            await keeper.revoke()
            victim.start()
            await asyncio.to_thread(cluster.wait_for_leader)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_leader_killed_watch_resumes_without_losing_events(cluster: EtcdCluster) -> None:
    async with EtcdClient(list(cluster.endpoints), request_timeout=15.0) as client:
        leader = cluster.leader()
        # Talk to the leader first, so that its death breaks our streams.
        while client.endpoint != leader.endpoint:
            client._failed(client.endpoint)
        watch = await client.watch("g/", prefix=True)
        try:
            await _create(client, "g/1")
            leader.kill()
            await _create(client, "g/2")
            await _create(client, "g/3")
            events = await _events(watch, 3)
            assert [e.kv.key for e in events] == [b"g/1", b"g/2", b"g/3"]
        finally:
            await watch.aclose()
            leader.start()
            await asyncio.to_thread(cluster.wait_for_leader)


@pytest.mark.asyncio
async def test_stalled_member_hits_the_deadline_then_the_next_endpoint_answers(
    etcd: EtcdServer, proxied: TcpProxy
) -> None:
    # Two endpoints: the first through the proxy, the second direct.
    endpoints = [proxied.netloc, etcd.endpoints[0]]
    async with EtcdClient(endpoints, request_timeout=1.0, connect_timeout=5.0) as client:
        assert client.endpoint == proxied.netloc
        await client.put("s/k", "1")
        proxied.stall()
        # A plain write is not sent twice: it fails at its deadline, naming the member.
        with pytest.raises(BackendUnavailableError, match=proxied.netloc):
            await client.put("s/k", "2")
        # ... and the client has moved on to the other member.
        assert client.endpoint == etcd.endpoints[0]
        assert (await client.get("s/k")) is not None
        # A read stalled on the first member is retried on the second within its deadline.
        client._failed(client.endpoint)
        assert client.endpoint == proxied.netloc
        kv = await client.get("s/k", timeout=4.0)
        assert kv is not None
        assert client.endpoint == etcd.endpoints[0]
        proxied.heal()


@pytest.mark.asyncio
async def test_unreachable_everywhere_connect_and_requests_fail_with_deadlines(
    proxied: TcpProxy,
) -> None:
    proxied.stall()
    client = EtcdClient([proxied.netloc], request_timeout=0.5, connect_timeout=0.5)
    try:
        with pytest.raises(BackendUnavailableError, match="no etcd endpoint answered"):
            await client.connect()
        with pytest.raises(BackendUnavailableError, match="Range got no answer"):
            await client.get("k")
        with pytest.raises(BackendUnavailableError, match="no etcd endpoint accepted the watch"):
            await client.watch("k")
    finally:
        await client.close()
        proxied.heal()


@pytest.mark.asyncio
async def test_lease_ends_on_the_client_side_deadline_when_no_member_answers(
    proxied: TcpProxy,
) -> None:
    async with EtcdClient([proxied.netloc], request_timeout=2.0) as client:
        lease = await client.lease_grant(2)
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, float, float]] = []
        keeper = client.keep_alive(
            lease, on_expired=lambda reason: seen.append((reason, loop.time(), keeper.deadline))
        )
        await _wait_for(lambda: keeper.refreshes >= 1, "a first refresh")
        proxied.stall()
        async with asyncio.timeout(PATIENCE):
            reason = await keeper.wait_expired()
        assert "client-side" in reason
        # Declared lost only once its deadline had passed, and exactly once.
        assert len(seen) == 1
        assert seen[0][1] >= seen[0][2]
        proxied.heal()
        await keeper.aclose()


@pytest.mark.asyncio
async def test_connection_cut_watch_resumes_and_keepalive_reconnects(
    etcd: EtcdServer, proxied: TcpProxy
) -> None:
    async with EtcdClient([proxied.netloc], request_timeout=3.0) as client:
        lease = await client.lease_grant(3)
        keeper = client.keep_alive(lease)
        watch = await client.watch("c/", prefix=True)
        other = await client.watch("d/", prefix=True, no_delete=True)
        try:
            # Both watches live on one stream; both are re-created on the new one.
            assert client.watch_streams_opened == 1
            assert watch.watch_id != other.watch_id
            await client.put("c/1", "x")
            await client.put("d/1", "x")
            assert proxied.cut() >= 1
            # Writes behind the client's back while its connection is down.
            await asyncio.to_thread(etcd.etcdctl, "put", "c/2", "y")
            await asyncio.to_thread(etcd.etcdctl, "put", "d/2", "y")
            events = await _events(watch, 2)
            assert [e.kv.key for e in events] == [b"c/1", b"c/2"]
            others = await _events(other, 2)
            assert [e.kv.key for e in others] == [b"d/1", b"d/2"]
            assert client.watch_streams_opened >= 2
            before = keeper.refreshes
            await _wait_for(lambda: keeper.refreshes >= before + 2, "refreshes after the cut")
            assert not keeper.expired
        finally:
            await watch.aclose()
            await other.aclose()
            await keeper.revoke()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_frozen_member_reads_and_keepalive_move_to_another_member(
    cluster: EtcdCluster,
) -> None:
    async with EtcdClient(list(cluster.endpoints), request_timeout=6.0) as client:
        lease = await client.lease_grant(3)
        keeper = client.keep_alive(lease)
        await _wait_for(lambda: keeper.refreshes >= 1, "a first refresh")
        frozen = next(m for m in cluster.members if m.endpoint == client.endpoint)
        frozen.pause()  # SIGSTOP: its sockets stay open, nothing answers
        try:
            # A read stalls on the frozen member for part of its deadline, then
            # the next member answers it.
            assert (await client.range("nothing/", prefix=True)).count == 0
            assert client.endpoint != frozen.endpoint
            before = keeper.refreshes
            await _wait_for(lambda: keeper.refreshes >= before + 2, "refreshes elsewhere")
            assert not keeper.expired
        finally:
            frozen.resume()
            await keeper.revoke()
            await asyncio.to_thread(cluster.wait_for_leader)


def _leaderless(client: EtcdClient) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await client.status())["leader"] == 0

    return check


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize("flavor", ["debian", "wheel"])
async def test_a_write_the_member_cannot_commit_is_unavailable(flavor: EtcdFlavor) -> None:
    """A member without quorum times a write out itself: ``BackendUnavailableError``.

    Found by the cluster fault runs (a worker that reached only a minority
    member of etcd 3.5): a member that has lost its leader and cannot elect
    another answers a write, once its own request timeout (5 s plus two
    election timeouts) has run out, with gRPC ``UNKNOWN: context deadline
    exceeded`` (etcd 3.4 and 3.5 alike), which was taken for a refusal
    (``EtcdRequestError``, not an outage). The client's deadline here is
    longer than the member's, so the member's answer is the one that comes
    back.
    """
    if flavor not in etcd_flavors():
        pytest.skip(f"etcd ({flavor}) is not installed here")
    with EtcdCluster(flavor=flavor) as cluster:
        survivor, *others = cluster.members
        async with EtcdClient([survivor.endpoint], request_timeout=15.0) as client:
            await client.put("f/quorum", "before")
            for member in others:
                member.pause()
            try:
                # once the survivor has given up its leader (an election
                # without quorum), it answers a write as in the runs
                await _wait_for(_leaderless(client), "the survivor without a leader")
                with pytest.raises(BackendUnavailableError) as caught:
                    await client.put("f/quorum", "no quorum")
            finally:
                for member in others:
                    member.resume()
        cause = caught.value.__cause__
        assert isinstance(cause, grpc.aio.AioRpcError), cause
        assert cause.code() == grpc.StatusCode.UNKNOWN, cause
        assert "context deadline exceeded" in str(cause.details()), cause
