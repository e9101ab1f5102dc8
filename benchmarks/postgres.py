"""PostgreSQL locks side by side: ``python -m benchmarks.postgres [--quick] [--url URL]``.

Contenders (each takes and gives back one lock per cycle):

``floor``
    bare ``pg_try_advisory_lock`` / ``pg_advisory_unlock`` on one asyncpg
    connection: two round trips, nothing else. The cost every advisory lock
    pays.
``floor+sequence``
    the floor with a ``nextval()`` of one sequence in the lock statement: what
    a fencing token from a sequence instead of a row update would cost.
``floor+fencing-row``
    the floor with the statement ``mode=advisory`` sends: the lock call and
    the fencing row's ``INSERT … ON CONFLICT DO UPDATE`` in one statement
    (separates the SQL's cost from the library's own).
``aiolocks-advisory``
    ``async with backend.mutex(name)`` in ``mode=advisory`` (the grant draws
    its fencing token with ``nextval`` in the same statement; tasks of one
    backend hand the lock on with one ``nextval``).
``aiolocks-lease``
    the same in ``mode=lease`` (a row per hold through a pool; on a direct
    server its statements are prepared: one round trip each).
``for-update``
    a lock row taken with ``SELECT … FOR UPDATE`` in a transaction (BEGIN,
    SELECT, COMMIT: three round trips; the lock lives as long as the
    transaction).
``asyncpg-lock``
    ``asyncpg_lock.AdvisoryLockGuard`` (PyPI ``asyncpg-lock``): a leader-style
    guard that opens a connection per run and waits ``after_acquire_delay``
    (here 1 ms, its minimum is "positive") before running the work, so its
    cycle includes a connection set-up. Uncontended only (it polls every
    ``reacquire_delay`` when the lock is taken).

Method: one process, one server (a throwaway ``PostgresServer`` unless
``--url``; note that it runs with ``fsync=off``, so a commit's flush costs
nothing here and row writes look cheaper than on a real disk). Rounds are
interleaved (A B C …, then … C B A); each figure is the median over rounds
and ratios are ratios of medians; "per round" is the median of each round's
cycle over the floor's in that round (taken moments apart, so steadier on a
loaded machine). Contended: ``--tasks`` tasks, each with its
own connection (or its own lock object on one aiolocks backend), hammer one
name for ``--seconds``; the figure is completed holds per second, and a
shared counter checks that no two holders overlapped.

Many waiters: ``--waiters`` tasks (split over two aiolocks backends, as two
processes would be) queue on one held name; the holder lets go and every
waiter takes and releases the lock once. Reported: the drain time and the
server's transactions per hold (``pg_stat_database.xact_commit``, every
statement is one): a polling waiter would show many per hold, a waiter that
the server or a local hand-off wakes shows about two.

Also part of ``python -m benchmarks`` (the PostgreSQL section of its report).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg

import aiolocks

__all__ = ["main", "many_waiters", "run", "table"]

Cycle = Callable[[], Awaitable[None]]

UNCONTENDED = (
    "floor",
    "floor+sequence",
    "floor+fencing-row",
    "aiolocks-advisory",
    "aiolocks-lease",
    "for-update",
)
CONTENDED = ("floor", "aiolocks-advisory", "aiolocks-lease", "for-update")

_KEY_BASE = 9_100_000_000


class Overlap(AssertionError):
    """Two holders were inside one critical section at once (a broken lock)."""


@contextlib.asynccontextmanager
async def _uncontended(name: str, url: str) -> AsyncIterator[Cycle]:
    """One cycle function of contender ``name`` (set up and torn down around the rounds)."""
    tag = uuid.uuid4().hex[:10]
    key = _KEY_BASE + hash(tag) % 1_000_000
    if name in ("floor", "floor+sequence", "floor+fencing-row", "for-update"):
        conn = await asyncpg.connect(url)
        try:
            if name == "floor":

                async def cycle() -> None:
                    await conn.fetchval("SELECT pg_try_advisory_lock($1)", key)
                    await conn.fetchval("SELECT pg_advisory_unlock($1)", key)

            elif name == "floor+sequence":
                await conn.execute("CREATE SEQUENCE IF NOT EXISTS bench_fencing_seq")

                async def cycle() -> None:
                    await conn.fetchval(
                        "SELECT CASE WHEN pg_try_advisory_lock($1) "
                        "THEN nextval('bench_fencing_seq') END",
                        key,
                    )
                    await conn.fetchval("SELECT pg_advisory_unlock($1)", key)

            elif name == "floor+fencing-row":
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS bench_fencing (name text PRIMARY KEY, "
                    "epoch bigint NOT NULL)"
                )

                async def cycle() -> None:
                    await conn.fetchval(
                        "WITH granted AS (SELECT pg_try_advisory_lock($1) AS ok) "
                        "INSERT INTO bench_fencing AS f (name, epoch) SELECT $2, 1 FROM granted "
                        "WHERE granted.ok ON CONFLICT (name) DO UPDATE SET epoch = f.epoch + 1 "
                        "RETURNING f.epoch",
                        key,
                        tag,
                    )
                    await conn.fetchval("SELECT pg_advisory_unlock($1)", key)

            else:
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS bench_lock_rows (name text PRIMARY KEY)"
                )
                await conn.execute(
                    "INSERT INTO bench_lock_rows VALUES ($1) ON CONFLICT DO NOTHING", tag
                )

                async def cycle() -> None:
                    async with conn.transaction():
                        await conn.fetchval(
                            "SELECT name FROM bench_lock_rows WHERE name = $1 FOR UPDATE", tag
                        )

            yield cycle
        finally:
            await conn.close()
        return
    if name == "asyncpg-lock":
        from asyncpg_lock import AdvisoryLockGuard, connect_func

        guard = AdvisoryLockGuard(
            connect=connect_func(url),
            reconnect_delay=0,
            reacquire_delay=0.001,
            after_acquire_delay=0.001,
        )

        async def cycle() -> None:
            entered = asyncio.Event()

            async def work() -> None:
                entered.set()
                await asyncio.sleep(3600)

            task = asyncio.create_task(guard.run(key, work))
            await entered.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        yield cycle
        return
    mode = "?mode=lease&lease_time=30" if name == "aiolocks-lease" else ""
    async with aiolocks.connect(url + mode) as backend:
        lock = backend.mutex(f"bench/{tag}")

        async def cycle() -> None:
            async with lock:
                pass

        yield cycle


async def _round(cycle: Cycle, cycles: int) -> float:
    started = time.perf_counter()
    for _ in range(cycles):
        await cycle()
    return (time.perf_counter() - started) / cycles


async def _contended(name: str, url: str, tasks: int, seconds: float) -> float:
    """Completed holds per second of ``tasks`` tasks on one name; raises :class:`Overlap`."""
    tag = uuid.uuid4().hex[:10]
    key = _KEY_BASE + hash(tag) % 1_000_000
    inside = 0
    done = 0
    stop = time.monotonic() + seconds

    async def critical() -> None:
        nonlocal inside, done
        inside += 1
        if inside != 1:
            raise Overlap(f"{name}: {inside} holders at once")
        await asyncio.sleep(0)
        inside -= 1
        done += 1

    async with contextlib.AsyncExitStack() as stack:
        workers: list[Callable[[], Awaitable[None]]] = []
        if name in ("floor", "for-update"):
            setup = await asyncpg.connect(url)
            await setup.execute(
                "CREATE TABLE IF NOT EXISTS bench_lock_rows (name text PRIMARY KEY)"
            )
            await setup.execute(
                "INSERT INTO bench_lock_rows VALUES ($1) ON CONFLICT DO NOTHING", tag
            )
            await setup.close()
            for _ in range(tasks):
                conn = await asyncpg.connect(url)
                stack.push_async_callback(conn.close)

                async def loop(conn: Any = conn) -> None:
                    while time.monotonic() < stop:
                        if name == "floor":
                            await conn.execute("SELECT pg_advisory_lock($1)", key)
                            try:
                                await critical()
                            finally:
                                await conn.execute("SELECT pg_advisory_unlock($1)", key)
                        else:
                            async with conn.transaction():
                                await conn.fetchval(
                                    "SELECT name FROM bench_lock_rows WHERE name = $1 FOR UPDATE",
                                    tag,
                                )
                                await critical()

                workers.append(loop)
        else:
            mode = "?mode=lease&lease_time=30" if name == "aiolocks-lease" else ""
            backend = await stack.enter_async_context(aiolocks.connect(url + mode))
            for _ in range(tasks):
                lock = backend.mutex(f"bench/{tag}")

                async def hold_loop(lock: Any = lock) -> None:
                    while time.monotonic() < stop:
                        async with lock:
                            await critical()

                workers.append(hold_loop)
        started = time.monotonic()
        await asyncio.gather(*(w() for w in workers))
        elapsed = time.monotonic() - started
    return done / elapsed


async def _commits(conn: Any) -> int:
    value = await conn.fetchval(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    )
    return int(value)


async def many_waiters(url: str, waiters: int, *, settle: float = 1.5) -> dict[str, Any]:
    """``waiters`` queued tasks on one name drain; time and server transactions per hold."""
    name = f"bench/many/{uuid.uuid4().hex[:10]}"
    inside = 0
    done = 0
    observer = await asyncpg.connect(url)
    try:
        async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
            holder = one.mutex(name)
            assert await holder.acquire(timeout=30)

            async def wait(backend: aiolocks.Backend) -> None:
                nonlocal inside, done
                async with backend.mutex(name):
                    inside += 1
                    if inside != 1:
                        raise Overlap(f"many waiters: {inside} holders at once")
                    await asyncio.sleep(0)
                    inside -= 1
                    done += 1

            tasks = [asyncio.create_task(wait(one if i % 2 == 0 else two)) for i in range(waiters)]
            # every waiter queued (locally or on the server); the statistics of
            # their first tries are flushed (sessions report at most every second)
            await asyncio.sleep(settle)
            before = await _commits(observer)
            started = time.perf_counter()
            await holder.release()
            await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - started
            await asyncio.sleep(settle)  # the sessions' statistics of the drain are flushed
            after = await _commits(observer)
    finally:
        await observer.close()
    return {
        "waiters": waiters,
        "drain_s": elapsed,
        "holds_per_s": done / elapsed if elapsed else None,
        "server_transactions_per_hold": (after - before - 1) / max(1, done),
    }


async def run(
    url: str,
    *,
    rounds: int = 15,
    cycles: int = 300,
    tasks: int = 8,
    seconds: float = 3.0,
    with_peer: bool = True,
    waiters: int = 200,
    settle: float = 1.5,
) -> dict[str, Any]:
    """Every measurement; returns the JSON-ready result (times in microseconds)."""
    names = list(UNCONTENDED)
    if with_peer:
        try:
            import asyncpg_lock  # noqa: F401
        except ImportError:
            print("asyncpg-lock is not installed (pip install 'aiolocks[bench]'): skipped")
        else:
            names.append("asyncpg-lock")
    samples: dict[str, list[float]] = {n: [] for n in names}
    async with contextlib.AsyncExitStack() as stack:
        cycles_of = {n: await stack.enter_async_context(_uncontended(n, url)) for n in names}
        for cycle in cycles_of.values():  # warm-up (connections, prepared statements)
            await _round(cycle, max(10, cycles // 10))
        for index in range(rounds):
            order = names if index % 2 == 0 else names[::-1]
            for n in order:
                peer_cycles = max(5, cycles // 10) if n == "asyncpg-lock" else cycles
                samples[n].append(await _round(cycles_of[n], peer_cycles))
    uncontended = {n: statistics.median(v) * 1e6 for n, v in samples.items()}
    floor = uncontended["floor"]
    # each round's cycle over the floor's in the same round (measured moments
    # apart): steadier than a ratio of medians when the machine's load moves
    per_round = {
        n: statistics.median(x / f for x, f in zip(v, samples["floor"], strict=True))
        for n, v in samples.items()
    }
    holds: dict[str, list[float]] = {n: [] for n in CONTENDED}
    for index in range(max(1, rounds // 2)):
        order = list(CONTENDED) if index % 2 == 0 else list(CONTENDED)[::-1]
        for n in order:
            holds[n].append(await _contended(n, url, tasks, seconds))
    contended = {n: statistics.median(v) for n, v in holds.items()}
    drain = await many_waiters(url, waiters, settle=settle)
    return {
        "uncontended_cycle_us": uncontended,
        "uncontended_vs_floor": {n: v / floor for n, v in uncontended.items()},
        "uncontended_vs_floor_per_round": per_round,
        "contended_holds_per_s": contended,
        "contended_vs_floor": {n: v / contended["floor"] for n, v in contended.items()},
        "many_waiters": drain,
        "method": {
            "rounds": rounds,
            "cycles": cycles,
            "tasks": tasks,
            "seconds": seconds,
            "waiters": waiters,
        },
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'contender':<20} {'cycle µs':>10} {'x floor':>8} {'per round':>10} "
        f"{'holds/s':>10} {'x floor':>8}"
    ]
    per_round = result.get("uncontended_vs_floor_per_round", {})
    for n, us in result["uncontended_cycle_us"].items():
        ratio = result["uncontended_vs_floor"][n]
        paired = per_round.get(n)
        paired_text = f"{paired:>10.2f}" if paired is not None else f"{'-':>10}"
        holds = result["contended_holds_per_s"].get(n)
        hratio = result["contended_vs_floor"].get(n)
        tail = f"{holds:>10.0f} {hratio:>8.2f}" if holds is not None else f"{'-':>10} {'-':>8}"
        lines.append(f"{n:<20} {us:>10.0f} {ratio:>8.2f} {paired_text} {tail}")
    drain = result.get("many_waiters")
    if drain:
        lines.append(
            f"many waiters: {drain['waiters']} drained in {drain['drain_s']:.2f} s, "
            f"{drain['server_transactions_per_hold']:.2f} server transactions per hold"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: start a throwaway server (or use ``--url``), measure, print."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.postgres", description=__doc__)
    parser.add_argument("--url", help="an existing server (default: a throwaway one)")
    parser.add_argument("--quick", action="store_true", help="few rounds (plumbing check)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--tasks", type=int, default=8)
    args = parser.parse_args(argv)
    # asyncpg-lock logs the connection it closes under a cancelled run as an error
    logging.getLogger("asyncpg_lock").setLevel(logging.CRITICAL)
    options: dict[str, Any] = {"tasks": args.tasks}
    if args.quick:
        options.update(rounds=1, cycles=20, seconds=0.5, waiters=40)

    async def go(url: str) -> dict[str, Any]:
        return await run(url, **options)

    if args.url:
        result = asyncio.run(go(args.url))
    else:
        from aiolocks.testing import PostgresServer

        with PostgresServer() as server:
            result = asyncio.run(go(server.url))
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
