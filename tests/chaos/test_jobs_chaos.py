"""Faults under the job recipes: ``once``, ``barrier`` and ``count_down_latch``.

* ``once`` under a partition: the holder's backend reaches the server
  through a :class:`~aiolocks.testing.TcpProxy` that stalls (sockets open,
  no byte moves); another process (a second backend of this process, on its
  own connection) tries the job until it runs. When it does, the holder
  must already have been told (its body cancelled): a job never runs twice
  while its holder is alive and believes it holds it.
* ``once`` across a server restart (PostgreSQL, ZooKeeper, etcd keep their
  data): the holder's record survives, the holder renews it after the
  restart, and nobody else runs the job meanwhile. Redis runs without
  persistence here: a restart loses the record; the holder is told at its
  next renewal (``LockLostError``), not kept in the dark.
* a barrier whose party's session is killed (its proxy cuts and refuses
  every connection) after it counted itself in breaks for the other
  waiting parties. Its link is slow, so its arrival record shows well
  before it counts in: the cut waits for the count, since a party killed
  between the two leaves as if it had not come (nothing breaks).
* a latch keeps its count across a restart on the servers that persist it;
  on Redis without persistence the count is lost (the latch opens).

Every wait is bounded by a generous guard (a hang fails, it is never a
timing assertion).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiolocks
from aiolocks.testing import TcpProxy

from ..conformance.cancelling import store_of
from ..polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

#: how long a run of the job is held after a silent end (the partition's bound)
AT_MOST_FOR = 3.0
#: the hold that must outlast a server restart (renewed every third of it)
RESTART_AT_MOST_FOR = 15.0
#: the doomed barrier party's link: a few round trips between joining and counting in
SLOW_LINK = 0.05
#: a generous bound on any one wait (a hang fails the test; nothing is timed)
GUARD = 120.0

#: per backend, the URL options that make a dead session end within seconds
FAST: dict[str, str] = {
    "redis": "lease_time=2",
    "postgres": "heartbeat=1&sslmode=disable&connect_timeout=5",
    "zookeeper": "session_timeout=4",
    "etcd": "lease_ttl=3",
}
SCHEMES = {"redis": "redis", "postgres": "postgresql", "zookeeper": "zk", "etcd": "etcd"}


def _url(label: str, server: Any, netloc: str | None = None) -> str:
    """The server's URL (through ``netloc`` when given) with the fast-failure options."""
    netloc = netloc or f"{server.host}:{server.port}"
    if label == "postgres":
        base = f"postgresql://{server.user}@{netloc}/{server.database}"
    elif label == "redis":
        base = f"redis://{netloc}/0"
    else:
        base = f"{SCHEMES[label]}://{netloc}"
    return f"{base}?{FAST[label]}"


@contextlib.asynccontextmanager
async def _proxied(label: str, server: Any) -> AsyncIterator[tuple[TcpProxy, aiolocks.Backend]]:
    """A backend whose every connection goes through a proxy of its own."""
    async with TcpProxy(server.host, server.port) as proxy:
        backend = await aiolocks.connect(_url(label, server, proxy.netloc))
        try:
            yield proxy, backend
        finally:
            proxy.heal()
            await asyncio.wait_for(backend.close(), GUARD)


async def _hold(
    backend: aiolocks.Backend, name: str, holding: asyncio.Event, at_most_for: float = AT_MOST_FOR
) -> None:
    """Run the job with a body that never ends by itself."""
    async with backend.once(name, at_most_for=at_most_for, at_least_for=0) as ran:
        assert ran, "the job was free"
        holding.set()
        await asyncio.Event().wait()


async def _until_holding(holding: asyncio.Event, holder: asyncio.Task[None]) -> None:
    """Wait until the holder runs its body (its failure to start is raised)."""
    started = asyncio.ensure_future(holding.wait())
    await asyncio.wait([started, holder], timeout=GUARD, return_when=asyncio.FIRST_COMPLETED)
    started.cancel()
    if holder.done():
        holder.result()
    assert holding.is_set(), "the holder did not start"


def _told(holder: asyncio.Task[None]) -> bool:
    """The holder was told it lost the job: its body was cancelled, or the block ended."""
    return holder.done() or holder.cancelling() > 0


async def _run_when_free(backend: aiolocks.Backend, name: str, holder: asyncio.Task[None]) -> bool:
    """Try the job until it runs; whether the holder had been told by then."""
    while True:
        async with backend.once(name, at_most_for=AT_MOST_FOR, at_least_for=0) as ran:
            if ran:
                return _told(holder)
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("label", ["redis", "postgres", "zookeeper", "etcd"])
@pytest.mark.asyncio
async def test_once_under_a_partition_never_runs_twice(
    label: str, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue(f"{label}_server")
    name = f"chaos/once/{uuid.uuid4().hex[:8]}"
    async with (
        _proxied(label, server) as (proxy, cut_off),
        aiolocks.connect(_url(label, server)) as other,
    ):
        holding = asyncio.Event()
        holder = asyncio.ensure_future(_hold(cut_off, name, holding))
        try:
            await _until_holding(holding, holder)
            proxy.stall()  # the holder's renewals no longer reach the server
            told = await asyncio.wait_for(_run_when_free(other, name, holder), GUARD)
            assert told, "the job ran elsewhere while its holder still believed it held it"
            with pytest.raises((aiolocks.LockLostError, aiolocks.BackendUnavailableError)):
                await asyncio.wait_for(holder, GUARD)
        finally:
            proxy.heal()
            if not holder.done():
                holder.cancel()
                with contextlib.suppress(BaseException):
                    await holder


async def _renewed_after(backend: aiolocks.Backend, key: str, version: int) -> bool:
    record = await store_of(backend).read(key)
    return record is not None and record.version != version


@pytest.mark.parametrize("label", ["postgres", "zookeeper", "etcd"])
@pytest.mark.asyncio
async def test_once_keeps_its_holder_across_a_restart(
    label: str, request: pytest.FixtureRequest
) -> None:
    """The server restarts while the job runs: the record survives, the holder renews it."""
    server = request.getfixturevalue(f"{label}_restartable")
    name = f"chaos/once/{uuid.uuid4().hex[:8]}"
    key = f"once/{name}/lock"
    async with aiolocks.connect(_url(label, server)) as holder_backend:
        holding = asyncio.Event()
        # a restart on a loaded machine may take seconds: the hold outlasts it
        holder = asyncio.ensure_future(_hold(holder_backend, name, holding, RESTART_AT_MOST_FOR))
        try:
            await _until_holding(holding, holder)
            await asyncio.to_thread(server.restart)
            async with aiolocks.connect(_url(label, server)) as other:
                record = None
                while record is None:  # the record is read once the server answers again
                    with contextlib.suppress(aiolocks.BackendUnavailableError):
                        record = await store_of(other).read(key)
                assert not holder.done(), holder
                # two renewals after the restart; the job never ran elsewhere meanwhile
                for _ in range(2):
                    version = record.version
                    ran_elsewhere = False

                    async def renewed(version: int = version) -> bool:
                        nonlocal ran_elsewhere
                        async with other.once(name, at_most_for=AT_MOST_FOR) as ran:
                            ran_elsewhere = ran_elsewhere or ran
                        return await _renewed_after(other, key, version)

                    await eventually(renewed, GUARD, what="a renewal", interval=0.1)
                    assert not ran_elsewhere, "the job ran elsewhere while its holder held it"
                    record = await store_of(other).read(key)
                    assert record is not None
                assert not holder.done(), holder
        finally:
            holder.cancel()
            with contextlib.suppress(BaseException):
                await holder


@pytest.mark.asyncio
async def test_once_on_redis_without_persistence_tells_the_holder_after_a_restart(
    redis_restartable: Any,
) -> None:
    """A restart of a Redis without persistence loses the record: the holder is told."""
    name = f"chaos/once/{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(_url("redis", redis_restartable)) as backend:
        holding = asyncio.Event()
        holder = asyncio.ensure_future(_hold(backend, name, holding))
        try:
            await _until_holding(holding, holder)
            await asyncio.to_thread(redis_restartable.restart)
            with pytest.raises(aiolocks.LockLostError):
                await asyncio.wait_for(holder, GUARD)
        finally:
            holder.cancel()
            with contextlib.suppress(BaseException):
                await holder


async def _counted(backend: aiolocks.Backend, name: str) -> int:
    """How many parties counted themselves in (the ``arrived`` of the barrier's state).

    A party joins its arrival record first and counts itself in after: a party
    whose record is there may not have counted yet, and killed in between it
    leaves as if it had not come (the barrier does not break).
    """
    record = await store_of(backend).read(f"barrier/{name}/state")
    return 0 if record is None else int(json.loads(record.value).get("arrived", 0))


@pytest.mark.parametrize("label", ["redis", "postgres", "zookeeper", "etcd"])
@pytest.mark.asyncio
async def test_a_barrier_breaks_when_a_partys_session_is_killed(
    label: str, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue(f"{label}_server")
    name = f"chaos/barrier/{uuid.uuid4().hex[:8]}"
    async with (
        _proxied(label, server) as (proxy, doomed),
        aiolocks.connect(_url(label, server)) as a,
        aiolocks.connect(_url(label, server)) as b,
    ):
        # A slow link: the doomed party's arrival record is seen well before it
        # counts itself in, the window the waits below must not mistake for counted.
        proxy.delay(SLOW_LINK)
        doomed_wait = asyncio.ensure_future(doomed.barrier(name, parties=4).wait())
        await eventually(lambda: _counted(a, name), GUARD, what="the doomed party counted in")
        waiters = [asyncio.ensure_future(x.barrier(name, parties=4).wait()) for x in (a, b)]
        try:

            async def three() -> bool:
                return await _counted(a, name) == 3

            # counted in, not only arrived: a party killed before it counts breaks nothing
            await eventually(three, GUARD, what="three parties counted in")
            proxy.refuse()
            proxy.cut()  # the doomed party's process is gone, as far as the server knows
            for waiter in waiters:
                with pytest.raises(aiolocks.BrokenBarrierError):
                    await asyncio.wait_for(waiter, GUARD)
        finally:
            # the doomed party's cleanup reaches the server again (not its connect_timeout)
            proxy.heal()
            for task in (doomed_wait, *waiters):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


@pytest.mark.parametrize("label", ["postgres", "zookeeper", "etcd", "redis"])
@pytest.mark.asyncio
async def test_a_latch_across_a_restart(label: str, request: pytest.FixtureRequest) -> None:
    """The count survives a restart where the server persists it; Redis here does not."""
    server = request.getfixturevalue(f"{label}_restartable")
    name = f"chaos/latch/{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(_url(label, server)) as backend:
        latch = backend.count_down_latch(name)
        assert await latch.try_set_count(3)
        await latch.count_down()
        await asyncio.to_thread(server.restart)
        count = None
        while count is None:  # read once the server answers again
            with contextlib.suppress(aiolocks.BackendUnavailableError):
                count = await latch.get_count()
        if label == "redis":
            assert count == 0, "a Redis without persistence lost the count: the latch opened"
            return
        assert count == 2
        assert not await latch.wait(timeout=0)
        await latch.count_down()
        await latch.count_down()
        assert await asyncio.wait_for(latch.wait(), GUARD)
