"""etcd locks side by side: ``python -m benchmarks etcd [--quick|--smoke] [--endpoint host:port]``
(also ``python -m benchmarks.etcd``).

Contenders:

``floor``
    the bare transaction (create the key on the session lease, read the head
    of the queue) and the compare-and-delete, through aiolocks's own client:
    two round trips, the fewest a fair, lease-bound etcd lock can make.
``aiolocks``
    ``backend.mutex(name)`` (the floor, plus the engine's bookkeeping and each
    hold's loss watch, created and cancelled on the backend's one watch stream).
``aetcd``
    aetcd's ``client.lock(name, ttl=30)``: a lease grant per try, one key per
    lock name, every waiter watching that key (a herd), no loss notification.
``python-etcd3``
    python-etcd3's ``Lock`` (PyPI ``etcd3``, synchronous), run in a process of
    its own (see :mod:`benchmarks.etcd_py3`); skipped when not installed.

Figures: uncontended cycle (median of per-round medians; rounds interleaved,
A B C … then … C B A), requests per cycle counted on the server (gRPC
messages received, ``/metrics``, in a pass that is not timed), contended
holds per second (tasks on two clients hammering one name, 1 ms inside, a
shared counter checking that no two holders overlap; aiolocks's tasks
alternate between two backends of the process, so each hand-off goes to a
waiter of the other backend), and the drain of W
waiters queued on one lock (time from the release until every waiter has
held it, and the watchers and watch streams the server has while they wait).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._stats import median

__all__ = ["PLANS", "Plan", "main", "run"]

RESULTS = Path(__file__).resolve().parent / "results"

Cycle = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Plan:
    """Sizes of one run."""

    rounds: int
    cycles: int
    cost_cycles: int
    contended_s: float
    tasks: int
    waiters: int


PLANS: dict[str, Plan] = {
    "smoke": Plan(rounds=1, cycles=10, cost_cycles=10, contended_s=0.5, tasks=4, waiters=20),
    "quick": Plan(rounds=3, cycles=200, cost_cycles=100, contended_s=2.0, tasks=8, waiters=200),
    "full": Plan(rounds=7, cycles=500, cost_cycles=200, contended_s=4.0, tasks=8, waiters=200),
}


class Overlap(AssertionError):
    """Two holders were inside the critical section at once (a broken lock)."""


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- server-side counters


def server_metrics(endpoint: str) -> dict[str, float]:
    """gRPC messages received, watchers and watch streams, from etcd's ``/metrics``."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = {"messages": 0.0, "watchers": 0.0, "watch_streams": 0.0}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if match is None:
            continue
        name, value = match.group(1), float(match.group(3))
        if name == "grpc_server_msg_received_total":
            found["messages"] += value
        elif name == "etcd_debugging_mvcc_watcher_total":
            found["watchers"] = value
        elif name == "etcd_debugging_mvcc_watch_stream_total":
            found["watch_streams"] = value
    return found


# -- contenders: each is an async context manager yielding (acquire, release) makers


@contextlib.asynccontextmanager
async def _floor(endpoint: str, name: str) -> Any:
    from aiolocks.etcd._client import (
        Compare,
        DeleteOp,
        EtcdClient,
        PutOp,
        RangeOp,
        SortOrder,
        SortTarget,
    )

    async with EtcdClient([endpoint]) as client:
        lease = await client.lease_grant(30)
        queue = f"bench-floor-{name}\x00".encode()
        key = queue + f"{lease.id:016x}/k".encode()
        head = RangeOp.of(
            queue,
            prefix=True,
            limit=1,
            keys_only=True,
            sort_target=SortTarget.CREATE,
            sort_order=SortOrder.ASCEND,
        )

        async def cycle() -> None:
            won = await client.txn(
                [Compare.create_revision(key, "==", 0)],
                [PutOp.of(key, b"me", lease=lease.id), head],
                [RangeOp.of(key), head],
            )
            await client.txn(
                [Compare.create_revision(key, "==", won.revision)], [DeleteOp.of(key)], []
            )

        try:
            yield cycle
        finally:
            await client.lease_revoke(lease.id)


@contextlib.asynccontextmanager
async def _aiolocks(endpoint: str, name: str) -> Any:
    import aiolocks

    async with aiolocks.connect(f"etcd://{endpoint}/bench-aiolocks") as backend:
        lock = backend.mutex(name)

        async def cycle() -> None:
            await lock.acquire()
            await lock.release()

        yield cycle


@contextlib.asynccontextmanager
async def _aetcd(endpoint: str, name: str) -> Any:
    import aetcd

    host, _, port = endpoint.rpartition(":")
    async with aetcd.Client(host=host, port=int(port)) as client:
        lock = client.lock(f"bench-aetcd-{name}".encode(), ttl=30)

        async def cycle() -> None:
            await lock.acquire(timeout=None)
            await lock.release()

        yield cycle


IN_PROCESS = {"floor": _floor, "aiolocks": _aiolocks, "aetcd": _aetcd}


def _py3_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("etcd3") is not None


def _py3(endpoint: str, *args: str) -> dict[str, Any]:
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.etcd_py3", endpoint, *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# -- measurements


async def _timed(cycle: Cycle, cycles: int) -> list[float]:
    for _ in range(max(5, cycles // 10)):
        await cycle()
    samples = []
    for _ in range(cycles):
        started = time.perf_counter()
        await cycle()
        samples.append(time.perf_counter() - started)
    return samples


async def uncontended(endpoint: str, plan: Plan, names: list[str]) -> dict[str, float]:
    """Median cycle (ms) per contender, interleaved rounds."""
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for index in range(plan.rounds):
        order = names if index % 2 == 0 else list(reversed(names))
        for name in order:
            if name == "python-etcd3":
                samples = await asyncio.to_thread(
                    _py3, endpoint, "uncontended", str(plan.cycles)
                )
                per_round[name].append(median(samples["samples"]) * 1000)
                continue
            async with IN_PROCESS[name](endpoint, uuid.uuid4().hex[:8]) as cycle:
                per_round[name].append(median(await _timed(cycle, plan.cycles)) * 1000)
    return {name: median(values) for name, values in per_round.items()}


async def requests_per_cycle(endpoint: str, plan: Plan, names: list[str]) -> dict[str, float]:
    """gRPC messages the server received per cycle (untimed pass)."""
    found: dict[str, float] = {}
    for name in names:
        if name == "python-etcd3":
            before = server_metrics(endpoint)["messages"]
            await asyncio.to_thread(_py3, endpoint, "uncontended", str(plan.cost_cycles))
            after = server_metrics(endpoint)["messages"]
            total = plan.cost_cycles + max(10, plan.cost_cycles // 10)
            found[name] = (after - before) / total
            continue
        async with IN_PROCESS[name](endpoint, uuid.uuid4().hex[:8]) as cycle:
            await cycle()
            await asyncio.sleep(0.2)
            before = server_metrics(endpoint)["messages"]
            for _ in range(plan.cost_cycles):
                await cycle()
            await asyncio.sleep(0.2)  # stream messages sent after the release
            after = server_metrics(endpoint)["messages"]
        found[name] = (after - before) / plan.cost_cycles
    return found


async def contended(endpoint: str, plan: Plan, name: str) -> float:
    """Holds per second of ``plan.tasks`` tasks (on two clients) taking one lock in turn."""
    if name == "python-etcd3":
        result = await asyncio.to_thread(
            _py3, endpoint, "contended", str(plan.contended_s), str(plan.tasks)
        )
        if result["overlaps"]:
            raise Overlap(f"python-etcd3: {result['overlaps']} overlaps")
        return float(result["holds_per_s"])
    lock_name = uuid.uuid4().hex[:8]
    state = {"inside": 0, "holds": 0}
    async with contextlib.AsyncExitStack() as stack:
        if name == "aiolocks":
            import aiolocks

            backends = [
                await stack.enter_async_context(
                    aiolocks.connect(f"etcd://{endpoint}/bench-aiolocks")
                )
                for _ in range(2)
            ]
            locks: list[Any] = [backends[i % 2].mutex(lock_name) for i in range(plan.tasks)]

            async def take(i: int) -> None:
                await locks[i].acquire()

            async def give(i: int) -> None:
                await locks[i].release()
        else:
            import aetcd

            host, _, port = endpoint.rpartition(":")
            clients = [
                await stack.enter_async_context(aetcd.Client(host=host, port=int(port)))
                for _ in range(2)
            ]
            key = f"bench-aetcd-c-{lock_name}".encode()
            locks = [clients[i % 2].lock(key, ttl=30) for i in range(plan.tasks)]

            async def take(i: int) -> None:
                await locks[i].acquire(timeout=None)

            async def give(i: int) -> None:
                await locks[i].release()

        loop = asyncio.get_running_loop()
        stop_at = loop.time() + plan.contended_s

        async def worker(i: int) -> None:
            while loop.time() < stop_at:
                await take(i)
                state["inside"] += 1
                if state["inside"] > 1:
                    raise Overlap(f"{name}: two holders at once")
                await asyncio.sleep(0.001)
                state["inside"] -= 1
                state["holds"] += 1
                await give(i)

        started = loop.time()
        await asyncio.gather(*(worker(i) for i in range(plan.tasks)))
        return state["holds"] / (loop.time() - started)


async def drain(endpoint: str, plan: Plan, name: str) -> dict[str, float]:
    """W waiters queued behind a holder; time from the release until all have held it."""
    lock_name = uuid.uuid4().hex[:8]
    done = 0
    async with contextlib.AsyncExitStack() as stack:
        if name == "aiolocks":
            import aiolocks

            backend = await stack.enter_async_context(
                aiolocks.connect(f"etcd://{endpoint}/bench-aiolocks")
            )
            lock = backend.mutex(lock_name)
            await lock.acquire()
            base = server_metrics(endpoint)["watchers"]

            async def waiter() -> None:
                nonlocal done
                async with lock:
                    done += 1

            async def queued() -> bool:
                # every waiter's key is in the queue and its watch is on the server
                if len(await lock.participants()) < plan.waiters + 1:
                    return False
                return server_metrics(endpoint)["watchers"] - base >= plan.waiters

            release: Callable[[], Awaitable[Any]] = lock.release
        else:
            import aetcd

            host, _, port = endpoint.rpartition(":")
            client = await stack.enter_async_context(aetcd.Client(host=host, port=int(port)))
            key = f"bench-aetcd-d-{lock_name}".encode()
            holder = client.lock(key, ttl=30)
            await holder.acquire()
            base = server_metrics(endpoint)["watchers"]

            async def waiter() -> None:
                nonlocal done
                lock = client.lock(key, ttl=30)
                await lock.acquire(timeout=None)
                done += 1
                await lock.release()

            async def queued() -> bool:
                return server_metrics(endpoint)["watchers"] - base >= plan.waiters

            release = holder.release
        tasks = [asyncio.create_task(waiter()) for _ in range(plan.waiters)]
        async with asyncio.timeout(120):
            while not await queued():
                await asyncio.sleep(0.05)
        seen = server_metrics(endpoint)
        started = time.perf_counter()
        await release()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    assert done == plan.waiters
    return {
        "drain_ms": elapsed * 1000,
        "watchers": seen["watchers"],
        "watch_streams": seen["watch_streams"],
    }


async def run(endpoint: str, plan: Plan) -> dict[str, Any]:
    """Every measurement, as a JSON-ready document."""
    names = ["floor", "aiolocks", "aetcd"]
    if _py3_installed():
        names.append("python-etcd3")
    else:
        _log("python-etcd3 (PyPI etcd3) is not installed: its rows are skipped")
    _log(f"uncontended: {plan.rounds} rounds of {plan.cycles} cycles")
    cycle_ms = await uncontended(endpoint, plan, names)
    _log("requests per cycle (server /metrics)")
    requests = await requests_per_cycle(endpoint, plan, names)
    peers = [n for n in names if n not in ("floor", "aiolocks")]
    holds: dict[str, list[float]] = {}
    for index in range(plan.rounds):
        order = ["aiolocks", *peers]
        for name in order if index % 2 == 0 else list(reversed(order)):
            _log(f"contended: {name}, round {index + 1}")
            holds.setdefault(name, []).append(await contended(endpoint, plan, name))
    holds_median = {name: median(values) for name, values in holds.items()}
    drains = {}
    for name in ("aiolocks", "aetcd"):
        _log(f"{plan.waiters} waiters drain: {name}")
        drains[name] = await drain(endpoint, plan, name)
    best_peer = min((cycle_ms[p] for p in peers), default=None)
    return {
        "plan": plan.__dict__,
        "uncontended_ms": cycle_ms,
        "requests_per_cycle": requests,
        "contended_holds_per_s": holds_median,
        "drain": drains,
        "aiolocks_vs_best_peer_uncontended": (
            cycle_ms["aiolocks"] / best_peer if best_peer else None
        ),
        "aiolocks_vs_floor_uncontended": cycle_ms["aiolocks"] / cycle_ms["floor"],
    }


def table(doc: dict[str, Any]) -> str:
    """The figures as Markdown tables."""
    lines = [
        "| contender | uncontended cycle ms | x aiolocks | server requests/cycle "
        "| contended holds/s | x aiolocks |",
        "|---|---|---|---|---|---|",
    ]
    ours = doc["uncontended_ms"]["aiolocks"]
    our_holds = doc["contended_holds_per_s"]["aiolocks"]
    for name, value in doc["uncontended_ms"].items():
        holds = doc["contended_holds_per_s"].get(name)
        lines.append(
            f"| {name} | {value:.2f} | {value / ours:.2f} "
            f"| {doc['requests_per_cycle'][name]:.2f} "
            f"| {'' if holds is None else f'{holds:.0f}'} "
            f"| {'' if holds is None else f'{holds / our_holds:.2f}'} |"
        )
    lines += [
        "",
        "| contender | waiters | drain ms | watchers on the server | watch streams |",
        "|---|---|---|---|---|",
    ]
    for name, row in doc["drain"].items():
        lines.append(
            f"| {name} | {doc['plan']['waiters']} | {row['drain_ms']:.0f} "
            f"| {row['watchers']:.0f} | {row['watch_streams']:.0f} |"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def _server(endpoint: str | None) -> Iterator[str]:
    if endpoint:
        yield endpoint
        return
    from aiolocks.testing import EtcdServer

    with EtcdServer() as server:
        yield server.endpoints[0]


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks etcd", description=__doc__.splitlines()[0]
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--endpoint", help="host:port of an etcd to use instead of starting one")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for etcd.json")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    with _server(args.endpoint) as endpoint:
        doc = asyncio.run(run(endpoint, PLANS[mode]))
    doc["mode"] = mode
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "etcd.json").write_text(json.dumps(doc, indent=2))
    print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
