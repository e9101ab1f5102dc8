"""``backend.close()`` while bodies are still releasing: nothing is left connected.

A body that ends as the close begins sends its release while the driver is
being closed; that release must be waited for, not reopen a connection that
the closed backend then keeps open (seen as an "unclosed Connection"
ResourceWarning in whichever test ran when the garbage collector came by).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

import aiolocks
from aiolocks.testing import RedisServer


def _sockets_to(port: int) -> int:
    """How many TCP sockets of this process are connected to ``port`` on localhost."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01":  # ESTABLISHED
                inodes.add(fields[9])
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            count += 1
    return count


@pytest.mark.asyncio
@pytest.mark.redis
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("holds", [1, 3])
async def test_close_with_running_holds_leaves_no_connection_open(
    redis_server: RedisServer, holds: int
) -> None:
    before = _sockets_to(redis_server.port)
    backend = await aiolocks.connect(redis_server.url)
    locks = [backend.mutex(f"close/{uuid.uuid4().hex}") for _ in range(holds)]
    entered = [asyncio.Event() for _ in locks]

    async def body(lock: aiolocks.Mutex, inside: asyncio.Event) -> None:
        async with lock:
            inside.set()
            await asyncio.sleep(3600)

    tasks = [asyncio.create_task(body(lock, e)) for lock, e in zip(locks, entered, strict=True)]
    for inside in entered:
        await inside.wait()
    assert _sockets_to(redis_server.port) > before
    await backend.close()
    for task in tasks:
        with pytest.raises(aiolocks.LockLostError):
            await task
    assert _sockets_to(redis_server.port) == before
    with pytest.raises(aiolocks.BackendUnavailableError, match="closed"):
        await backend.mutex("close/after").acquire()
