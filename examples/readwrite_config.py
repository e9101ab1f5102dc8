"""Many readers, rare writers: a config item behind a read/write lock.

::

    python examples/readwrite_config.py                 # memory://
    python examples/readwrite_config.py --url redis://127.0.0.1:6379/0

A pricing config is stored as two fields written one after the other (a
version and a checksum of it), with an ``await`` in between, as a config
kept in two keys or rows would be. Readers hold ``rw.read`` (shared) and
check that what they see is consistent; writers hold ``rw.write``
(exclusive) to publish a new version. The readers run on two connections,
as if in two processes.

Checked: no reader ever sees a torn config, readers really overlap (shared),
and a writer never runs next to anybody.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import zlib
from dataclasses import dataclass

import aiolocks


def checksum(version: int) -> int:
    """The checksum stored next to a version."""
    return zlib.crc32(f"pricing-v{version}".encode())


@dataclass
class ConfigStore:
    """Two fields updated one after the other: torn while a write is half done."""

    version: int = 1
    crc: int = checksum(1)
    latency: float = 0.003

    async def read(self) -> tuple[int, int]:
        """Read both fields, with a round trip in between."""
        version = self.version
        await asyncio.sleep(self.latency)
        return version, self.crc

    async def write(self, version: int) -> None:
        """Write both fields, with a round trip in between."""
        self.version = version
        await asyncio.sleep(self.latency)
        self.crc = checksum(version)


@dataclass
class Stats:
    """What the readers and writers observed."""

    reads: int = 0
    writes: int = 0
    torn_reads: int = 0
    readers_inside: int = 0
    writers_inside: int = 0
    max_readers_inside: int = 0
    writer_overlaps: int = 0
    versions_seen: int = 0


async def run(
    url: str = "memory://", *, readers: int = 12, reads_each: int = 15, writes: int = 3
) -> Stats:
    """Run ``readers`` readers and one writer publishing ``writes`` versions."""
    store = ConfigStore()
    stats = Stats()
    seen: set[int] = set()
    name = f"config/{os.urandom(4).hex()}/pricing"

    async def reader(backend: aiolocks.Backend) -> None:
        rw = backend.read_write_lock(name)
        for _ in range(reads_each):
            async with rw.read.hold(timeout=30):
                stats.readers_inside += 1
                stats.max_readers_inside = max(stats.max_readers_inside, stats.readers_inside)
                if stats.writers_inside:
                    stats.writer_overlaps += 1
                version, crc = await store.read()
                stats.readers_inside -= 1
            stats.reads += 1
            seen.add(version)
            if crc != checksum(version):
                stats.torn_reads += 1
            await asyncio.sleep(0.005)  # readers do other work between reads

    async def writer(backend: aiolocks.Backend) -> None:
        rw = backend.read_write_lock(name)
        for _ in range(writes):
            await asyncio.sleep(0.03)  # writes are rare
            async with rw.write.hold(timeout=30) as lock:
                stats.writers_inside += 1
                if stats.readers_inside or stats.writers_inside > 1:
                    stats.writer_overlaps += 1
                await store.write(store.version + 1)
                stats.writers_inside -= 1
                stats.writes += 1
                token = lock.fencing_token
            print(f"  writer published version {store.version} (fencing token {token})")

    async with (
        aiolocks.connect(url) as first,
        aiolocks.connect(url) as second,
        asyncio.TaskGroup() as group,
    ):
        group.create_task(writer(first))
        for n in range(readers):
            group.create_task(reader(first if n % 2 else second))
    stats.versions_seen = len(seen)
    return stats


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AIOLOCKS_URL", "memory://"))
    parser.add_argument("--readers", type=int, default=12)
    args = parser.parse_args(argv)
    print(f"read/write lock on {args.url}: {args.readers} readers, 1 writer")
    stats = asyncio.run(run(args.url, readers=args.readers))
    print(
        f"  reads {stats.reads}, writes {stats.writes}, versions seen {stats.versions_seen}, "
        f"max readers at once {stats.max_readers_inside}"
    )
    print(f"  torn reads: {stats.torn_reads}, writer overlapped someone: {stats.writer_overlaps}")
    ok = stats.torn_reads == 0 and stats.writer_overlaps == 0 and stats.writes > 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
