"""A separate process for the Redis tests (run as ``python -m tests.redis._worker``).

``increment URL KEY TASKS ROUNDS``: TASKS tasks each add 1 to a plain Redis key
ROUNDS times, reading and writing it with an await in between, under a mutex.

``hold URL FAMILY NAME``: take the lock (``mutex``, ``lease``) with a 1 s lease,
print ``held`` and sleep until killed.
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio

import aiolocks


async def increment(url: str, key: str, tasks: int, rounds: int) -> None:
    base = url.split("?")[0]
    raw = redis.asyncio.Redis.from_url(base)
    async with aiolocks.connect(url) as backend:
        lock = backend.mutex("increment/counter")

        async def worker() -> None:
            for _ in range(rounds):
                async with lock:
                    value = int(await raw.get(key) or 0)
                    await asyncio.sleep(0)
                    await raw.set(key, value + 1)

        await asyncio.gather(*(worker() for _ in range(tasks)))
    await raw.aclose()


async def hold(url: str, family: str, name: str) -> None:
    async with aiolocks.connect(url, lease_time=1) as backend:
        if family == "mutex":
            await backend.mutex(name).acquire()
        else:
            await backend.semaphore(name, 1).acquire()
        print("held", flush=True)
        await asyncio.sleep(3600)


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "increment":
        asyncio.run(increment(args[0], args[1], int(args[2]), int(args[3])))
    else:
        asyncio.run(hold(args[0], args[1], args[2]))


if __name__ == "__main__":
    main()
