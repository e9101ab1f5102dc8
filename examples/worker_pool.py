"""asyncio workers deducting stock under per-SKU locks, with a Semaphore capping a slow API.

::

    python examples/worker_pool.py                      # memory://
    python examples/worker_pool.py --url redis://127.0.0.1:6379/0 --workers 16

Orders for a few SKUs go into a queue. Worker tasks, spread over two
backend connections (as if they ran in two processes), take one order each:

1. ``locks/stock/sku-{sku}`` (a mutex per SKU, so orders for different SKUs
   proceed in parallel) around the read-modify-write of the stock level,
   with an ``await`` in the middle as a database round trip would have;
2. then a lease of ``limits/shipping-api`` (``max_leases=5``) around the
   call to a slow downstream API, which must never see more than 5 calls
   at once, across all workers and connections.

The report checks the invariants: no SKU oversold, stock accounted for,
at most 5 concurrent downstream calls.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections import Counter
from dataclasses import dataclass, field

import aiolocks

#: at most this many concurrent calls to the downstream API
DOWNSTREAM_LIMIT = 5


@dataclass
class Warehouse:
    """Stock levels, read and written with a delay, like rows in a database."""

    stock: dict[str, int]
    latency: float = 0.002

    async def read(self, sku: str) -> int:
        """Read a stock level (one round trip)."""
        await asyncio.sleep(self.latency)
        return self.stock[sku]

    async def write(self, sku: str, level: int) -> None:
        """Write a stock level (one round trip)."""
        await asyncio.sleep(self.latency)
        self.stock[sku] = level


@dataclass
class ShippingApi:
    """A slow downstream service that records how many calls it served at once."""

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
class Report:
    """What the run did, and the invariants to check."""

    initial: dict[str, int]
    final: dict[str, int]
    sold: Counter[str] = field(default_factory=Counter)
    rejected: int = 0
    shipped: int = 0
    max_concurrent_downstream: int = 0

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


async def run(
    url: str = "memory://",
    *,
    workers: int = 12,
    orders: int = 200,
    skus: int = 4,
    stock: int = 30,
    seed: int = 7,
) -> Report:
    """Process ``orders`` random orders with ``workers`` worker tasks; return the report."""
    rng = random.Random(seed)
    run_id = os.urandom(4).hex()  # fresh lock names, so runs on a shared server never meet
    names = [f"sku-{n}" for n in range(skus)]
    warehouse = Warehouse(dict.fromkeys(names, stock))
    shipping = ShippingApi()
    report = Report(initial=dict(warehouse.stock), final={})
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for _ in range(orders):
        queue.put_nowait((rng.choice(names), rng.randint(1, 3)))

    async def worker(backend: aiolocks.Backend) -> None:
        limit = backend.semaphore(f"limits/{run_id}/shipping-api", max_leases=DOWNSTREAM_LIMIT)
        while True:
            try:
                sku, quantity = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            # Always pass a timeout: a stuck holder becomes an error, not a hang.
            async with backend.mutex(f"locks/stock/{run_id}/{sku}").hold(timeout=30):
                level = await warehouse.read(sku)
                if level < quantity:
                    report.rejected += 1
                    continue
                await warehouse.write(sku, level - quantity)
                report.sold[sku] += quantity
            # The slow call happens after the stock lock is released: keep
            # critical sections short, and take the two locks one after the other.
            async with limit.lease(timeout=30):
                await shipping.ship(sku, quantity)
                report.shipped += quantity

    # Two connections: the workers contend through the lock service, as if
    # they ran in two processes (memory:// shares one store per event loop).
    async with (
        aiolocks.connect(url) as first,
        aiolocks.connect(url) as second,
        asyncio.TaskGroup() as group,
    ):
        for n in range(workers):
            group.create_task(worker(first if n % 2 else second), name=f"worker-{n}")
    report.final = dict(warehouse.stock)
    report.max_concurrent_downstream = shipping.max_active
    return report


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AIOLOCKS_URL", "memory://"))
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--orders", type=int, default=200)
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.url, workers=args.workers, orders=args.orders))
    print(f"worker pool on {args.url}: {args.workers} workers, {args.orders} orders")
    for sku in sorted(report.initial):
        print(
            f"  {sku}: stock {report.initial[sku]:3d} -> {report.final[sku]:3d}, "
            f"sold {report.sold[sku]:3d}"
        )
    print(
        f"  rejected (out of stock): {report.rejected}, shipped: {report.shipped}, "
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
