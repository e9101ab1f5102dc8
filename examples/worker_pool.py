"""Worker processes deducting stock under per-SKU locks, with a Semaphore capping a slow API.

::

    python examples/worker_pool.py                      # memory://, tasks of one process
    python examples/worker_pool.py --processes 3 --url redis://127.0.0.1:6379/0 \\
        --database postgresql://postgres:aiolocks@127.0.0.1:5432/postgres

Orders for a few SKUs are shared out between worker processes (``--processes``,
each a ``python worker_pool.py --worker N`` of its own) and, inside each, between
``--workers`` tasks. A worker takes one order at a time:

1. ``locks/stock/sku-{sku}`` (a mutex per SKU, so orders for different SKUs
   proceed in parallel) around the read-modify-write of the stock level,
   with a database round trip in the middle. The write is fenced by the
   lock's token (``UPDATE ... WHERE last_token < $3``);
2. then a lease of ``limits/shipping-api`` (``max_leases=5``) around the
   call to a slow downstream API, which must never see more than 5 calls
   at once, across all workers and processes.

With ``--processes`` the stock levels and the downstream API's meter of
calls in flight live in PostgreSQL (``--database``), where every process
sees them; on one process (the default) they live in memory. The report
checks the invariants: no SKU oversold, stock accounted for, at most 5
concurrent downstream calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiolocks

#: at most this many concurrent calls to the downstream API
DOWNSTREAM_LIMIT = 5


class Stock(Protocol):
    """Stock levels, read and written with a round trip each, like rows in a database."""

    async def read(self, sku: str) -> int:
        """Read a stock level."""
        ...

    async def write(self, sku: str, level: int, fencing_token: int) -> None:
        """Write a stock level; a stale ``fencing_token`` is refused (RuntimeError)."""
        ...


class Shipping(Protocol):
    """The slow downstream service; it counts the calls it serves at once."""

    async def ship(self, sku: str, quantity: int) -> None:
        """Book a shipment (slow)."""
        ...


@dataclass
class Warehouse:
    """Stock levels in this process's memory."""

    stock: dict[str, int]
    latency: float = 0.002

    async def read(self, sku: str) -> int:
        """Read a stock level (one round trip)."""
        await asyncio.sleep(self.latency)
        return self.stock[sku]

    async def write(self, sku: str, level: int, fencing_token: int) -> None:
        """Write a stock level (one round trip)."""
        await asyncio.sleep(self.latency)
        self.stock[sku] = level


@dataclass
class ShippingApi:
    """A slow downstream service in this process that records how many calls it served at once."""

    latency: float = 0.02
    active: int = 0
    max_active: int = 0
    calls: int = 0

    async def ship(self, sku: str, quantity: int) -> None:
        """Book a shipment (slow)."""
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(self.latency)
            self.calls += 1
        finally:
            self.active -= 1


@dataclass
class Tally:
    """What one process did."""

    sold: Counter[str] = field(default_factory=Counter)
    rejected: int = 0
    shipped: int = 0
    orders: int = 0


@dataclass
class Report:
    """What the run did, and the invariants to check."""

    initial: dict[str, int]
    final: dict[str, int]
    sold: Counter[str] = field(default_factory=Counter)
    rejected: int = 0
    shipped: int = 0
    max_concurrent_downstream: int = 0
    orders_per_process: list[int] = field(default_factory=list)

    @property
    def oversold(self) -> bool:
        """Some SKU went below zero, or sold more than it had."""
        return any(
            self.final[sku] < 0 or self.sold[sku] > self.initial[sku] for sku in self.initial
        )

    @property
    def consistent(self) -> bool:
        """Every unit sold is missing from the stock, and every sale was shipped."""
        stock_ok = all(
            self.final[sku] == self.initial[sku] - self.sold[sku] for sku in self.initial
        )
        return stock_ok and self.shipped == sum(self.sold.values())


def make_orders(orders: int, skus: int, seed: int) -> list[tuple[str, int]]:
    """The same ``orders`` random (sku, quantity) pairs for every process."""
    rng = random.Random(seed)
    names = [f"sku-{n}" for n in range(skus)]
    return [(rng.choice(names), rng.randint(1, 3)) for _ in range(orders)]


async def work(
    backend: aiolocks.Backend,
    orders: list[tuple[str, int]],
    stock: Stock,
    shipping: Shipping,
    *,
    run_id: str,
    workers: int,
) -> Tally:
    """Process ``orders`` with ``workers`` tasks on ``backend``; what they did."""
    tally = Tally()
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for order in orders:
        queue.put_nowait(order)
    limit = backend.semaphore(f"limits/{run_id}/shipping-api", max_leases=DOWNSTREAM_LIMIT)

    async def worker() -> None:
        while not queue.empty():
            sku, quantity = queue.get_nowait()
            tally.orders += 1
            # Always pass a timeout: a stuck holder becomes an error, not a hang.
            lock = backend.mutex(f"locks/stock/{run_id}/{sku}")
            async with lock.hold(timeout=60):
                level = await stock.read(sku)
                if level < quantity:
                    tally.rejected += 1
                    continue
                token = lock.fencing_token
                assert token is not None
                await stock.write(sku, level - quantity, token)
                tally.sold[sku] += quantity
            # The slow call happens after the stock lock is released: keep
            # critical sections short, and take the two locks one after the other.
            async with limit.lease(timeout=60):
                await shipping.ship(sku, quantity)
                tally.shipped += quantity

    async with asyncio.TaskGroup() as group:
        for n in range(workers):
            group.create_task(worker(), name=f"worker-{n}")
    return tally


async def run(
    url: str = "memory://",
    *,
    workers: int = 12,
    orders: int = 200,
    skus: int = 4,
    stock: int = 30,
    seed: int = 7,
) -> Report:
    """One process: ``workers`` tasks over two connections, state in memory; the report."""
    run_id = os.urandom(4).hex()  # fresh lock names, so runs on a shared server never meet
    todo = make_orders(orders, skus, seed)
    warehouse = Warehouse({f"sku-{n}": stock for n in range(skus)})
    shipping = ShippingApi()
    report = Report(initial=dict(warehouse.stock), final={})
    # Two connections: the workers contend through the lock service, as if
    # they ran in two processes (memory:// shares one store per event loop).
    each = max(1, workers // 2)
    async with aiolocks.connect(url) as first, aiolocks.connect(url) as second:
        halves = await asyncio.gather(
            work(first, todo[::2], warehouse, shipping, run_id=run_id, workers=each),
            work(second, todo[1::2], warehouse, shipping, run_id=run_id, workers=each),
        )
    report.final = dict(warehouse.stock)
    report.max_concurrent_downstream = shipping.max_active
    for tally in halves:
        _add(report, tally)
    return report


def _add(report: Report, tally: Tally) -> None:
    report.sold.update(tally.sold)
    report.rejected += tally.rejected
    report.shipped += tally.shipped
    report.orders_per_process.append(tally.orders)


# -- several processes: the state in PostgreSQL ---------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {prefix}_stock (
    sku text PRIMARY KEY, level int NOT NULL, last_token bigint NOT NULL DEFAULT -1);
CREATE TABLE IF NOT EXISTS {prefix}_shipping (
    id int PRIMARY KEY, active int NOT NULL, max_active int NOT NULL, calls int NOT NULL);
"""


@dataclass
class PgStock:
    """Stock levels in PostgreSQL; a write is fenced by the SKU lock's token."""

    pool: Any
    prefix: str

    async def read(self, sku: str) -> int:
        """Read a stock level (one round trip)."""
        level: int = await self.pool.fetchval(
            f"SELECT level FROM {self.prefix}_stock WHERE sku = $1", sku
        )
        return level

    async def write(self, sku: str, level: int, fencing_token: int) -> None:
        """Write a stock level unless a newer holder of the SKU's lock has written."""
        done = await self.pool.fetchval(
            f"UPDATE {self.prefix}_stock SET level = $2, last_token = $3 "
            "WHERE sku = $1 AND last_token < $3 RETURNING 1",
            sku,
            level,
            fencing_token,
        )
        if done is None:
            raise RuntimeError(f"stale fencing token {fencing_token} for {sku}: write refused")


@dataclass
class PgShipping:
    """The downstream API's meter of calls in flight, in PostgreSQL (seen by every process)."""

    pool: Any
    prefix: str
    latency: float = 0.02

    async def ship(self, sku: str, quantity: int) -> None:
        """Book a shipment (slow), counting it in flight meanwhile."""
        table = f"{self.prefix}_shipping"
        await self.pool.execute(
            f"UPDATE {table} SET active = active + 1, max_active = greatest(max_active, active + 1)"
        )
        try:
            await asyncio.sleep(self.latency)
        finally:
            await self.pool.execute(f"UPDATE {table} SET active = active - 1, calls = calls + 1")


@asynccontextmanager
async def _pg(database: str, prefix: str) -> AsyncIterator[Any]:
    import asyncpg

    pool = await asyncpg.create_pool(database, min_size=1, max_size=8)
    try:
        yield pool
    finally:
        await pool.close()


async def _child(args: argparse.Namespace) -> Tally:
    todo = make_orders(args.orders, args.skus, args.seed)[args.worker :: args.processes]
    async with aiolocks.connect(args.url) as backend, _pg(args.database, args.prefix) as pool:
        return await work(
            backend,
            todo,
            PgStock(pool, args.prefix),
            PgShipping(pool, args.prefix),
            run_id=args.prefix,
            workers=args.workers,
        )


async def _setup(database: str, prefix: str, skus: int, stock: int) -> None:
    async with _pg(database, prefix) as pool:
        await pool.execute(_SCHEMA.format(prefix=prefix))
        await pool.executemany(
            f"INSERT INTO {prefix}_stock (sku, level) VALUES ($1, $2)",
            [(f"sku-{n}", stock) for n in range(skus)],
        )
        await pool.execute(f"INSERT INTO {prefix}_shipping VALUES (1, 0, 0, 0)")


async def _results(database: str, prefix: str) -> tuple[dict[str, int], int]:
    async with _pg(database, prefix) as pool:
        rows = await pool.fetch(f"SELECT sku, level FROM {prefix}_stock")
        peak = await pool.fetchval(f"SELECT max_active FROM {prefix}_shipping")
        await pool.execute(f"DROP TABLE {prefix}_stock, {prefix}_shipping")
    return {row["sku"]: row["level"] for row in rows}, peak


def run_processes(
    url: str,
    database: str,
    *,
    processes: int = 3,
    workers: int = 6,
    orders: int = 200,
    skus: int = 4,
    stock: int = 30,
    seed: int = 7,
) -> Report:
    """``processes`` worker processes of ``workers`` tasks each, state in PostgreSQL."""
    if url.startswith("memory:"):
        raise ValueError("memory:// locks only one process: give --url of a lock server")
    if not database:
        raise ValueError("several processes keep the stock in PostgreSQL: give --database")
    prefix = f"worker_pool_{os.urandom(4).hex()}"
    asyncio.run(_setup(database, prefix, skus, stock))
    report = Report(initial={f"sku-{n}": stock for n in range(skus)}, final={})
    children: list[subprocess.Popen[str]] = []
    try:
        common = [
            "--url", url, "--database", database, "--prefix", prefix,
            "--processes", str(processes), "--workers", str(workers),
            "--orders", str(orders), "--skus", str(skus), "--seed", str(seed),
        ]  # fmt: skip
        for n in range(processes):
            command = [sys.executable, os.path.abspath(__file__), "--worker", str(n), *common]
            children.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        for child in children:
            output, _ = child.communicate(timeout=300)
            if child.returncode != 0:
                raise RuntimeError(f"a worker process failed ({child.returncode}): {output}")
            _add(report, Tally(**json.loads(output.strip().splitlines()[-1])))
    finally:
        for child in children:  # on the error path: stop the others before dropping the tables
            if child.poll() is None:
                child.kill()
            child.wait()
        report.final, report.max_concurrent_downstream = asyncio.run(_results(database, prefix))
    return report


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AIOLOCKS_URL", "memory://"))
    parser.add_argument("--database", default=os.environ.get("SHOP_DATABASE_URL", ""))
    parser.add_argument("--processes", type=int, default=1, help="worker processes")
    parser.add_argument("--workers", type=int, default=12, help="tasks per process")
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--skus", type=int, default=4)
    parser.add_argument("--stock", type=int, default=30, help="initial stock per SKU")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # one child process
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        tally = asyncio.run(_child(args))
        print(json.dumps({**tally.__dict__, "sold": dict(tally.sold)}))
        return 0
    if args.processes > 1:
        try:
            report = run_processes(
                args.url, args.database, processes=args.processes, workers=args.workers,
                orders=args.orders, skus=args.skus, stock=args.stock, seed=args.seed,
            )  # fmt: skip
        except ValueError as exc:
            print(exc)
            return 2
    else:
        report = asyncio.run(
            run(args.url, workers=args.workers, orders=args.orders, skus=args.skus,
                stock=args.stock, seed=args.seed)
        )  # fmt: skip
    return _print(report, args)


def _print(report: Report, args: argparse.Namespace) -> int:
    many = args.processes > 1
    where = f"{args.processes} processes of {args.workers}" if many else "one process,"
    print(f"worker pool on {args.url}: {where} workers, {args.orders} orders")
    for sku in sorted(report.initial):
        print(
            f"  {sku}: stock {report.initial[sku]:3d} -> {report.final[sku]:3d}, "
            f"sold {report.sold[sku]:3d}"
        )
    print(
        f"  orders per process (or connection): {report.orders_per_process}, "
        f"rejected (out of stock): {report.rejected}, shipped: {report.shipped}, "
        f"max concurrent downstream calls: {report.max_concurrent_downstream} "
        f"(limit {DOWNSTREAM_LIMIT})"
    )
    ok = (
        not report.oversold
        and report.consistent
        and report.max_concurrent_downstream <= DOWNSTREAM_LIMIT
    )
    print(f"  oversold: {'YES' if report.oversold else 'no'}, consistent: {report.consistent}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
