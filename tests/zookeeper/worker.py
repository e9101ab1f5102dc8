"""A worker process for the multi-process tests (run as a script, not collected)."""

from __future__ import annotations

import asyncio
import os
import sys

import aiolocks
from aiolocks.zookeeper import ZooKeeperBackend


async def fifo(url: str, name: str, tasks: int, log_path: str) -> None:
    """Queue ``tasks`` waiters; each appends its fencing token to the log while holding."""
    backend = await aiolocks.connect(url)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def waiter() -> None:
        lock = backend.mutex(name)
        async with lock:
            os.write(fd, f"{lock.fencing_token}\n".encode())

    try:
        await asyncio.gather(*(waiter() for _ in range(tasks)))
    finally:
        os.close(fd)
        await backend.close()


async def counter(url: str, name: str, tasks: int, rounds: int, counter_path: str) -> None:
    """Increment a counter node in ZooKeeper under the lock, with an await in between."""
    backend = await aiolocks.connect(url)
    assert isinstance(backend, ZooKeeperBackend)
    client = backend.client

    async def worker() -> None:
        for _ in range(rounds):
            async with backend.mutex(name):
                data, _stat = await client.get_data(counter_path)
                await asyncio.sleep(0)  # let everyone else run: a race without the lock
                await client.set_data(counter_path, str(int(data) + 1).encode())

    try:
        await asyncio.gather(*(worker() for _ in range(tasks)))
    finally:
        await backend.close()


def main(argv: list[str]) -> None:
    """``worker.py fifo URL NAME TASKS LOG`` or ``worker.py counter URL NAME TASKS ROUNDS PATH``."""
    mode, url, name = argv[1], argv[2], argv[3]
    if mode == "fifo":
        asyncio.run(fifo(url, name, int(argv[4]), argv[5]))
    else:
        asyncio.run(counter(url, name, int(argv[4]), int(argv[5]), argv[6]))


if __name__ == "__main__":
    main(sys.argv)
