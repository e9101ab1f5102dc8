"""``backend.list_locks()`` and ``backend.force_release()`` on every backend, real servers.

What a force-released holder sees differs by backend (documented): memory
at once, Redis at its next lease renewal, ZooKeeper when it releases. Each
test asserts exactly that, and that the waiters get the lock afterwards.
"""

from __future__ import annotations

import asyncio

import pytest

import aiolocks
from aiolocks import LockLostError
from aiolocks.memory import MemoryBackend
from aiolocks.testing import RedisServer, ZooKeeperServer
from aiolocks.zookeeper._admin import unescape
from aiolocks.zookeeper._layout import escape as _escape
from tests.admin_helpers import cli_holder, list_and_kinds, run_cli, standoff, unique

from .polling import eventually


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
    await list_and_kinds("memory://admin")


@pytest.mark.asyncio
async def test_memory_force_release_cancels_the_holder_at_once() -> None:
    async with standoff("memory://admin", unique("adm/mem")) as scene:
        await asyncio.sleep(0)
        assert await scene.admin_side.force_release(scene.name) == 1
        with pytest.raises(LockLostError, match="force-released"):
            await scene.holder
        assert await scene.waiting
        infos = await scene.admin_side.list_locks(scene.name)
        assert [p.is_holder for p in infos[0].participants] == [True]
        assert scene.waiter.fencing_token is not None
        assert scene.waiter.fencing_token > 1
        await scene.waiter.release()


@pytest.mark.asyncio
@pytest.mark.redis
async def test_redis_list_and_kinds(redis_server: RedisServer) -> None:
    await list_and_kinds(redis_server.url + "?key_prefix=adm-list:")


@pytest.mark.asyncio
@pytest.mark.redis
async def test_redis_force_release_is_noticed_at_the_next_renewal(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url + "?lease_time=1.5&key_prefix=adm-break:"
    async with standoff(url, unique("adm/redis")) as scene:
        assert await scene.admin_side.force_release(scene.name) == 1
        assert await scene.waiting  # woken through the channel
        with pytest.raises(LockLostError):
            await asyncio.wait_for(scene.holder, 30)  # at its next renewal
        await scene.waiter_alone_then_clear()


@pytest.mark.asyncio
@pytest.mark.zookeeper
async def test_zookeeper_list_and_kinds(zookeeper_server: ZooKeeperServer) -> None:
    await list_and_kinds(zookeeper_server.url)


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

                async def queued() -> bool:
                    return len((await admin_side.list_locks(name))[0].participants) >= 2

                await eventually(queued, what="the waiter in the listing")
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


@pytest.mark.asyncio
@pytest.mark.zookeeper
@pytest.mark.parametrize("layout", ["aiolocks", "curator"])
async def test_zookeeper_semaphore_named_like_its_own_folders_is_listed(
    zookeeper_server: ZooKeeperServer, layout: str
) -> None:
    """``x/leases`` and ``x/locks`` are semaphores of their own, next to ``x``'s folders."""
    top = unique("adm/seg")
    url = f"{zookeeper_server.url}?layout={layout}"
    names = [top, f"{top}/leases", f"{top}/locks", f"{top}/leases/leases"]
    async with aiolocks.connect(url) as backend:
        sems = [backend.semaphore(n, max_leases=2) for n in names]
        leases = [await sem.acquire(timeout=10) for sem in sems]
        try:
            infos = await backend.list_locks(top)
            assert sorted((i.kind, i.name) for i in infos) == sorted(
                ("semaphore", n) for n in names
            )
            assert all(len(i.participants) == 1 for i in infos)
            only = await backend.list_locks(f"{top}/leases/")
            assert sorted(i.name for i in only) == [f"{top}/leases/leases"]
        finally:
            for lease in leases:
                assert lease is not None
                await lease.release()
        assert await backend.list_locks(top) == []


# -- the command line -------------------------------------------------------------


@pytest.mark.redis
def test_cli_list_and_break_against_a_running_aiolocks_run(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url + "?lease_time=2&key_prefix=adm-cli:"
    name = unique("adm/cli")
    with cli_holder(url, name) as holder:
        table = run_cli("list", url, "adm/")
        assert name in table.stdout and "mutex" in table.stdout
        refused = run_cli("break", url, name)
        assert refused.returncode == 64
        assert "--yes" in refused.stderr
        broken = run_cli("break", url, name, "--yes")
        assert broken.returncode == 0, broken.stderr
        assert "1 hold(s) removed" in broken.stdout
        _, err = holder.communicate(timeout=60)
        assert holder.returncode == 76, err


@pytest.mark.zookeeper
def test_cli_break_stops_a_running_aiolocks_run_on_zookeeper(
    zookeeper_server: ZooKeeperServer,
) -> None:
    """The holder is told at once (a watch): its command is stopped, it exits 76."""
    url = zookeeper_server.url
    name = unique("adm/zkcli")
    with cli_holder(url, name) as holder:
        broken = run_cli("break", url, name, "--yes")
        assert broken.returncode == 0, broken.stderr
        # without prompt loss `sleep 300` would run on and this would time out
        _, err = holder.communicate(timeout=60)
        assert holder.returncode == 76, err
