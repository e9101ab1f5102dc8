"""The Jepsen-style checker against a real 3-member etcd cluster, with faults injected.

Same harness as ``test_checker.py``. Each worker reaches every member through
proxies of its own (one :class:`~aiolocks.testing.TcpProxy` per member), so a
worker can be cut off or partitioned alone. Faults: the leader SIGKILLed and
restarted (a new election), a follower restarted, the session lease of a
random holder or waiter revoked behind its back, a random lock key deleted
behind its back, connections cut, stalled and slowed, and event-loop blocks
past the lease. Every count that must be 0 is 0, and after the run nothing
is left on the cluster: no key under the run's prefix, no lease that the run
created. See ``docs/chaos.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aiolocks.etcd._client import EtcdClient, LeaseNotFoundError, RangeOp
from aiolocks.testing import EtcdCluster, TcpProxy

from .checker import Fault, RunSpec, WorkerPool, run_chaos
from .test_checker import WORKERS, _check, _seconds, block_fault

pytestmark = [pytest.mark.slow, pytest.mark.etcd]

#: the session lease's TTL (s): holds are declared lost by then at the latest
LEASE_TTL = 2


@contextlib.asynccontextmanager
async def member_proxies(
    cluster: EtcdCluster, count: int = WORKERS
) -> AsyncIterator[list[list[TcpProxy]]]:
    """For each worker, one proxy per member (a worker's URL lists its own proxies)."""
    async with contextlib.AsyncExitStack() as stack:
        groups: list[list[TcpProxy]] = []
        for _ in range(count):
            group = []
            for member in cluster.members:
                host, _, port = member.endpoint.rpartition(":")
                group.append(await stack.enter_async_context(TcpProxy(host, int(port))))
            groups.append(group)
        yield groups


def group_faults(groups: list[list[TcpProxy]], max_stall: float) -> dict[str, Fault]:
    """cut / stall / delay every connection of one worker (to all members), sometimes of all."""

    def pick(rng: random.Random) -> tuple[list[TcpProxy], str]:
        if rng.random() < 0.2:
            return [proxy for group in groups for proxy in group], "every worker"
        index = rng.randrange(len(groups))
        return groups[index], f"worker {index}"

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
        latency, seconds = rng.uniform(0.01, 0.2), rng.uniform(0.5, 1.5)
        for proxy in chosen:
            proxy.delay(latency)
        try:
            await asyncio.sleep(seconds)
        finally:
            for proxy in chosen:
                proxy.delay(0)
        return f"{latency * 1000:.0f} ms latency for {who}, {seconds:.2f}s"

    return {"cut": cut, "stall": stall, "delay": delay}


def member_faults(cluster: EtcdCluster) -> dict[str, Fault]:
    """The leader SIGKILLed (an election follows) and a follower restarted, each brought back."""

    async def leader_kill(rng: random.Random) -> str:
        try:
            leader = await asyncio.to_thread(cluster.wait_for_leader, 30.0)
        except TimeoutError:
            return "no stable leader to kill (the cluster is still electing)"
        await asyncio.to_thread(leader.kill)
        await asyncio.sleep(rng.uniform(0.2, 1.5))
        await asyncio.to_thread(leader.start)
        return f"killed leader {leader.name}, restarted"

    async def member_restart(rng: random.Random) -> str:
        followers = await asyncio.to_thread(cluster.followers)
        if not followers:
            return "no follower to restart"
        member = rng.choice(followers)
        await asyncio.to_thread(member.kill)
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        await asyncio.to_thread(member.start)
        return f"restarted follower {member.name}"

    return {"leader_kill": leader_kill, "member_restart": member_restart}


def behind_our_back_faults(client: EtcdClient, root: str) -> dict[str, Fault]:
    """An operator at work: a random lock key deleted, a random key's session lease revoked."""

    async def keys() -> list[tuple[bytes, int]]:
        found = await client.range(RangeOp.of(root, prefix=True, keys_only=True))
        return [(kv.key, kv.lease) for kv in found.kvs]

    async def delete_key(rng: random.Random) -> str:
        try:
            present = await keys()
            if not present:
                return "no lock key to delete"
            key, _ = rng.choice(present)
            await client.delete(key)
        except Exception as exc:  # the cluster may be electing: the fault just did not happen
            return f"delete failed ({type(exc).__name__}: {exc})"
        return f"deleted {key!r}"

    async def revoke_lease(rng: random.Random) -> str:
        try:
            leases = sorted({lease for _, lease in await keys() if lease})
            if not leases:
                return "no session lease to revoke"
            lease = rng.choice(leases)
            with contextlib.suppress(LeaseNotFoundError):
                await client.lease_revoke(lease)
        except Exception as exc:
            return f"revoke failed ({type(exc).__name__}: {exc})"
        return f"revoked lease {lease:x}"

    return {"delete_key": delete_key, "revoke_lease": revoke_lease}


def lease_ids(cluster: EtcdCluster) -> set[int]:
    """Every lease the cluster knows (``etcdctl lease list``)."""
    out = cluster.etcdctl("lease", "list")
    return {int(word, 16) for word in re.findall(r"^([0-9a-f]+)$", out, re.MULTILINE)}


async def etcd_leftovers(
    cluster: EtcdCluster, client: EtcdClient, root: str, before: set[int], within: float
) -> list[str]:
    """Keys under ``root`` and leases made by the run, still there after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        found = await client.range(RangeOp.of(root, prefix=True, keys_only=True))
        left = [f"key {kv.key!r} (lease {kv.lease:x})" for kv in found.kvs]
        leases = await asyncio.to_thread(lease_ids, cluster)
        left += [f"lease {lease:x}" for lease in sorted(leases - before)]
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.3)


@pytest.mark.asyncio
async def test_etcd_cluster_under_faults(etcd_cluster: EtcdCluster, tmp_path: Path) -> None:
    """Leader kill, member restart, lease revoke, key delete, cut/stall/delay and loop blocks."""
    if not etcd_cluster.managed:
        pytest.skip("external cluster (AIOLOCKS_ETCD_CLUSTER_ENDPOINTS): no member to kill")
    cluster = etcd_cluster
    await asyncio.to_thread(cluster.wait_for_leader, 30.0)
    prefix = f"chaos-{uuid.uuid4().hex[:8]}"
    root = prefix + "/"
    before = await asyncio.to_thread(lease_ids, cluster)
    async with (
        EtcdClient(list(cluster.endpoints), request_timeout=3.0) as admin,
        member_proxies(cluster) as groups,
    ):
        urls = [
            f"etcd://{','.join(proxy.netloc for proxy in group)}/{prefix}"
            f"?lease_ttl={LEASE_TTL}&connect_timeout=5&request_timeout=2"
            for group in groups
        ]
        spec = RunSpec(
            label="etcd-cluster",
            urls=urls,
            duration=_seconds(12),
            grace=LEASE_TTL * 3 + 4,
            block=LEASE_TTL * 1.5,
            gap=(0.3, 1.0),
        )

        def faults(pool: WorkerPool) -> dict[str, Fault]:
            return {
                **group_faults(groups, max_stall=LEASE_TTL * 2),
                **member_faults(cluster),
                **behind_our_back_faults(admin, root),
                "block": block_fault(pool),
            }

        async def heal() -> None:
            for group in groups:
                for proxy in group:
                    proxy.heal()
            for member in cluster.members:
                if not member.running:
                    await asyncio.to_thread(member.start)
            await asyncio.to_thread(cluster.wait_for_leader, 60.0)

        async def leaks() -> list[str]:
            # tombstones of abandoned tries live on leases of 2 x request_timeout
            return await etcd_leftovers(cluster, admin, root, before, within=LEASE_TTL + 8)

        report, pool, injector = await run_chaos(spec, faults, leaks, heal, tmp_path)
    _check(report, pool, injector.events)
