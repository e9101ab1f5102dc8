"""The membership checker (``membership.py``) on every backend with a record store, under faults.

Three workers, each its own backend (through its own TCP fault proxy on a
server backend), join one group and split 200 keys with a Partitioner.
Seeded faults (``AIOLOCKS_CHAOS_SEED``): graceful leaves (churn), the
backend closed under a member (a dying process), its record deleted by an
operator, its connections cut and refused until it is told (partitioned
away: the server ends the session), and on PostgreSQL
``pg_terminate_backend`` of a random client session. ``AIOLOCKS_CHAOS_LONG=1``
runs many more faults. See docs/chaos.md, "Membership under faults".
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from aiolocks._core.group import member_child
from aiolocks.etcd._client import EtcdClient, RangeOp
from aiolocks.testing import TcpProxy

from ._worker import session_of
from .checker import chaos_seed, expire_zk_session
from .cluster import chaos_long
from .conftest import record_summary
from .membership import Fault, Incarnation, MembershipRun, churn, close, delete, partition

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

WORKERS = 3

#: URL options: short sessions, so that a partitioned member's session ends quickly
OPTIONS = {
    "redis": "lease_time=2&connect_timeout=5",
    "zookeeper": "session_timeout=3&connect_timeout=5",
    "etcd": "lease_ttl=2&connect_timeout=5",
    "postgres": "heartbeat=1&sslmode=disable&connect_timeout=5",
}
FIXTURES = {
    "redis": "redis_server",
    "zookeeper": "zookeeper_server",
    "etcd": "etcd_server",
    "postgres": "postgres_server",
}


def _rounds() -> int:
    return 10 if chaos_long() else 1


@contextlib.asynccontextmanager
async def _proxies(host: str, port: int) -> AsyncIterator[list[TcpProxy]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(TcpProxy(host, port)) for _ in range(WORKERS)]


def _with(url: str, options: str) -> str:
    return url + ("&" if "?" in url else "?") + options


def _victim(run: MembershipRun, rng: random.Random) -> Incarnation | None:
    return run.pick(rng)


def expire_fault(host: str, port: int) -> Fault:
    """ZooKeeper: the member's session expired from outside (Curator's KillSession)."""

    async def expire(run: MembershipRun, rng: random.Random) -> str:
        inc = _victim(run, rng)
        session = None if inc is None else session_of(inc.backend)
        if inc is None or session is None:
            return "expire: no session"
        session_id, password = session
        assert isinstance(session_id, int) and isinstance(password, str)
        run.depart(inc, "session killed")
        await expire_zk_session(host, port, session_id, bytes.fromhex(password))
        await run.wait_told(inc)
        return f"expire: session of {inc.member_id}"

    return expire


def revoke_fault(server: Any) -> Fault:
    """etcd: the lease of the member's record revoked (``etcdctl lease revoke``)."""

    async def revoke(run: MembershipRun, rng: random.Random) -> str:
        inc = _victim(run, rng)
        if inc is None:
            return "revoke: nobody"
        child = member_child(inc.member_id).encode()
        async with EtcdClient(list(server.endpoints), request_timeout=3.0) as client:
            found = await client.range(RangeOp.of(b"\x00", prefix=True, keys_only=True))
            lease = next(kv.lease for kv in found.kvs if kv.key.endswith(child))
            run.depart(inc, "session killed")
            await client.lease_revoke(lease)
        await run.wait_told(inc)
        return f"revoke: lease {lease:x} of {inc.member_id}"

    return revoke


def terminate_fault(server: Any) -> Fault:
    """PostgreSQL: ``pg_terminate_backend`` of every client session."""

    async def terminate(run: MembershipRun, rng: random.Random) -> str:
        async def action() -> str:
            return f"terminate: {await asyncio.to_thread(server.terminate_backends)} sessions"

        return await run.sweep("session killed", action)

    return terminate


def client_kill_fault(url: str) -> Fault:
    """Redis: ``CLIENT KILL TYPE normal``: every client connection cut server-side."""

    async def kill(run: MembershipRun, rng: random.Random) -> str:
        async def action() -> str:
            client = redis.asyncio.Redis.from_url(url)
            try:
                killed = await client.client_kill_filter(_type="normal", skipme=True)
            finally:
                await client.aclose()
            return f"client kill: {killed}"

        return await run.sweep("connections killed", action)

    return kill


def restart_fault(server: Any) -> Fault:
    """The server killed (SIGKILL) and started again on the same port."""

    async def restart(run: MembershipRun, rng: random.Random) -> str:
        async def action() -> str:
            await asyncio.to_thread(server.kill)
            await asyncio.to_thread(server.start)
            return "restart: server killed and started"

        return await run.sweep("restart", action)

    return restart


def server_faults(label: str, server: Any) -> dict[str, Fault]:
    """The faults of every server backend, plus its own server-side session kill."""
    faults: dict[str, Fault] = {
        "churn": churn,
        "close": close,
        "delete": delete,
        "partition": partition,
    }
    if label == "zookeeper":
        faults["expire"] = expire_fault(server.host, server.port)
    elif label == "etcd":
        faults["revoke"] = revoke_fault(server)
    elif label == "postgres":
        faults["terminate"] = terminate_fault(server)
    else:
        faults["client_kill"] = client_kill_fault(server.url)
    return faults


async def _check(run: MembershipRun, faults: dict[str, Fault]) -> None:
    seed = chaos_seed()
    try:
        await run.run(faults, _rounds(), seed, WORKERS)
    finally:
        report = await run.finish()
    record_summary(f"{report.summary()} (seed {seed})")
    events = "\n".join(run.events)
    assert not report.problems, "\n".join([*report.problems, "faults:", events])
    # the run did real work: every fault ran, members came and went
    assert len(run.events) == _rounds() * len(faults), events
    assert report.views > WORKERS and sum(report.departures.values()) >= 1, report


async def test_membership_on_memory() -> None:
    url = f"memory://members-{uuid.uuid4().hex[:8]}"
    run = MembershipRun("memory", [url] * WORKERS, url)
    await _check(run, {"churn": churn, "close": close, "delete": delete})


@pytest.mark.parametrize("label", sorted(FIXTURES))
async def test_membership_on_a_server(request: pytest.FixtureRequest, label: str) -> None:
    server = request.getfixturevalue(FIXTURES[label])
    await _run_on(label, server, server_faults(label, server))


@pytest.mark.parametrize("label", sorted(FIXTURES))
async def test_membership_across_server_restarts(
    request: pytest.FixtureRequest, label: str
) -> None:
    server = request.getfixturevalue(f"{label}_restartable")
    faults = {"churn": churn, "restart": restart_fault(server)}
    if chaos_long():
        faults["partition"] = partition
    await _run_on(f"{label}-restart", server, faults)


async def _run_on(label: str, server: Any, faults: dict[str, Fault]) -> None:
    direct = _with(server.url, OPTIONS[label.partition("-")[0]])
    async with _proxies(server.host, server.port) as proxies:
        netloc = f"{server.host}:{server.port}"
        urls = [direct.replace(netloc, proxy.netloc, 1) for proxy in proxies]
        await _check(MembershipRun(label, urls, direct, proxies=proxies), faults)
