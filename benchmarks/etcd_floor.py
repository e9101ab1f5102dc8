"""Uncontended etcd mutex cycles: aiolocks vs aetcd's ``Lock`` vs the bare txn + delete floor.

``python -m benchmarks.etcd_floor [--cycles N] [--endpoint host:port]`` starts
an etcd server of its own (``aiolocks.testing.EtcdServer``) unless an
endpoint is given, and times N sequential acquire + release cycles of one
lock per contender, after a warm-up. Printed: median and p99 per cycle, in
milliseconds, and the requests each cycle makes.

* ``floor``: one transaction that creates the key on the session lease and
  reads the head of the queue, then one compare-and-delete: the fewest round
  trips a fair, lease-bound etcd lock can make (aiolocks's own client).
* ``aiolocks``: ``backend.mutex(name)`` (the floor, plus the engine's
  bookkeeping and the per-hold loss watch).
* ``aetcd``: ``client.lock(name, ttl=30)`` (one key per lock name: not
  fair, no loss notification; it grants a new lease at every acquire and
  leaves it to expire).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator

from ._stats import percentile

__all__ = ["main"]


async def _time(cycle: Callable[[], Awaitable[None]], cycles: int) -> list[float]:
    for _ in range(max(10, cycles // 10)):
        await cycle()
    samples: list[float] = []
    for _ in range(cycles):
        started = time.perf_counter()
        await cycle()
        samples.append(time.perf_counter() - started)
    return samples


async def _floor(endpoint: str, cycles: int) -> list[float]:
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
        queue = b"bench-floor\x00lock\x00"
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
            return await _time(cycle, cycles)
        finally:
            await client.lease_revoke(lease.id)


async def _aiolocks(endpoint: str, cycles: int) -> list[float]:
    import aiolocks

    async with aiolocks.connect(f"etcd://{endpoint}/bench-aiolocks") as backend:
        lock = backend.mutex("lock")

        async def cycle() -> None:
            await lock.acquire()
            await lock.release()

        return await _time(cycle, cycles)


async def _aetcd(endpoint: str, cycles: int) -> list[float]:
    import aetcd

    host, _, port = endpoint.rpartition(":")
    async with aetcd.Client(host=host, port=int(port)) as client:
        lock = client.lock(b"bench-aetcd", ttl=30)

        async def cycle() -> None:
            await lock.acquire()
            await lock.release()

        return await _time(cycle, cycles)


ROWS: dict[str, tuple[Callable[[str, int], Awaitable[list[float]]], str]] = {
    "floor": (_floor, "2 (txn, compare-and-delete)"),
    "aiolocks": (_aiolocks, "2 (txn, compare-and-delete) + watch open/close"),
    "aetcd": (_aetcd, "3 (lease grant, txn, compare-and-delete txn)"),
}


@contextlib.contextmanager
def _server(endpoint: str | None) -> Iterator[str]:
    if endpoint:
        yield endpoint
        return
    from aiolocks.testing import EtcdServer

    with EtcdServer() as server:
        yield server.endpoints[0]


async def _run(endpoint: str, cycles: int) -> None:
    print(f"{'contender':<10} {'median ms':>10} {'p99 ms':>8}  requests per cycle")
    for name, (run, requests) in ROWS.items():
        try:
            samples = await run(endpoint, cycles)
        except ImportError as exc:
            print(f"{name:<10} skipped: {exc}")
            continue
        median = percentile(samples, 50) * 1000
        p99 = percentile(samples, 99) * 1000
        print(f"{name:<10} {median:>10.3f} {p99:>8.3f}  {requests}")


def main() -> None:
    """Parse the command line and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--endpoint", help="host:port of an etcd to use instead of starting one")
    args = parser.parse_args()
    with _server(args.endpoint) as endpoint:
        asyncio.run(_run(endpoint, args.cycles))


if __name__ == "__main__":
    main()
