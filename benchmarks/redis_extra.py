"""Two Redis scenarios of the main report (``python -m benchmarks``), also
runnable alone: ``python -m benchmarks.redis_extra``.

* **Many waiters**: ``W`` worker processes (one waiting task each, or
  ``--tasks`` each) take turns on one lock (the handoff mode of the contended
  scenario: a worker asks again only after another one entered). Per hold:
  ``EVALSHA`` calls (``INFO commandstats``), all commands executed including
  those run inside scripts (``total_commands_processed``), and server CPU
  (idle CPU subtracted).
* **Loss latency**: a held lock's key is deleted by another client; the time
  from that ``DEL`` returning to the body's ``LockLostError`` (a sample
  without one within 10 s counts as *missed*).

``--contended N`` runs instead N interleaved rounds of the main report's
contended closed loop (4 processes x 4 tasks, 1 ms inside, 5 ms think) for
each library, and prints each round and the median ratio of holds/s against
the last library: an A/B check in one sitting. ``--uncontended N`` runs N
alternating rounds of 1000 uncontended cycles (``acquire()`` + ``release()``)
of an aiolocks mutex and of redis-py's ``Lock`` on one server, and prints the
median time per cycle of each and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import redis.asyncio

import aiolocks
from aiolocks.testing.servers import RedisServer

from ._peers import CONTENDERS
from ._scenarios import contended_round, idle_redis_cpu

__all__ = ["contended", "loss_latency", "main", "many_waiters", "uncontended"]

FIELDS = (
    "holds_per_s",
    "server_evalsha_per_hold",
    "server_commands_per_hold",
    "server_cpu_us_per_hold",
    "wait_p99_ms",
    "handoff_p50_ms",
    "overlaps",
    "lost_updates",
)


def many_waiters(
    server: RedisServer,
    keys: list[str],
    waiters: list[tuple[int, int]],
    duration_s: float,
    idle_cpu_us_per_s: float | None = None,
) -> list[dict[str, object]]:
    """One row per ((processes, tasks), contender): the figures in ``FIELDS``."""
    rows: list[dict[str, object]] = []
    contenders = [c for c in CONTENDERS if c.key in keys]
    with tempfile.TemporaryDirectory() as workdir:
        idle = idle_redis_cpu(server, 1.0) if idle_cpu_us_per_s is None else idle_cpu_us_per_s
        for w, tasks in waiters:
            for contender in contenders:
                result = contended_round(
                    contender,
                    server.url,
                    processes=w,
                    tasks=tasks,
                    duration_s=duration_s,
                    hold_s=0.0005,
                    think_s=0.0,
                    workdir=Path(workdir),
                    seed=1,
                    polite=True,
                    redis_server=server,
                    idle_cpu_us_per_s=idle,
                )
                row: dict[str, object] = {"library": contender.key, "processes": w, "tasks": tasks}
                row.update({k: result[k] for k in FIELDS})
                rows.append(row)
    return rows


def contended(
    server: RedisServer, keys: list[str], rounds: int, duration_s: float
) -> list[dict[str, object]]:
    """``rounds`` interleaved contended closed-loop runs per library (4 x 4, 1 ms, 5 ms think)."""
    contenders = [c for c in CONTENDERS if c.key in keys]
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as workdir:
        idle = idle_redis_cpu(server, 1.0)
        for r in range(rounds):
            order = contenders if r % 2 == 0 else contenders[::-1]
            for contender in order:
                result = contended_round(
                    contender,
                    server.url,
                    processes=4,
                    tasks=4,
                    duration_s=duration_s,
                    hold_s=0.001,
                    think_s=0.005,
                    workdir=Path(workdir),
                    seed=r,
                    redis_server=server,
                    idle_cpu_us_per_s=idle,
                )
                row: dict[str, object] = {"library": contender.key, "round": r}
                row.update({k: result[k] for k in FIELDS})
                rows.append(row)
    return rows


async def uncontended(url: str, rounds: int, cycles: int = 1000) -> dict[str, object]:
    """Alternating rounds of uncontended cycles: aiolocks mutex vs redis-py ``Lock`` (µs/cycle)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        async with aiolocks.connect(url) as backend:
            ours = backend.mutex("bench-uncontended")
            theirs = client.lock("bench-uncontended-redis-py", timeout=30, sleep=0.1)

            async def ours_cycle() -> None:
                await ours.acquire()
                await ours.release()

            async def theirs_cycle() -> None:
                await theirs.acquire()
                await theirs.release()

            both = [("aiolocks", ours_cycle), ("redis-py", theirs_cycle)]
            for _, cycle in both:  # warm-up, not measured
                for _ in range(cycles // 2):
                    await cycle()
            per: dict[str, list[float]] = {"aiolocks": [], "redis-py": []}
            for r in range(rounds):
                for name, cycle in both if r % 2 == 0 else both[::-1]:
                    started = time.perf_counter()
                    for _ in range(cycles):
                        await cycle()
                    per[name].append((time.perf_counter() - started) / cycles * 1e6)
    finally:
        await client.aclose()
    ratios = [a / b for a, b in zip(per["aiolocks"], per["redis-py"], strict=True)]
    return {
        "aiolocks_us": statistics.median(per["aiolocks"]),
        "redis_py_us": statistics.median(per["redis-py"]),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


async def loss_latency(url: str, samples: int) -> dict[str, float]:
    """Delete a held lock's key ``samples`` times; p50/p99/max ms until the body's loss."""
    raw = redis.asyncio.Redis.from_url(url)
    latencies: list[float] = []
    missed = 0
    key = "bench-loss:{mutex:loss/x}"
    try:
        async with aiolocks.connect(url + "?key_prefix=bench-loss:") as backend:
            for _ in range(samples):
                lock = backend.mutex("loss/x")
                deleted = 0.0
                try:
                    async with lock:
                        # the hold subscribes to its key's events 50 ms after
                        # the grant: delete once that has settled
                        await asyncio.sleep(0.15)
                        await raw.delete(key)
                        deleted = time.perf_counter()
                        await asyncio.sleep(10)
                    missed += 1
                except aiolocks.LockLostError:
                    latencies.append((time.perf_counter() - deleted) * 1000)
                await raw.delete(key)  # what the lost hold's release left (the fence counter)
    finally:
        await raw.aclose()
    latencies.sort()
    if not latencies:
        return {"samples": samples, "missed": missed, "p50_ms": math.nan, "p99_ms": math.nan}
    return {
        "samples": samples,
        "missed": missed,
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[max(0, int(len(latencies) * 0.99) - 1)],
        "max_ms": latencies[-1],
    }


def main(argv: list[str] | None = None) -> int:
    """Run both scenarios on a fresh local Redis; print JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_extra")
    parser.add_argument("--libraries", default="aiolocks-redis,python-redis-lock")
    parser.add_argument("--waiters", default="4,8,16")
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--loss-samples", type=int, default=40)
    parser.add_argument("--contended", type=int, default=0, metavar="ROUNDS")
    parser.add_argument("--uncontended", type=int, default=0, metavar="ROUNDS")
    args = parser.parse_args(argv)
    with RedisServer() as server:
        if args.uncontended:
            result = asyncio.run(uncontended(server.url, args.uncontended))
            print(json.dumps({"scenario": "uncontended", **result}))
            return 0
        if args.contended:
            libraries = args.libraries.split(",")
            rows = contended(server, libraries, args.contended, args.duration)
            by: dict[str, list[float]] = {k: [] for k in libraries}
            for row in rows:
                print(json.dumps({"scenario": "contended", **row}), flush=True)
                by[str(row["library"])].append(float(str(row["holds_per_s"])))
            base = by[libraries[-1]]
            for key in libraries[:-1]:
                ratios = [a / b for a, b in zip(by[key], base, strict=True) if b]
                print(
                    json.dumps(
                        {
                            "scenario": "contended-ratio",
                            "library": key,
                            "against": libraries[-1],
                            "median": statistics.median(ratios) if ratios else None,
                            "ratios": [round(x, 3) for x in ratios],
                        }
                    )
                )
            return 0
        for row in many_waiters(
            server,
            args.libraries.split(","),
            [(int(w), args.tasks) for w in args.waiters.split(",")],
            args.duration,
        ):
            print(json.dumps({"scenario": "many-waiters", **row}), flush=True)
        loss = asyncio.run(loss_latency(server.url, args.loss_samples))
        print(json.dumps({"scenario": "loss-latency", "library": "aiolocks-redis", **loss}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
