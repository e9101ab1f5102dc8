"""Cancellation fuzzing: random cancellations of acquire, body and release, with leak checks.

Thousands of short lock cycles run concurrently on two backends of one
service (two "processes"), one of them through a :class:`TcpProxy` that adds
a little latency; each cycle is cancelled after a random number of event-loop
steps or a random delay (seeded by ``AIOLOCKS_CHAOS_SEED``), so cancellations
land in ``acquire`` (waiting or mid-request), in the body, and in ``release``.

Checked throughout: exclusive locks never have two holders at once (across
both backends), semaphores never more than ``max_leases``, a cancelled
cycle always ends with ``CancelledError`` (never swallowed). Checked at the
end: no hold in ``backend._holds``, empty reentrancy ledgers, no background
task left, no participant on any lock, and no key or znode on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import pytest

import aiolocks
from aiolocks.redis._driver import TOMBSTONE_MS
from aiolocks.testing import EtcdServer, RedisServer, TcpProxy, ZooKeeperServer

from ..polling import settle
from .checker import chaos_scale, chaos_seed, redis_leftovers, rng_for, zk_leftovers
from .conftest import record_summary

KINDS = ("mutex", "semaphore_mutex", "semaphore", "read", "write", "multilock")
PHASES = ("before", "acquire", "body", "release", "done")
MAX_LEASES = 2


@dataclass
class FuzzStats:
    """What one fuzz run did and saw."""

    iterations: int = 0
    cancelled_in: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    not_cancelled: int = 0
    timeouts: int = 0
    exclusion_violations: list[str] = field(default_factory=list)
    swallowed: int = 0
    swallowed_in: list[str] = field(default_factory=list)


class Occupancy:
    """Who is inside a body right now, per (kind, name), across both backends."""

    def __init__(self, stats: FuzzStats) -> None:
        self.stats = stats
        self.readers: Counter[str] = Counter()
        self.writers: Counter[str] = Counter()
        self.exclusive: Counter[tuple[str, str]] = Counter()

    @contextlib.contextmanager
    def inside(self, kind: str, name: str) -> Iterator[None]:
        key = (kind, name)
        if kind == "read":
            self.readers[name] += 1
            bad = self.writers[name] > 0
        elif kind == "write":
            self.writers[name] += 1
            bad = self.writers[name] > 1 or self.readers[name] > 0
        else:
            self.exclusive[key] += 1
            limit = MAX_LEASES if kind == "semaphore" else 1
            bad = self.exclusive[key] > limit
        if bad:
            self.stats.exclusion_violations.append(f"{kind} {name}: too many holders")
        try:
            yield
        finally:
            if kind == "read":
                self.readers[name] -= 1
            elif kind == "write":
                self.writers[name] -= 1
            else:
                self.exclusive[key] -= 1


async def _cycle(
    backend: aiolocks.Backend,
    kind: str,
    name: str,
    explicit: bool,
    timeout: float | None,
    body: float,
    occupancy: Occupancy,
    phase: list[str],
    other: aiolocks.Backend,
) -> None:
    """One lock cycle; ``phase[0]`` says where it is, for the statistics."""
    phase[0] = "acquire"
    if kind == "semaphore":
        sem = backend.semaphore(name, MAX_LEASES)
        lease = await sem.acquire(timeout=timeout)
        if lease is None:
            phase[0] = "done"
            return
        try:
            phase[0] = "body"
            with occupancy.inside(kind, name):
                await asyncio.sleep(body)
            phase[0] = "release"
        finally:
            await lease.release()
        phase[0] = "done"
        return
    lock: aiolocks.Lock | aiolocks.MultiLock
    if kind == "mutex":
        lock = backend.mutex(name)
    elif kind == "semaphore_mutex":
        lock = backend.semaphore_mutex(name)
    elif kind == "read":
        lock = backend.read_write_lock(name).read
    elif kind == "write":
        lock = backend.read_write_lock(name).write
    else:
        # Two mutexes on two backends, given in a random order.
        lock = aiolocks.MultiLock([backend.mutex(name), other.mutex(name + "-b")])
    inside_kind = "mutex" if kind == "multilock" else kind
    if explicit:
        if not await lock.acquire(timeout=timeout):
            phase[0] = "done"
            return
        try:
            phase[0] = "body"
            with occupancy.inside(inside_kind, name):
                await asyncio.sleep(body)
            phase[0] = "release"
        finally:
            await lock.release()
    else:
        async with lock.hold(timeout=timeout) if timeout is not None else lock:
            phase[0] = "body"
            with occupancy.inside(inside_kind, name):
                await asyncio.sleep(body)
            phase[0] = "release"
    phase[0] = "done"


async def fuzz(
    backends: tuple[aiolocks.Backend, aiolocks.Backend],
    rng: random.Random,
    iterations: int,
    max_delay: float,
    concurrency: int = 8,
) -> tuple[FuzzStats, list[str]]:
    """Run ``iterations`` cancelled cycles, ``concurrency`` at a time; return stats and names."""
    stats = FuzzStats()
    occupancy = Occupancy(stats)
    names = [f"fuzz/{uuid.uuid4().hex[:8]}/{i}" for i in range(3)]
    remaining = iterations

    async def fuzzer(seed: int) -> None:
        nonlocal remaining
        local = random.Random(seed)
        while remaining > 0:
            remaining -= 1
            stats.iterations += 1
            index = local.randrange(2)
            backend, other = backends[index], backends[1 - index]
            kind = local.choice(KINDS)
            name = local.choice(names)
            # Read and write halves must contend on the same names; MultiLock
            # uses names of its own so its mutex order stays canonical.
            if kind == "multilock":
                name = names[0] + "-multi"
            stats.kinds[kind] += 1
            timeout = local.choice([None, None, 0, 0.05, 1.0])
            body = local.choice([0, 0, 0.001, 0.01])
            phase = ["before"]
            task = asyncio.create_task(
                _cycle(
                    backend,
                    kind,
                    name,
                    local.random() < 0.5,
                    timeout,
                    body,
                    occupancy,
                    phase,
                    other,
                )
            )
            how = local.random()
            if how < 0.35:
                # after a number of event-loop steps
                for _ in range(local.randrange(60)):
                    await asyncio.sleep(0)
            elif how < 0.7:
                # after a random delay
                await asyncio.sleep(local.uniform(0, max_delay))
            else:
                # a few steps into a chosen phase (reaches body and release too)
                target = local.choice(("body", "release"))
                deadline = time.monotonic() + max_delay * 5
                while phase[0] not in (target, "done") and time.monotonic() < deadline:
                    await asyncio.sleep(0)
                for _ in range(local.randrange(4)):
                    await asyncio.sleep(0)
            where = phase[0]
            cancelled_now = not task.done()
            if cancelled_now:
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not cancelled_now:
                    raise
                stats.cancelled_in[where] += 1
                continue
            except aiolocks.LockTimeoutError:
                if cancelled_now:
                    stats.swallowed += 1  # a cancelled acquire must raise CancelledError
                stats.timeouts += 1
                continue
            if cancelled_now:
                # The task was cancelled while running and still returned normally.
                stats.swallowed += 1
                stats.swallowed_in.append(where)
            stats.not_cancelled += 1

    await asyncio.gather(*(fuzzer(rng.randrange(2**32)) for _ in range(concurrency)))
    return stats, names


async def local_leaks(backends: tuple[aiolocks.Backend, ...], names: list[str]) -> list[str]:
    """Holds, ledgers, background tasks and participants still present."""
    found: list[str] = []
    for number, backend in enumerate(backends):
        with contextlib.suppress(AssertionError):  # what is left is listed below
            await settle(backend, timeout=20)
        found += [f"backend {number}: hold {h.kind} {h.name!r}" for h in backend._holds]
        found += [f"backend {number}: ledger {k}" for k, v in backend._ledgers.items() if v]
        if len(backend._tasks):
            found.append(f"backend {number}: {len(backend._tasks)} background tasks left")
        for name in [*names, names[0] + "-multi", names[0] + "-multi-b"]:
            lists = [
                await backend.mutex(name).participants(),
                await backend.semaphore_mutex(name).participants(),
                await backend.semaphore(name, MAX_LEASES).participants(),
                await backend.read_write_lock(name).read.participants(),
            ]
            found += [f"backend {number}: participant {p} of {name!r}" for ps in lists for p in ps]
    return found


async def run_fuzz(
    label: str,
    open_backends: Callable[
        [], contextlib.AbstractAsyncContextManager[tuple[aiolocks.Backend, aiolocks.Backend]]
    ],
    iterations: int,
    server_leaks: Callable[[], Awaitable[list[str]]] | None,
    max_delay: float,
) -> None:
    """Fuzz, then check every leak; print a summary line."""
    rng, seed = rng_for(f"cancel-fuzz-{label}")
    started = time.monotonic()
    async with open_backends() as backends:
        stats, names = await fuzz(backends, rng, iterations, max_delay)
        leaks = await local_leaks(backends, names)
        # On the server while the backends are still open: closing would
        # release (and so hide) whatever a cancellation left behind.
        server = await server_leaks() if server_leaks is not None else []
    cancelled = sum(stats.cancelled_in.values())
    where = ", ".join(f"{k} {stats.cancelled_in[k]}" for k in PHASES if stats.cancelled_in[k])
    record_summary(
        f"cancel-fuzz[{label}] AIOLOCKS_CHAOS_SEED={chaos_seed()} (run seed {seed}) "
        f"{time.monotonic() - started:.0f}s: "
        f"{stats.iterations} cycles, {cancelled} cancelled ({where}), "
        f"{stats.not_cancelled} finished first, {stats.timeouts} timed out; "
        f"VIOLATIONS exclusion={len(stats.exclusion_violations)} swallowed={stats.swallowed}; "
        f"LEAKS local={len(leaks)} server={len(server)}",
        {
            "label": f"cancel-fuzz-{label}",
            "seed": seed,
            "cycles": stats.iterations,
            "cancelled": dict(stats.cancelled_in),
            "leaks": leaks + server,
            "exclusion_violations": stats.exclusion_violations,
        },
    )
    assert not stats.exclusion_violations, stats.exclusion_violations[:10]
    assert stats.swallowed == 0, f"cancellation swallowed in phases {stats.swallowed_in}"
    assert not leaks, leaks[:20]
    assert not server, server[:20]
    # The fuzz really hit every phase.
    for phase in ("acquire", "body", "release"):
        assert stats.cancelled_in[phase] > 0, f"no cancellation landed in {phase}: {stats}"


def _iterations(base: int) -> int:
    return max(50, int(base * chaos_scale()))


@pytest.mark.asyncio
async def test_cancel_fuzz_memory() -> None:
    """Random cancellations over memory://."""

    @contextlib.asynccontextmanager
    async def open_backends() -> AsyncIterator[tuple[aiolocks.Backend, aiolocks.Backend]]:
        url = f"memory://fuzz-{uuid.uuid4().hex[:8]}"
        async with aiolocks.connect(url) as a, aiolocks.connect(url) as b:
            yield a, b

    await run_fuzz("memory", open_backends, _iterations(6000), None, 0.01)


@pytest.mark.redis
@pytest.mark.asyncio
async def test_cancel_fuzz_redis(redis_server: RedisServer) -> None:
    """Random cancellations over redis://, one backend through a 2 ms proxy."""
    prefix = f"chaos-fuzz-{uuid.uuid4().hex[:8]}:"

    @contextlib.asynccontextmanager
    async def open_backends() -> AsyncIterator[tuple[aiolocks.Backend, aiolocks.Backend]]:
        async with TcpProxy(redis_server.host, redis_server.port) as proxy:
            proxy.delay(0.002)
            direct = f"{redis_server.url}?key_prefix={prefix}&lease_time=5"
            slow = f"redis://{proxy.netloc}?key_prefix={prefix}&lease_time=5"
            async with aiolocks.connect(direct) as a, aiolocks.connect(slow) as b:
                yield a, b

    async def server_leaks() -> list[str]:
        # An attempt cancelled while its script was on the wire leaves a
        # tombstone key that lapses within TOMBSTONE_MS: wait that long.
        return await redis_leftovers(redis_server.url, prefix, within=TOMBSTONE_MS / 1000 + 1.0)

    await run_fuzz("redis", open_backends, _iterations(3000), server_leaks, 0.02)


@pytest.mark.zookeeper
@pytest.mark.asyncio
async def test_cancel_fuzz_zookeeper(zookeeper_server: ZooKeeperServer) -> None:
    """Random cancellations over zk://, one backend through a 2 ms proxy."""
    chroot = f"/chaos-fuzz-{uuid.uuid4().hex[:8]}"

    @contextlib.asynccontextmanager
    async def open_backends() -> AsyncIterator[tuple[aiolocks.Backend, aiolocks.Backend]]:
        async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
            proxy.delay(0.002)
            direct = f"zk://{zookeeper_server.hosts}{chroot}?session_timeout=10"
            slow = f"zk://{proxy.netloc}{chroot}?session_timeout=10"
            async with aiolocks.connect(direct) as a, aiolocks.connect(slow) as b:
                yield a, b

    async def server_leaks() -> list[str]:
        return await zk_leftovers(zookeeper_server.hosts, chroot, within=1.0)

    await run_fuzz("zookeeper", open_backends, _iterations(1500), server_leaks, 0.1)


@pytest.mark.etcd
@pytest.mark.asyncio
async def test_cancel_fuzz_etcd(etcd_server: EtcdServer) -> None:
    """Random cancellations over etcd://, one backend through a 2 ms proxy (a short run)."""
    from aiolocks.etcd import EtcdClient

    prefix = f"chaos-fuzz-{uuid.uuid4().hex[:8]}"
    host, _, port = etcd_server.endpoints[0].rpartition(":")

    @contextlib.asynccontextmanager
    async def open_backends() -> AsyncIterator[tuple[aiolocks.Backend, aiolocks.Backend]]:
        async with TcpProxy(host, int(port)) as proxy:
            proxy.delay(0.002)
            direct = f"{etcd_server.url}/{prefix}?lease_ttl=10"
            slow = f"etcd://{proxy.netloc}/{prefix}?lease_ttl=10"
            async with aiolocks.connect(direct) as a, aiolocks.connect(slow) as b:
                yield a, b

    async def server_leaks() -> list[str]:
        # Tombstones (keys outside every queue, on short leases of their own)
        # are expected; any queue key left behind is a leak.
        async with EtcdClient(list(etcd_server.endpoints)) as client:
            found = await client.range(f"{prefix}/".encode(), prefix=True)
        tombstones = f"{prefix}/\x00".encode()
        return [repr(kv.key) for kv in found.kvs if not kv.key.startswith(tombstones)]

    await run_fuzz("etcd", open_backends, _iterations(400), server_leaks, 0.05)
