"""The Jepsen-style checker against real servers, with faults injected at random.

Every backend joins by URL: the workers only call ``aiolocks.connect(url)``.
Each test starts its own servers (it kills and restarts them), puts a
:class:`~aiolocks.testing.TcpProxy` between the workers and the server where
the faults need one, runs :func:`~tests.chaos.checker.run_chaos` and asserts
that every count that must be 0 is 0. See ``docs/chaos.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from aiolocks.testing import RedisSentinelSet, RedisServer, TcpProxy, ZooKeeperServer
from aiolocks.testing.servers import ZooKeeperEnsemble

from .checker import (
    Fault,
    Report,
    RunSpec,
    WorkerPool,
    chaos_scale,
    expire_zk_session,
    redis_leftovers,
    run_chaos,
    zk_leftovers,
)
from .conftest import record_summary

pytestmark = pytest.mark.slow

WORKERS = 3
REDIS_LEASE = 2.0
ZK_SESSION = 3.0


def _seconds(base: float) -> float:
    return base * chaos_scale()


def _check(report: Report, pool: WorkerPool, events: list[str]) -> None:
    record_summary(report.summary(), report.as_json())
    print("\n".join(["faults injected:", *events]))
    entered = report.critical_sections
    details = "\n".join(report.problems[:40])
    assert report.violations == 0, (
        f"{report.summary()}\n{details}\nfaults:\n" + "\n".join(events) + "\n" + pool.logs()
    )
    # The run must have done real work and really injected faults.
    assert entered >= 20, f"too few critical sections ran: {report.summary()}\n{pool.logs()}"
    assert sum(report.faults.values()) >= 3, report.summary()
    assert not report.problems, f"{details}\n{pool.logs()}"


# -- fault builders ----------------------------------------------------------------------


def proxy_faults(proxies: list[TcpProxy], max_stall: float) -> dict[str, Fault]:
    """cut / stall / delay on the proxy of one worker (a partition), sometimes of all."""

    def pick(rng: random.Random) -> tuple[list[TcpProxy], str]:
        if rng.random() < 0.25:
            return proxies, "every worker"
        index = rng.randrange(len(proxies))
        return [proxies[index]], f"worker {index}"

    async def cut(rng: random.Random) -> str:
        chosen, who = pick(rng)
        return f"cut {sum(proxy.cut() for proxy in chosen)} connections of {who}"

    async def stall(rng: random.Random) -> str:
        chosen, who = pick(rng)
        seconds = rng.uniform(0.2, max_stall)
        for proxy in chosen:
            proxy.stall()
        try:
            await asyncio.sleep(seconds)
        finally:
            for proxy in chosen:
                proxy.stall(False)
        return f"partitioned {who} for {seconds:.2f}s"

    async def delay(rng: random.Random) -> str:
        chosen, who = pick(rng)
        latency, seconds = rng.uniform(0.01, 0.3), rng.uniform(0.5, 2.0)
        for proxy in chosen:
            proxy.delay(latency)
        try:
            await asyncio.sleep(seconds)
        finally:
            for proxy in chosen:
                proxy.delay(0)
        return f"{latency * 1000:.0f} ms latency for {who}, {seconds:.2f}s"

    return {"cut": cut, "stall": stall, "delay": delay}


@contextlib.asynccontextmanager
async def worker_proxies(
    host: str, port: int, count: int = WORKERS
) -> AsyncIterator[list[TcpProxy]]:
    """One TcpProxy per worker process, so that one worker can be cut off alone."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(TcpProxy(host, port)) for _ in range(count)]


def block_fault(pool: WorkerPool) -> Fault:
    """Block a worker's event loop (time.sleep) past the lease, in a critical section or not."""

    async def block(rng: random.Random) -> str:
        index = rng.randrange(pool.count)
        in_cs = rng.random() < 0.5
        pool.signal(index, signal.SIGUSR1 if in_cs else signal.SIGUSR2)
        where = "in its next critical section" if in_cs else "now"
        return f"worker {index}: event loop blocked {pool.config['block']:.1f}s {where}"

    return block


def restart_fault(
    kill: Callable[[], None], start: Callable[[], object], what: str, down: float = 1.0
) -> Fault:
    """SIGKILL a server, keep it down a moment, start it again (same port)."""

    async def restart(rng: random.Random) -> str:
        await asyncio.to_thread(kill)
        seconds = rng.uniform(0.0, down)
        await asyncio.sleep(seconds)
        await asyncio.to_thread(start)
        return f"killed {what}, down {seconds:.2f}s, restarted"

    return restart


def zk_expire_fault(pool: WorkerPool, host: str, port: int) -> Fault:
    """Expire a random worker's ZooKeeper session from a second connection."""

    async def expire(rng: random.Random) -> str:
        index = rng.randrange(pool.count)
        session = pool.register.worker(index).session
        if session is None:
            return f"worker {index} reported no session yet"
        expired = await expire_zk_session(host, port, *session)
        state = "expired" if expired else "was already gone"
        return f"session 0x{session[0]:x} of worker {index} {state}"

    return expire


# -- Redis --------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.asyncio
async def test_redis_single_server_under_faults(
    redis_restartable: RedisServer, tmp_path: Path
) -> None:
    """Cut, stall, delay, kill/restart (data lost) and loop blocks against one Redis."""
    server = redis_restartable
    prefix = f"chaos-{uuid.uuid4().hex[:8]}:"
    async with worker_proxies(server.host, server.port) as proxies:
        urls = [
            f"redis://{proxy.netloc}?key_prefix={prefix}&lease_time={REDIS_LEASE}&connect_timeout=5"
            for proxy in proxies
        ]
        spec = RunSpec(
            label="redis",
            urls=urls,
            duration=_seconds(15),
            grace=REDIS_LEASE * 3 + 4,
            block=REDIS_LEASE * 1.5,
        )

        def faults(pool: WorkerPool) -> dict[str, Fault]:
            return {
                **proxy_faults(proxies, max_stall=REDIS_LEASE * 2),
                "restart": restart_fault(server.kill, server.start, "redis-server", 0.5),
                "block": block_fault(pool),
            }

        async def heal() -> None:
            for proxy in proxies:
                proxy.heal()
            if not server.running:
                await asyncio.to_thread(server.start)

        async def leaks() -> list[str]:
            return await redis_leftovers(server.url, prefix, within=REDIS_LEASE + 5)

        report, pool, injector = await run_chaos(spec, faults, leaks, heal, tmp_path)
    _check(report, pool, injector.events)


@pytest.mark.redis
@pytest.mark.asyncio
async def test_redis_sentinel_failover_under_faults(tmp_path: Path) -> None:
    """Sentinel failovers (master SIGKILLed, replica promoted) and loop blocks."""
    prefix = f"chaos-{uuid.uuid4().hex[:8]}:"
    sentinels = RedisSentinelSet()
    try:
        await asyncio.to_thread(sentinels.start)
    except Exception as exc:  # pragma: no cover - depends on the machine
        sentinels.close()
        pytest.skip(f"cannot start a Redis Sentinel set here: {exc}")
    try:
        url = f"{sentinels.url}?key_prefix={prefix}&lease_time={REDIS_LEASE}&connect_timeout=8"
        spec = RunSpec(
            label="redis-sentinel",
            urls=[url] * WORKERS,
            duration=_seconds(16),
            grace=REDIS_LEASE * 3 + 4,
            block=REDIS_LEASE * 1.5,
            gap=(1.0, 2.5),
        )

        async def failover(rng: random.Random) -> str:
            new_master = await asyncio.to_thread(sentinels.kill_master)
            # The old master comes back as a replica of the new one.
            await asyncio.to_thread(sentinels.replica.start)
            return f"failed over to {new_master.port}"

        def faults(pool: WorkerPool) -> dict[str, Fault]:
            return {"failover": failover, "block": block_fault(pool)}

        async def heal() -> None:
            if not sentinels.replica.running:
                await asyncio.to_thread(sentinels.replica.start)

        async def leaks() -> list[str]:
            return await redis_leftovers(sentinels.master.url, prefix, within=REDIS_LEASE + 5)

        report, pool, injector = await run_chaos(spec, faults, leaks, heal, tmp_path)
    finally:
        await asyncio.to_thread(sentinels.close)
    _check(report, pool, injector.events)


# -- ZooKeeper ----------------------------------------------------------------------------


@pytest.mark.zookeeper
@pytest.mark.asyncio
async def test_zookeeper_single_server_under_faults(
    zookeeper_restartable: ZooKeeperServer, tmp_path: Path
) -> None:
    """Cut, stall, delay, kill/restart, session expiry and loop blocks against one ZooKeeper."""
    server = zookeeper_restartable
    chroot = f"/chaos-{uuid.uuid4().hex[:8]}"
    async with worker_proxies(server.host, server.port) as proxies:
        urls = [
            f"zk://{proxy.netloc}{chroot}?session_timeout={ZK_SESSION}&connect_timeout=8"
            for proxy in proxies
        ]
        spec = RunSpec(
            label="zookeeper",
            urls=urls,
            duration=_seconds(16),
            grace=ZK_SESSION * 3 + 6,
            block=ZK_SESSION * 1.5,
        )

        def faults(pool: WorkerPool) -> dict[str, Fault]:
            return {
                **proxy_faults(proxies, max_stall=ZK_SESSION * 2),
                "restart": restart_fault(server.kill, server.start, "ZooKeeper", 1.0),
                "expire": zk_expire_fault(pool, server.host, server.port),
                "block": block_fault(pool),
            }

        async def heal() -> None:
            for proxy in proxies:
                proxy.heal()
            if not server.running:
                await asyncio.to_thread(server.start)

        async def leaks() -> list[str]:
            return await zk_leftovers(server.hosts, chroot, within=ZK_SESSION + 5)

        report, pool, injector = await run_chaos(spec, faults, leaks, heal, tmp_path)
    _check(report, pool, injector.events)


@pytest.mark.zookeeper
@pytest.mark.asyncio
async def test_zookeeper_ensemble_leader_kill(
    zookeeper_ensemble: ZooKeeperEnsemble, tmp_path: Path
) -> None:
    """Ensemble leader SIGKILLed and restarted, session expiry and loop blocks."""
    if not zookeeper_ensemble.managed:
        pytest.skip("the ensemble is external (AIOLOCKS_ZK_ENSEMBLE_HOSTS); cannot kill members")
    ensemble = zookeeper_ensemble
    chroot = f"/chaos-{uuid.uuid4().hex[:8]}"
    url = f"zk://{ensemble.hosts}{chroot}?session_timeout={ZK_SESSION}&connect_timeout=8"
    spec = RunSpec(
        label="zookeeper-ensemble",
        urls=[url] * WORKERS,
        duration=_seconds(16),
        grace=ZK_SESSION * 3 + 6,
        block=ZK_SESSION * 1.5,
        gap=(1.0, 2.5),
    )

    async def leader_kill(rng: random.Random) -> str:
        try:
            leader = await asyncio.to_thread(ensemble.wait_for_leader, 60.0)
        except TimeoutError:
            return "no stable leader to kill (the ensemble is still electing)"
        await asyncio.to_thread(leader.kill)
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        await asyncio.to_thread(leader.start)
        return f"killed leader {leader.port}, restarted"

    def faults(pool: WorkerPool) -> dict[str, Fault]:
        member = ensemble.members[0]
        expire = zk_expire_fault(pool, member.host, member.port)

        async def expire_any(rng: random.Random) -> str:
            try:
                return await expire(rng)
            except (OSError, asyncio.IncompleteReadError) as exc:
                return f"expiry attempt failed ({exc!r}); member down"

        return {"leader_kill": leader_kill, "expire": expire_any, "block": block_fault(pool)}

    async def heal() -> None:
        for member in ensemble.members:
            if not member.running:
                await asyncio.to_thread(member.start)
        await asyncio.to_thread(ensemble.wait_for_leader, 90.0)

    async def leaks() -> list[str]:
        return await zk_leftovers(ensemble.hosts, chroot, within=ZK_SESSION + 5)

    report, pool, injector = await run_chaos(spec, faults, leaks, heal, tmp_path)
    _check(report, pool, injector.events)
