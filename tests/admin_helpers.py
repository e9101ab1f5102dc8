"""Setup shared by the ``list_locks()``/``force_release()`` tests of every backend.

``tests/test_admin.py`` (memory, Redis, ZooKeeper, the command line) and
``tests/postgres/test_admin.py`` (both PostgreSQL modes) run the same
scenarios: a listing of every lock kind, and a holder that an admin
force-releases while a waiter queues behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import aiolocks
from aiolocks import LockLostError

CLI = [sys.executable, "-m", "aiolocks"]


def unique(prefix: str) -> str:
    """``prefix`` with a random suffix, so that tests sharing a server never collide."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def hold_forever(lock: aiolocks.SemaphoreMutex, held: asyncio.Event) -> None:
    """Take ``lock``, set ``held``, and keep it until cancelled (or until the hold is lost)."""
    async with lock:
        held.set()
        await asyncio.sleep(3600)


async def list_and_kinds(url: str) -> None:
    """One lock of each kind is listed under its prefix, filtered by kind, gone once released."""
    top = unique("adm")
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
        mutex = one.mutex(f"{top}/jobs/a")
        sem = one.semaphore(f"{top}/jobs/b", max_leases=2)
        rw = one.read_write_lock(f"{top}/other/c")
        assert await mutex.acquire(timeout=10)
        lease = await sem.acquire(timeout=10)
        assert lease is not None
        assert await rw.read.acquire(timeout=10)
        try:
            everything = await two.list_locks(top)
            assert [(i.kind, i.name) for i in everything] == [
                ("mutex", f"{top}/jobs/a"),
                ("semaphore", f"{top}/jobs/b"),
                ("rwlock", f"{top}/other/c"),
            ]
            jobs = await two.list_locks(f"/{top}/jobs/")
            assert [i.name for i in jobs] == [f"{top}/jobs/a", f"{top}/jobs/b"]
            (info,) = [i for i in jobs if i.kind == "mutex"]
            assert len(info.participants) == 1
            assert info.participants[0].is_holder
            assert info.participants[0].fencing_token == mutex.fencing_token
            assert await two.list_locks(f"{top}/nothing") == []
            # a kind filter touches only that kind
            assert await two.force_release(f"{top}/jobs/a", "semaphore") == 0
            assert [i.name for i in await two.list_locks(f"{top}/jobs/a")] == [f"{top}/jobs/a"]
        finally:
            await lease.release()
            await rw.read.release()
            await mutex.release()
        assert await two.list_locks(top) == []


@dataclass
class Standoff:
    """A holder (on ``holder_side``) and a queued waiter (on ``admin_side``) of one lock."""

    name: str
    holder_side: aiolocks.Backend
    admin_side: aiolocks.Backend
    lock: aiolocks.SemaphoreMutex
    holder: asyncio.Task[None]
    waiter: aiolocks.SemaphoreMutex
    waiting: asyncio.Task[bool]

    async def waiter_alone_then_clear(self) -> None:
        """Only the waiter holds now; force-releasing twice removes it, then nothing."""
        (info,) = await self.admin_side.list_locks(self.name)
        assert [p.is_holder for p in info.participants] == [True]
        assert await self.admin_side.force_release(self.name) == 1
        assert await self.admin_side.force_release(self.name) == 0
        with contextlib.suppress(LockLostError):  # raises once release() reports the loss
            await self.waiter.release()


@contextlib.asynccontextmanager
async def standoff(url: str, name: str) -> AsyncIterator[Standoff]:
    """Two backends on ``url``: one holds ``name`` (a task), the other queues for it."""
    async with aiolocks.connect(url) as holder_side, aiolocks.connect(url) as admin_side:
        lock = holder_side.semaphore_mutex(name)
        held = asyncio.Event()
        holder = asyncio.create_task(hold_forever(lock, held))
        await held.wait()
        waiter = admin_side.semaphore_mutex(name)
        waiting = asyncio.create_task(waiter.acquire(timeout=30))
        try:
            yield Standoff(name, holder_side, admin_side, lock, holder, waiter, waiting)
        finally:
            for task in (holder, waiting):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await task


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m aiolocks ARGS...``, output captured."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


@contextlib.contextmanager
def cli_holder(url: str, name: str) -> Iterator[subprocess.Popen[str]]:
    """``aiolocks run`` holding ``name`` around ``sleep 300``, once ``aiolocks list`` shows it.

    The process is killed on the way out if it still runs.
    """
    holder = subprocess.Popen(
        [*CLI, "run", "--kill-after", "1", url, name, "--", "sleep", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            listed = run_cli("list", "--json", url, "adm/")
            assert listed.returncode == 0, listed.stderr
            names = [lock["name"] for lock in json.loads(listed.stdout)["locks"]]
            if name in names:
                break
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline, f"{name} was not listed within 60 s"
            time.sleep(0.05)
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
