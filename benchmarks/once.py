"""``backend.once()`` against ShedLock-style ``SET NX PX``: ``python -m benchmarks.once``
(also ``python -m benchmarks once``).

``--replicas`` replicas, each a backend of its own (as a process would
have), fire the same job every period. A *period* here is one firing of
every replica at once: each tries to take the job, one runs it (an empty
body), the others skip; the period ends when every replica is done
(including the winner's exit write). Periods are back to back, each with a
job name of its own (``bench/once/<round>.<period>``), as if ``at_least_for``
had passed between them: the figure is the cost of a period, not idle time.

Per period, on one Redis server (``--firings`` periods per round,
``--rounds`` interleaved rounds whose order flips every round):

``once``
    ``backend.once(name, at_most_for=30, at_least_for=10)``: the create, the
    renewal task started and stopped, the exit rewrite to the rest of
    ``at_least_for``.
``setnx``
    ShedLock's Redis provider with redis-py directly: ``SET key token NX PX
    at_most_for``; the winner's exit rewrites the key to expire the rest of
    ``at_least_for`` after the start if it is still its token (one Lua
    call). Two round trips for the winner, one per loser.

It prints one JSON line for Redis with each side's median µs per period and
the median, min and max of the per-round ratios once/setnx (ratios: both
sides of a round see the same load on a busy machine), then one line per
other backend (ZooKeeper, etcd, PostgreSQL) with ``once`` alone (absolute
µs per period). Every period is checked to have had exactly one run. A
backend whose server is not installed gets a line with ``skipped``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import redis.asyncio as redis_asyncio

import aiolocks
from aiolocks.testing import EtcdServer, PostgresServer
from aiolocks.testing.servers import RedisServer, ServerNotInstalledError, ZooKeeperServer

__all__ = ["BACKENDS", "compare", "main", "once_only"]

BACKENDS = ("redis", "zookeeper", "etcd", "postgres")

AT_MOST_FOR = 30.0
AT_LEAST_FOR = 10.0

#: the winner's exit: keep the key the rest of at_least_for if it is still ours
_KEEP_IF_OURS = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    if tonumber(ARGV[2]) > 0 then
        return redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
    end
    return redis.call('del', KEYS[1])
end
return 0
"""

#: one replica's attempt at a period's job: True when it ran it
Attempt = Callable[[str], Awaitable[bool]]


class DoubleRun(AssertionError):
    """A period ran its job more than once, or never (a broken benchmark)."""


def _check_sizes(replicas: int, rounds: int, firings: int) -> None:
    if replicas < 1 or rounds < 1 or firings < 1:
        raise ValueError(
            f"replicas, rounds and firings must be >= 1, not {replicas}, {rounds}, {firings}"
        )


def _once_attempt(backend: aiolocks.Backend) -> Attempt:
    async def attempt(name: str) -> bool:
        async with backend.once(name, at_most_for=AT_MOST_FOR, at_least_for=AT_LEAST_FOR) as ran:
            return ran

    return attempt


def _setnx_attempt(client: redis_asyncio.Redis) -> Attempt:
    keep = client.register_script(_KEEP_IF_OURS)

    async def attempt(name: str) -> bool:
        token = uuid.uuid4().hex
        started = time.monotonic()
        if not await client.set(name, token, nx=True, px=int(AT_MOST_FOR * 1000)):
            return False
        rest_ms = int((AT_LEAST_FOR - (time.monotonic() - started)) * 1000)
        await keep(keys=[name], args=[token, max(rest_ms, 0)])
        return True

    return attempt


async def _periods(attempts: list[Attempt], prefix: str, firings: int) -> float:
    """µs per period: every replica fires at once, one runs."""
    started = time.perf_counter()
    for period in range(firings):
        name = f"{prefix}.{period}"
        ran = await asyncio.gather(*(attempt(name) for attempt in attempts))
        if sum(ran) != 1:
            raise DoubleRun(f"period {name} ran {sum(ran)} times")
    return (time.perf_counter() - started) / firings * 1e6


@contextlib.asynccontextmanager
async def _once_replicas(url: str, replicas: int) -> AsyncIterator[list[Attempt]]:
    async with contextlib.AsyncExitStack() as stack:
        backends = [await stack.enter_async_context(aiolocks.connect(url)) for _ in range(replicas)]
        yield [_once_attempt(backend) for backend in backends]


@contextlib.asynccontextmanager
async def _setnx_replicas(url: str, replicas: int) -> AsyncIterator[list[Attempt]]:
    clients = [redis_asyncio.Redis.from_url(url) for _ in range(replicas)]
    try:
        yield [_setnx_attempt(client) for client in clients]
    finally:
        for client in clients:
            await client.aclose()


async def compare(url: str, replicas: int, rounds: int, firings: int) -> dict[str, Any]:
    """Interleaved rounds on one Redis: per-side medians and once/setnx ratios."""
    _check_sizes(replicas, rounds, firings)
    run = uuid.uuid4().hex[:8]
    times: dict[str, list[float]] = {"once": [], "setnx": []}
    async with _once_replicas(url, replicas) as once, _setnx_replicas(url, replicas) as setnx:
        sides = [("once", once), ("setnx", setnx)]
        for side, attempts in sides:  # warm-up, not measured
            await _periods(attempts, f"bench/once/{run}/warm-{side}", max(1, firings // 4))
        for r in range(rounds):
            for side, attempts in sides if r % 2 == 0 else sides[::-1]:
                times[side].append(await _periods(attempts, f"bench/once/{run}/{side}{r}", firings))
    ratios = [o / s for o, s in zip(times["once"], times["setnx"], strict=True) if s]
    return {
        "once_us": round(statistics.median(times["once"]), 1),
        "setnx_us": round(statistics.median(times["setnx"]), 1),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


async def once_only(url: str, replicas: int, rounds: int, firings: int) -> dict[str, Any]:
    """``once`` alone on one backend: the median µs per period over ``rounds``."""
    _check_sizes(replicas, rounds, firings)
    run = uuid.uuid4().hex[:8]
    times: list[float] = []
    async with _once_replicas(url, replicas) as once:
        await _periods(once, f"bench/once/{run}/warm", max(1, firings // 4))
        for r in range(rounds):
            times.append(await _periods(once, f"bench/once/{run}/once{r}", firings))
    return {
        "once_us": round(statistics.median(times), 1),
        "once_us_range": [round(min(times), 1), round(max(times), 1)],
    }


@contextlib.contextmanager
def _serve(backend: str) -> Iterator[str]:
    """Start ``backend``'s test server; its URL."""
    server_class: type[RedisServer | ZooKeeperServer | EtcdServer | PostgresServer] = {
        "redis": RedisServer,
        "zookeeper": ZooKeeperServer,
        "etcd": EtcdServer,
        "postgres": PostgresServer,
    }[backend]
    with server_class() as server:
        yield server.url


def main(argv: list[str] | None = None) -> int:
    """Start each backend's server, measure, print one JSON line per backend."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.once")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--firings", type=int, default=100)
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    sizes = (args.replicas, args.rounds, args.firings)
    for name in backends:
        row: dict[str, object] = {
            "backend": name,
            "replicas": args.replicas,
            "rounds": args.rounds,
            "firings": args.firings,
        }
        try:
            with _serve(name) as url:
                measure = compare if name == "redis" else once_only
                row.update(asyncio.run(measure(url, *sizes)))
        except ServerNotInstalledError as exc:
            row["skipped"] = str(exc)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
