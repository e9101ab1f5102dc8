"""``backend.list_locks()`` and ``backend.force_release()`` on every backend, real servers.

What a force-released holder sees differs by backend (documented): memory
at once, Redis at its next lease renewal, ZooKeeper when it releases. Each
test asserts exactly that, and that the waiters get the lock afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid

import pytest

import aiolocks
from aiolocks import LockLostError
from aiolocks.memory import MemoryBackend
from aiolocks.testing import RedisServer, ZooKeeperServer
from aiolocks.zookeeper._admin import unescape
from aiolocks.zookeeper._driver import _escape

CLI = [sys.executable, "-m", "aiolocks"]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def hold_forever(lock: aiolocks.SemaphoreMutex, held: asyncio.Event) -> None:
    async with lock:
        held.set()
        await asyncio.sleep(3600)


async def _list_and_kinds(url: str) -> None:
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


@pytest.mark.asyncio
async def test_bad_input_is_a_value_error_before_io() -> None:
    backend = MemoryBackend("admin-bad")
    with pytest.raises(ValueError, match="unknown lock kind 'bogus'"):
        await backend.force_release("x", "bogus")
    with pytest.raises(aiolocks.InvalidLockNameError):
        await backend.force_release("a//b")
    with pytest.raises(ValueError, match="prefix must be a str"):
        await backend.list_locks(3)  # type: ignore[arg-type]
    assert not backend.closed


@pytest.mark.asyncio
async def test_memory_list_and_kinds() -> None:
    await _list_and_kinds("memory://admin")


@pytest.mark.asyncio
async def test_memory_force_release_cancels_the_holder_at_once() -> None:
    async with aiolocks.connect("memory://admin") as backend:
        name = unique("adm/mem")
        lock = backend.semaphore_mutex(name)
        held = asyncio.Event()
        holder = asyncio.create_task(hold_forever(lock, held))
        await held.wait()
        waiter = backend.semaphore_mutex(name)
        waiting = asyncio.create_task(waiter.acquire(timeout=30))
        await asyncio.sleep(0)
        assert await backend.force_release(name) == 1
        with pytest.raises(LockLostError, match="force-released"):
            await holder
        assert await waiting
        infos = await backend.list_locks(name)
        assert [p.is_holder for p in infos[0].participants] == [True]
        assert waiter.fencing_token is not None
        assert waiter.fencing_token > 1
        await waiter.release()


@pytest.mark.asyncio
@pytest.mark.redis
async def test_redis_list_and_kinds(redis_server: RedisServer) -> None:
    await _list_and_kinds(redis_server.url + "?key_prefix=adm-list:")


@pytest.mark.asyncio
@pytest.mark.redis
async def test_redis_force_release_is_noticed_at_the_next_renewal(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url + "?lease_time=1.5&key_prefix=adm-break:"
    name = unique("adm/redis")
    async with aiolocks.connect(url) as holder_side, aiolocks.connect(url) as admin_side:
        lock = holder_side.semaphore_mutex(name)
        held = asyncio.Event()
        holder = asyncio.create_task(hold_forever(lock, held))
        await held.wait()
        waiter = admin_side.semaphore_mutex(name)
        waiting = asyncio.create_task(waiter.acquire(timeout=30))
        assert await admin_side.force_release(name) == 1
        assert await waiting  # woken through the channel
        with pytest.raises(LockLostError):
            await asyncio.wait_for(holder, 30)  # at its next renewal
        infos = await admin_side.list_locks(name)
        assert len(infos) == 1
        assert [p.is_holder for p in infos[0].participants] == [True]
        assert await admin_side.force_release(name) == 1
        assert await admin_side.force_release(name) == 0
        with contextlib.suppress(LockLostError):  # raises once release() reports loss
            await waiter.release()  # cleanup of a hold that was force-released too


@pytest.mark.asyncio
@pytest.mark.zookeeper
async def test_zookeeper_list_and_kinds(zookeeper_server: ZooKeeperServer) -> None:
    await _list_and_kinds(zookeeper_server.url)


@pytest.mark.asyncio
@pytest.mark.zookeeper
async def test_zookeeper_force_release_cancels_the_former_holder(
    zookeeper_server: ZooKeeperServer,
) -> None:
    url = zookeeper_server.url
    name = unique("adm/zk")
    async with aiolocks.connect(url) as holder_side, aiolocks.connect(url) as admin_side:
        lock = holder_side.semaphore_mutex(name)
        waiter = admin_side.semaphore_mutex(name)
        waiting: asyncio.Task[bool] | None = None
        slept = False
        with pytest.raises(LockLostError, match="already gone"):
            async with lock:
                waiting = asyncio.create_task(waiter.acquire(timeout=30))
                while len((await admin_side.list_locks(name))[0].participants) < 2:
                    await asyncio.sleep(0.02)
                assert await admin_side.force_release(name) == 1
                # the former holder is told at once: a watch on its node
                # cancels this body (the sleep is only a bound for a broken watch)
                await asyncio.sleep(60)
                slept = True
        assert not slept
        assert lock.is_lost
        assert waiting is not None and await waiting  # the waiter moved up at once
        infos = await admin_side.list_locks(name)
        assert [p.is_holder for p in infos[0].participants] == [True]
        await waiter.release()


@pytest.mark.asyncio
@pytest.mark.zookeeper
async def test_zookeeper_escaped_names_round_trip(zookeeper_server: ZooKeeperServer) -> None:
    odd = unique("adm/odd") + "/100%\ue000"
    assert unescape(_escape(odd)) == odd
    async with aiolocks.connect(zookeeper_server.url) as backend:
        lock = backend.semaphore_mutex(odd)
        assert await lock.acquire(timeout=10)
        try:
            infos = await backend.list_locks(odd.rsplit("/", 1)[0])
            assert [(i.kind, i.name) for i in infos] == [("semaphore-mutex", odd)]
        finally:
            await lock.release()


# -- the command line -------------------------------------------------------------


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.redis
def test_cli_list_and_break_against_a_running_aiolocks_run(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url + "?lease_time=2&key_prefix=adm-cli:"
    name = unique("adm/cli")
    holder = subprocess.Popen(
        [*CLI, "run", "--kill-after", "1", url, name, "--", "sleep", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            listed = run("list", "--json", url, "adm/")
            assert listed.returncode == 0, listed.stderr
            names = [lock["name"] for lock in json.loads(listed.stdout)["locks"]]
            if name in names:
                break
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        table = run("list", url, "adm/")
        assert name in table.stdout and "mutex" in table.stdout
        refused = run("break", url, name)
        assert refused.returncode == 64
        assert "--yes" in refused.stderr
        broken = run("break", url, name, "--yes")
        assert broken.returncode == 0, broken.stderr
        assert "1 hold(s) removed" in broken.stdout
        _, err = holder.communicate(timeout=60)
        assert holder.returncode == 76, err
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()


@pytest.mark.zookeeper
def test_cli_break_stops_a_running_aiolocks_run_on_zookeeper(
    zookeeper_server: ZooKeeperServer,
) -> None:
    """The holder is told at once (a watch): its command is stopped, it exits 76."""
    url = zookeeper_server.url
    name = unique("adm/zkcli")
    holder = subprocess.Popen(
        [*CLI, "run", "--kill-after", "1", url, name, "--", "sleep", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            listed = run("list", "--json", url, "adm/")
            assert listed.returncode == 0, listed.stderr
            names = [lock["name"] for lock in json.loads(listed.stdout)["locks"]]
            if name in names:
                break
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        broken = run("break", url, name, "--yes")
        assert broken.returncode == 0, broken.stderr
        # without prompt loss `sleep 300` would run on and this would time out
        _, err = holder.communicate(timeout=60)
        assert holder.returncode == 76, err
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
