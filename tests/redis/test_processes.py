"""Several processes: exact counting under the lock; a killed holder's lease lapses."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import redis.asyncio

import aiolocks

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.redis._worker",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )


async def test_processes_increment_a_plain_key_exactly(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    counter = f"{prefix}counter"
    procs = [await _spawn("increment", url, counter, "5", "10") for _ in range(3)]
    try:
        async with asyncio.timeout(90):
            codes = [await p.wait() for p in procs]
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    assert codes == [0, 0, 0]
    assert int(await raw.get(counter) or 0) == 3 * 5 * 10
    await raw.delete(counter)


@pytest.mark.parametrize("family", ["mutex", "lease"])
async def test_killed_holder_lease_lapses(
    url: str, raw: redis.asyncio.Redis, prefix: str, family: str
) -> None:
    proc = await _spawn("hold", url, family, "crash/x")
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            assert (await proc.stdout.readline()).strip() == b"held"
        async with aiolocks.connect(url) as backend:
            if family == "mutex":
                lock = backend.mutex("crash/x")
                assert await lock.acquire(timeout=0) is False
                proc.kill()
                await proc.wait()
                # nobody publishes for a killed holder: the waiter looks again
                # when the holder's remaining TTL (<= 1 s) has run out
                assert await lock.acquire(timeout=10)
                await lock.release()
            else:
                sem = backend.semaphore("crash/x", 1)
                assert await sem.acquire(timeout=0) is None
                proc.kill()
                await proc.wait()
                lease = await sem.acquire(timeout=10)  # the dead holder's permit comes back
                assert lease is not None
                await lease.release()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
