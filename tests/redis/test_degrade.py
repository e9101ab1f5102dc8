"""``on_unavailable="local"`` against a real Redis server stopped mid-run."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

import aiolocks
from aiolocks.prometheus import PrometheusHook
from aiolocks.testing.servers import RedisServer

from ..polling import eventually

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


async def _waits_for_a_hold_here(backend: aiolocks.Backend, tasks: int = 1) -> None:
    """Wait until ``tasks`` acquires of ``backend`` wait for a conflicting hold
    of this process (a server hold before degrading, a degraded one before
    asking the server): the engine parks them until such a hold ends."""
    await eventually(
        lambda: len(backend._engine._release_waiters) == tasks,
        30,
        what=f"{tasks} acquire(s) to wait for a hold of this process",
        interval=0.02,
    )


async def test_default_raise_when_the_server_is_stopped(redis_restartable: RedisServer) -> None:
    # A short lease: the failed attempt's clean-up retries until the lease
    # would have lapsed (30 s by default) before the error reaches the caller.
    url = redis_restartable.url
    async with aiolocks.connect(url, connect_timeout=1, lease_time=2) as backend:
        assert backend.on_unavailable == "raise"
        await asyncio.to_thread(redis_restartable.stop)
        lock = backend.mutex("dg/raise")
        with pytest.raises(aiolocks.BackendUnavailableError):
            await lock.acquire(timeout=5)
        assert not lock.is_owned_by_current_task()
        assert not lock.is_degraded
        await asyncio.to_thread(redis_restartable.start)


async def test_an_error_does_not_wait_for_the_clean_up_to_give_up(
    redis_restartable: RedisServer,
) -> None:
    # With the server down, the failed attempt's clean-up retries until its
    # lease would have lapsed (here 10 minutes); the error reaches the caller
    # at once and the clean-up goes on in the backend's own task until close.
    def cleanups() -> list[asyncio.Task[object]]:
        return [
            t
            for t in asyncio.all_tasks()
            if t.get_name().startswith("aiolocks-abandon:") and not t.done()
        ]

    url = redis_restartable.url
    backend = await aiolocks.connect(url, connect_timeout=1, lease_time=600)
    try:
        await asyncio.to_thread(redis_restartable.stop)
        lock = backend.mutex("dg/error-cleanup")
        async with asyncio.timeout(120):  # a hang guard, far below the lease
            with pytest.raises(aiolocks.BackendUnavailableError):
                await lock.acquire(timeout=2)
        assert len(cleanups()) == 1  # still retrying, but not in the caller
        assert not lock.is_owned_by_current_task()
    finally:
        await backend.close()
        await asyncio.to_thread(redis_restartable.start)
    assert cleanups() == []  # close ended it


async def test_local_fallback_excludes_tasks_of_this_process_and_recovers(
    redis_restartable: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    events: list[aiolocks.LockEvent] = []
    url = redis_restartable.url
    async with aiolocks.connect(url, connect_timeout=1, on_unavailable="local") as backend:
        backend.add_event_hook(events.append)
        backend.add_event_hook(PrometheusHook(registry=registry))
        lock = backend.mutex("dg/local")
        async with lock:  # server up: a real hold
            assert not lock.is_degraded
        await asyncio.to_thread(redis_restartable.stop)

        inside = 0
        overlaps = 0
        degraded_seen: list[bool] = []

        async def worker() -> None:
            nonlocal inside, overlaps
            mine = backend.mutex("dg/local")
            for _ in range(3):
                async with mine:
                    degraded_seen.append(mine.is_degraded)
                    async with mine:  # re-entry of a degraded hold stays degraded
                        assert mine.is_degraded
                    inside += 1
                    overlaps += inside > 1
                    await asyncio.sleep(0.01)
                    inside -= 1

        with caplog.at_level(logging.WARNING, logger="aiolocks"):
            async with asyncio.timeout(60):
                await asyncio.gather(*(worker() for _ in range(4)))
        assert overlaps == 0
        assert degraded_seen and all(degraded_seen)
        assert any("process-local" in r.getMessage() for r in caplog.records)
        assert not backend._holds and not backend._ledgers

        degraded_events = [e for e in events if e.kind == "degraded"]
        assert len(degraded_events) == 12
        assert degraded_events[0].reason == "BackendUnavailableError"
        assert not [e for e in events if e.kind == "failed"]
        released = [e for e in events if e.kind == "released"]
        assert len(released) == 13  # the first (server) hold, then twelve degraded ones
        assert not released[0].degraded and all(e.degraded for e in released[1:])
        count = registry.get_sample_value(
            "aiolocks_degraded_total", {"backend": backend.url, "kind": "mutex"}
        )
        assert count == 12
        holds = registry.get_sample_value(
            "aiolocks_holds", {"backend": backend.url, "kind": "mutex"}
        )
        assert holds == 0

        # the server answers again: new acquires use it
        await asyncio.to_thread(redis_restartable.start)

        async def served_by_the_server() -> bool:
            async with lock:
                return not lock.is_degraded

        await eventually(served_by_the_server, 30, what="a hold from the server", interval=0.2)
        participants = await lock.participants()
        assert participants == []


async def test_degraded_hold_stays_local_and_excludes_server_holds_here(
    redis_restartable: RedisServer,
) -> None:
    url = redis_restartable.url
    async with aiolocks.connect(url, connect_timeout=1, on_unavailable="local") as backend:
        await asyncio.to_thread(redis_restartable.stop)
        lock = backend.mutex("dg/stay")
        await lock.acquire(timeout=10)
        assert lock.is_degraded
        token = lock.fencing_token
        await asyncio.to_thread(redis_restartable.start)
        # the server is back; the degraded hold stays local until released ...
        seen: list[object] = []

        async def server_holder() -> None:
            mine = backend.mutex("dg/stay")
            assert await mine.acquire(timeout=None)
            seen.append(mine.is_degraded)
            seen.append(len(await mine.participants()))
            await mine.release()

        other = asyncio.create_task(server_holder())
        # ... and a task of this process asking the server waits for it
        await _waits_for_a_hold_here(backend)
        assert lock.is_degraded and lock.fencing_token == token
        assert not other.done() and seen == []
        raw = redis.asyncio.Redis.from_url(url, decode_responses=True)
        try:
            # no hold on the server: at most the tombstone ("!<field>") the
            # clean-up of the unanswered first try left, and the fence counter
            fields = await raw.hkeys("aiolocks:{mutex:dg/stay}")
            assert [f for f in fields if not str(f).startswith(("!", "#"))] == [], fields
        finally:
            await raw.aclose()
        await lock.release()
        async with asyncio.timeout(30):
            await other
        # the waiter got a server hold, visible on the server
        assert seen == [False, 1]
        assert not backend._holds


_OTHER_PROCESS = """
import asyncio, sys
import aiolocks

async def main() -> None:
    async with aiolocks.connect(sys.argv[1], connect_timeout=1) as backend:
        lock = backend.mutex("dg/split")
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the test stops the server meanwhile
        print(await lock.acquire(timeout=10), lock.is_degraded, flush=True)
        await lock.release()

asyncio.run(main())
"""


async def test_no_split_brain_promise_two_processes_both_hold(
    redis_restartable: RedisServer,
) -> None:
    """What degradation does not promise: two degraded processes both "hold" one name."""
    url = redis_restartable.url
    async with (
        aiolocks.connect(url + "?on_unavailable=local", connect_timeout=1) as one,
        aiolocks.connect(url, connect_timeout=1, on_unavailable="local") as two,
    ):
        a = one.mutex("dg/split")
        await asyncio.to_thread(redis_restartable.stop)
        assert await a.acquire(timeout=10)
        assert a.is_degraded
        # a second backend of this process shares the fallback store: excluded
        b = two.mutex("dg/split")
        assert await asyncio.create_task(b.acquire(timeout=0.2)) is False
        # another process (connected while the server was up) holds too: no split-brain guard
        await asyncio.to_thread(redis_restartable.start)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _OTHER_PROCESS,
            url + "?on_unavailable=local",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            assert await proc.stdout.readline() == b"ready\n"
            await asyncio.to_thread(redis_restartable.stop)
            out, _ = await proc.communicate(b"go\n")
        assert out.split() == [b"True", b"True"]
        assert a.is_degraded and a.is_owned_by_current_task()
        await a.release()


async def _queued_and_listening(url: str, backend: aiolocks.Backend) -> None:
    """Wait until the server has the waiter of ``backend`` in the queue of
    ``dg/wait`` and its process's grant channel subscribed: it waits there."""
    raw = redis.asyncio.Redis.from_url(url, decode_responses=True)
    channel = backend._driver.grant_channel

    async def waiting() -> bool:
        queued = await raw.llen("aiolocks:{mutex:dg/wait}:queue")
        return bool(queued == 1 and await raw.pubsub_numsub(channel) == [(channel, 1)])

    try:
        await eventually(waiting, 30, what="the waiter to wait in the lock's queue")
    finally:
        await raw.aclose()


async def test_waiter_falls_back_when_the_server_goes_away_mid_wait(
    redis_restartable: RedisServer,
) -> None:
    url = redis_restartable.url
    async with (
        aiolocks.connect(url, lease_time=2, connect_timeout=1) as one,
        aiolocks.connect(url, connect_timeout=1, on_unavailable="local") as two,
    ):
        holder = one.mutex("dg/wait")
        waiter = two.mutex("dg/wait")
        holding = asyncio.Event()
        outcome: list[str] = []

        async def hold() -> None:
            try:
                async with holder:
                    holding.set()
                    await asyncio.sleep(60)
            except aiolocks.LockLostError:
                outcome.append("holder lost")

        async def wait() -> None:
            await holding.wait()
            async with waiter:
                outcome.append(f"waiter degraded={waiter.is_degraded}")

        async with asyncio.timeout(60):
            holder_task = asyncio.create_task(hold())
            waiter_task = asyncio.create_task(wait())
            await holding.wait()
            await _queued_and_listening(url, two)
            assert not waiter_task.done()
            await asyncio.to_thread(redis_restartable.stop)
            await asyncio.gather(holder_task, waiter_task)
        assert sorted(outcome) == ["holder lost", "waiter degraded=True"]
        assert not one._holds and not two._holds


async def test_cancelled_degraded_waiters_leave_nothing_behind(
    redis_restartable: RedisServer,
) -> None:
    url = redis_restartable.url
    async with aiolocks.connect(url, connect_timeout=1, on_unavailable="local") as backend:
        server_hold = backend.mutex("dg/cancel")
        await server_hold.acquire()  # held from the server, before the outage
        await asyncio.to_thread(redis_restartable.stop)

        async def take(hold_for: asyncio.Event | None = None) -> None:
            mine = backend.mutex("dg/cancel")
            async with mine:
                assert mine.is_degraded
                if hold_for is not None:
                    await hold_for.wait()

        # waits for the server hold of this backend (no overlap in the process): cancel it there
        early = asyncio.create_task(take())
        await _waits_for_a_hold_here(backend)
        assert not early.done()
        early.cancel()
        with pytest.raises(asyncio.CancelledError):
            await early
        with pytest.raises(aiolocks.BackendUnavailableError):
            await server_hold.release()  # the server is down: the release says so, hold gone
        assert not server_hold.is_owned_by_current_task()

        # one degraded holder, one task of this process waiting for it: cancel the waiter
        release = asyncio.Event()
        first = asyncio.create_task(take(release))
        await eventually(lambda: backend._holds, 30, what="the degraded hold", interval=0.05)
        queued = asyncio.create_task(take())
        await _waits_for_a_hold_here(backend)
        assert not queued.done()
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        async with asyncio.timeout(30):
            await first
        assert not backend._holds and not backend._ledgers
        fallback = backend._engine._fallback
        assert fallback is not None
        from aiolocks._core.driver import Family

        assert await fallback.participants("dg/cancel", Family.MUTEX) == []
        async with asyncio.timeout(30):
            await take()  # nothing left queued: taken at once
        await asyncio.to_thread(redis_restartable.start)
