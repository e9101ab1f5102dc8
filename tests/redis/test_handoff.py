"""Hand-off: a release grants the lock to the queue head directly (``release.lua``).

Adversarial cases: the waiter gives up while the grant is on its way, the
grantee's process is gone, the grant message is lost with the pub/sub
connection. Each asserts that mutual exclusion holds and nothing is left.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio

import aiolocks

from ..polling import eventually
from .conftest import Alone, command_calls, listening_for_grants

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


def _key(prefix: str, name: str) -> str:
    return f"{prefix}{{mutex:{name}}}"


async def _take(lock: aiolocks.Mutex, probe: aiolocks.Backend, name: str) -> int:
    """Acquire, check nobody else can, release; the fencing token held."""
    assert await lock.acquire(timeout=20)
    try:
        token = lock.fencing_token
        assert token is not None
        assert await probe.mutex(name).acquire(timeout=0) is False
        return token
    finally:
        await lock.release()


async def _queued(raw: redis.asyncio.Redis, prefix: str, name: str, n: int) -> None:
    async def check() -> bool:
        return int(await raw.llen(f"{_key(prefix, name)}:queue")) == n

    await eventually(check, what=f"{n} waiter(s) in the queue")


@pytest.mark.parametrize("yields", [0, 1, 3])
@pytest.mark.parametrize("fair", [False, True])
async def test_waiter_cancelled_while_the_grant_is_in_flight_gives_it_back(
    url: str, raw: redis.asyncio.Redis, prefix: str, fair: bool, yields: int
) -> None:
    """The release hands the lock to B; B is cancelled before, while or after the
    message arrives: B's abandon gives the hold back and C gets the lock."""
    name = f"inflight/{int(fair)}{yields}"
    async with (
        aiolocks.connect(url) as one,
        aiolocks.connect(url) as two,
        aiolocks.connect(url) as three,
    ):
        holder = one.mutex(name, fair=fair)
        await holder.acquire()

        async def b() -> None:
            async with two.mutex(name, fair=fair):
                pass

        b_task = asyncio.create_task(b())
        await _queued(raw, prefix, name, 1)
        c_task = asyncio.create_task(_take(three.mutex(name, fair=fair), one, name))
        await _queued(raw, prefix, name, 2)
        await holder.release()  # grants B on the server
        for _ in range(yields):
            await asyncio.sleep(0)
        b_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await b_task
        # B either got in before the cancel (and left) or gave the grant back:
        # C gets the lock, alone
        assert await c_task > 0
        assert await raw.exists(f"{_key(prefix, name)}:queue") == 0


async def test_grant_to_a_dead_process_lapses_and_the_next_waiter_is_served(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """The queue head's process is gone (its entry not timed out yet): the
    release grants it with its own lease, which lapses; then the next one."""
    name = "deadhead/x"
    key = _key(prefix, name)
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
        holder = one.mutex(name)
        await holder.acquire()
        first_token = holder.fencing_token
        assert first_token is not None
        now_ms = int((await raw.time())[0]) * 1000
        ghost = "0ddba11:1|300|ghost"  # a 0.3 s lease, its process gone
        await raw.rpush(f"{key}:queue", ghost)
        await raw.zadd(f"{key}:queue-timeouts", {ghost: now_ms + 5000})
        waiting = asyncio.create_task(_take(two.mutex(name), one, name))
        await _queued(raw, prefix, name, 2)
        await holder.release()  # hands the lock to the ghost
        granted = await raw.hget(key, "0ddba11:1")
        assert isinstance(granted, str) and granted.endswith("|x|ghost"), granted
        assert await waiting > first_token
        assert await raw.hget(key, "0ddba11:1") is None  # the ghost's lease lapsed


async def test_grant_message_lost_with_the_pubsub_connection_is_found(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """The waiter's pub/sub connection dies as the release hands it the lock:
    on resubscribing it looks again and finds the lock is its own."""
    name = "lostgrant/x"
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
        holder = one.mutex(name)
        await holder.acquire()
        waiting = asyncio.create_task(_take(two.mutex(name), one, name))
        await _queued(raw, prefix, name, 1)
        await listening_for_grants(raw, two)
        assert await raw.client_kill_filter(_type="pubsub") >= 1
        await holder.release()
        assert await waiting > 0


async def test_queued_waiters_take_the_lock_without_trying_again(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """Eight waiters in separate backends queued: each release hands the lock on,
    so draining them costs one EVALSHA per release and no acquire script."""
    name = "drain/x"
    waiters = 8
    async with contextlib.AsyncExitStack() as stack:
        backends = [await stack.enter_async_context(aiolocks.connect(url)) for _ in range(9)]
        holder = backends[0].mutex(name)
        await holder.acquire()
        order: list[int] = []
        tokens: list[int] = []
        inside = 0

        async def waiter(i: int) -> None:
            nonlocal inside
            lock = backends[i + 1].mutex(name)
            async with lock:
                inside += 1
                assert inside == 1
                order.append(i)
                assert lock.fencing_token is not None
                tokens.append(lock.fencing_token)
                await asyncio.sleep(0.005)
                inside -= 1

        tasks = []
        for i in range(waiters):
            tasks.append(asyncio.create_task(waiter(i)))
            await _queued(raw, prefix, name, i + 1)
        await listening_for_grants(raw, *backends[1:])
        await raw.config_resetstat()
        await holder.release()
        await asyncio.gather(*tasks)
        calls = await command_calls(raw)
    assert order == list(range(waiters))  # queue order, even unfair
    assert tokens == sorted(tokens) and len(set(tokens)) == waiters
    assert calls["evalsha"] == 1 + waiters, calls


async def test_local_handoff_passes_the_lock_within_the_process_without_a_message(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """A release passes an unfair mutex to a waiter of its own process with
    one script (``pass_on.lua``): no PUBLISH, no try by the waiter; a waiter of
    another process queued before it waits its turn, and gets the lock once
    the process has nobody waiting any more."""
    name = "local/x"
    async with aiolocks.connect(url) as here, aiolocks.connect(url) as there:
        holder = here.mutex(name)
        await holder.acquire()
        first = holder.fencing_token
        remote_got = asyncio.Event()
        done = asyncio.Event()

        async def remote_waiter() -> int:
            async with there.mutex(name) as lock:
                remote_got.set()
                await done.wait()
                assert lock.fencing_token is not None
                return lock.fencing_token

        remote = asyncio.create_task(remote_waiter())
        await _queued(raw, prefix, name, 1)
        alone = Alone()
        tokens = alone.tokens
        locals_ = [asyncio.create_task(alone.hold(here.mutex(name), 0.01)) for _ in range(3)]
        # none of them tries: the lock is their process's, so they wait
        # in the process for it to be passed on
        await _queued_here(here, 3, in_queue=0)
        await _queued(raw, prefix, name, 1)
        await raw.config_resetstat()
        await holder.release()
        await asyncio.gather(*locals_)
        await remote_got.wait()
        calls = await command_calls(raw)
        done.set()
        # the holder's Redis hold was passed on to the three local waiters,
        # one pass_on.lua each, with the next token of the block its grant
        # reserved; the last release went to Redis, which handed the lock
        # to the remote waiter by message: four EVALSHA (each waiter may
        # look once more when its grant channel's subscription is confirmed)
        assert 3 + 1 <= calls["evalsha"] <= 3 + 1 + 3, calls
        assert calls.get("publish") == 1, calls
        assert first is not None and tokens == [first + 1, first + 2, first + 3]
        assert await remote > tokens[-1]
    assert await raw.keys(f"{prefix}*") == []


async def test_local_handoffs_in_a_row_are_bounded(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """Tasks of one process passing the lock among themselves do not starve
    another process's queued waiter: after at most LOCAL_HANDOFFS hand-offs
    in a row the queue head gets its turn."""
    from aiolocks.redis._driver import LOCAL_HANDOFFS

    name = "local/bounded"
    async with aiolocks.connect(url) as here, aiolocks.connect(url) as there:
        holds = 0
        remote_queued = False
        after_queued = 0
        stop = asyncio.Event()

        async def local() -> None:
            nonlocal holds, after_queued
            while not stop.is_set():
                async with here.mutex(name):
                    holds += 1
                    if remote_queued:
                        after_queued += 1
                    await asyncio.sleep(0)

        tasks = [asyncio.create_task(local()) for _ in range(4)]
        await eventually(lambda: _truthy(holds > 5), what="the local tasks to churn")
        driver = there._driver
        real_try = driver.try_once

        async def try_once(attempt: object) -> object:
            nonlocal remote_queued
            grants = await real_try(attempt)
            if grants is None:
                remote_queued = True  # its first try failed: it is queued
            return grants

        driver.try_once = try_once
        assert await there.mutex(name).acquire(timeout=30)
        seen = after_queued
        stop.set()
        await there.mutex(name).release()
        await asyncio.gather(*tasks)
        # Each entry of this process ahead of it in the queue (the one
        # waiting there, and one more whose try to join was on the wire)
        # may get the lock and pass it on LOCAL_HANDOFFS times; then the
        # head is the remote waiter.
        assert seen <= 4 * (LOCAL_HANDOFFS + 1), seen


async def _queued_here(backend: aiolocks.Backend, n: int, in_queue: int | None = None) -> None:
    """``n`` attempts of ``backend`` wait, ``in_queue`` of them (default: all)
    in the lock's queue knowing it (their first try answered), the others
    in the process only."""
    in_queue = n if in_queue is None else in_queue

    async def check() -> bool:
        queued = backend._driver._queued.values()
        there = [a for a in queued if a.args[4] == "q" and not a.local]
        here = [a for a in queued if a.local]
        return len(queued) == n and len(there) == in_queue and len(here) == n - in_queue

    await eventually(check, what=f"{n} local waiter(s) to know they are queued")


async def _truthy(value: bool) -> bool:
    return value


async def test_one_waiter_per_process_in_the_queue_the_others_wait_locally(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """Five tasks of one process wait for a mutex their process holds: none
    tries, all wait in the process and are passed the lock by its releases,
    one ``pass_on.lua`` each."""
    name = "local/only"
    async with aiolocks.connect(url) as here:
        holder = here.mutex(name)
        await holder.acquire()
        inside = 0
        order: list[int] = []

        async def local(i: int) -> None:
            nonlocal inside
            async with here.mutex(name):
                inside += 1
                assert inside == 1
                order.append(i)
                await asyncio.sleep(0)
                inside -= 1

        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(local(i)))
            await _queued_here(here, i + 1, in_queue=0)
        await raw.config_resetstat()
        await holder.release()
        await asyncio.gather(*tasks)
        calls = await command_calls(raw)
        # five releases pass the hold on (one pass_on.lua each), the last
        # one goes to Redis: six EVALSHA; no PUBLISH; the waiters do not try
        assert calls["evalsha"] == 5 + 1, calls
        assert "publish" not in calls, calls
        assert sorted(order) == list(range(5))
    assert await raw.keys(f"{prefix}*") == []


@pytest.mark.parametrize("waiters", [1, 2])
async def test_local_waiter_cancelled_around_a_local_handoff_leaves_nothing(
    url: str, raw: redis.asyncio.Redis, prefix: str, waiters: int
) -> None:
    """The releasing task hands the lock to a local waiter (with
    ``waiters=2``, the newer of two) that is cancelled before, while or
    after the release script runs: the hold is never leaked (another
    process gets the lock) and nothing is left. The waiters ask for another
    lease than the holder's, so the hold cannot be passed on as it is
    (``pass_on.lua``): ``release.lua`` hands it over (see
    ``test_token_blocks.py`` for the pass)."""
    name = f"local/cancel{waiters}"
    async with aiolocks.connect(url) as here, aiolocks.connect(url) as probe:
        for yields in range(8):
            got, go = asyncio.Event(), asyncio.Event()

            async def hold(got: asyncio.Event, go: asyncio.Event) -> None:
                async with here.mutex(name):
                    got.set()
                    await go.wait()

            holder = asyncio.create_task(hold(got, go))
            await got.wait()

            async def wait() -> None:
                lock = here.mutex(name, lease_time=20)
                if await lock.acquire():
                    await lock.release()  # won before the cancel landed

            others = []
            for n in range(1, waiters + 1):
                others.append(asyncio.create_task(wait()))
                # the lock is their process's: they wait in the process
                await _queued_here(here, n, in_queue=0)
            go.set()  # the holder releases, handing the lock to the last waiter
            for _ in range(yields):
                await asyncio.sleep(0)
            others[-1].cancel()
            await holder
            for task in others:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            taken = await probe.mutex(name).acquire(timeout=10)
            assert taken, yields
            await probe.mutex(name).release()
            assert not here._driver._queued
        assert await raw.llen(f"{_key(prefix, name)}:queue") == 0
