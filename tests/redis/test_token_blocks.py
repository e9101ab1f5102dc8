"""Token blocks: a process passes its Redis hold of an unfair mutex on to its
own waiting tasks, each with the next fencing token of the block its grant
from Redis reserved, in one script (``pass_on.lua``) that rewrites the
hold's field to name the new holder and its token.

Adversarial cases on a real server: many tasks in several processes
(backends) with random cancellations, the key deleted behind our back while
a passed hold runs, a waiter cancelled after it was passed the hold and
before it ran. Each asserts mutual exclusion, strictly increasing fencing
tokens in the order the holds began, and that nothing is left in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random

import pytest
import redis.asyncio

import aiolocks
from aiolocks.redis._driver import TOKEN_BLOCK

from ..polling import eventually
from .conftest import Alone

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


def _key(prefix: str, name: str) -> str:
    return f"{prefix}{{mutex:{name}}}"


async def _truthy(value: bool) -> bool:
    return value


async def _take(backend: aiolocks.Backend, name: str) -> tuple[aiolocks.Mutex, int]:
    """Acquire the mutex ``name``; the mutex and its fencing token."""
    holder = backend.mutex(name)
    await holder.acquire()
    assert holder.fencing_token is not None
    return holder, holder.fencing_token


async def _take_once(backend: aiolocks.Backend, name: str, tokens: list[int]) -> None:
    """Take the mutex ``name`` once, noting its fencing token."""
    async with backend.mutex(name) as lock:
        assert lock.fencing_token is not None
        tokens.append(lock.fencing_token)


async def _hold_once(
    backend: aiolocks.Backend,
    name: str,
    tokens: list[int],
    outcomes: list[str],
    *,
    stay_at: int,
    inside: asyncio.Event | None = None,
) -> None:
    """Take the mutex ``name`` once, noting its fencing token, then ``held``
    or ``lost``. The ``stay_at``-th holder stays inside (``inside`` set) until
    its hold is lost, or 30 s."""
    try:
        async with backend.mutex(name) as lock:
            assert lock.fencing_token is not None
            tokens.append(lock.fencing_token)
            if len(tokens) == stay_at:
                if inside is not None:
                    inside.set()
                await asyncio.sleep(30)
        outcomes.append("held")
    except aiolocks.LockLostError:
        outcomes.append("lost")


async def _waiting(backend: aiolocks.Backend, n: int) -> None:
    """``n`` waiters in the process."""

    async def check() -> bool:
        return len(backend._driver._queued) == n

    await eventually(check, what=f"{n} waiter(s) in the process")


async def test_a_grant_reserves_a_block_and_passes_use_it(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """The fence counter moves past the block at the grant; tasks of the
    process passed the hold get the next tokens of the block, in order, and
    the next grant from Redis (another process) is larger still."""
    name = "blocks/reserve"
    async with aiolocks.connect(url) as here, aiolocks.connect(url) as there:
        holder, first = await _take(here, name)
        counter = await raw.hget(_key(prefix, name), "#")
        assert counter is not None and int(counter) == first + TOKEN_BLOCK - 1
        tokens: list[int] = []

        tasks = [asyncio.create_task(_take_once(here, name, tokens)) for _ in range(3)]
        await _waiting(here, 3)
        await holder.release()
        await asyncio.gather(*tasks)
        assert tokens == [first + 1, first + 2, first + 3]
        other = there.mutex(name)
        assert await other.acquire(timeout=5)
        assert other.fencing_token is not None and other.fencing_token >= first + TOKEN_BLOCK
        await other.release()


async def test_passes_stop_at_the_end_of_the_block(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """More local hand-offs than a block has tokens: the hold goes back to
    Redis in between (a new grant, a new block), tokens still increase."""
    name = "blocks/end"
    async with aiolocks.connect(url) as here:
        holder = here.mutex(name)
        await holder.acquire()
        alone = Alone()
        tokens = alone.tokens
        n = TOKEN_BLOCK + 4
        tasks = [asyncio.create_task(alone.hold(here.mutex(name))) for _ in range(n)]
        await _waiting(here, n)
        await holder.release()
        await asyncio.gather(*tasks)
        assert len(tokens) == n and tokens == sorted(set(tokens))
        # not all consecutive: some hold came from Redis again
        assert tokens[-1] - tokens[0] > n - 1


async def test_key_deleted_while_a_passed_hold_runs_reaches_that_task(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """The lock's key is deleted while the second task of a local streak
    holds it: that task (not the one the grant came to) gets
    ``LockLostError``; the task after it gets the lock again from Redis."""
    name = "blocks/deleted"
    async with aiolocks.connect(url) as here:
        holder, first = await _take(here, name)
        inside = asyncio.Event()
        outcomes: list[str] = []
        tokens: list[int] = []

        tasks = [
            asyncio.create_task(_hold_once(here, name, tokens, outcomes, stay_at=2, inside=inside))
            for _ in range(3)
        ]
        await _waiting(here, 3)
        await holder.release()
        await inside.wait()
        assert tokens == [first + 1, first + 2]  # passed twice
        await raw.delete(_key(prefix, name))
        async with asyncio.timeout(20):
            await asyncio.gather(*tasks)
        assert sorted(outcomes) == ["held", "held", "lost"]
        assert tokens == sorted(set(tokens)) and len(tokens) == 3


@pytest.mark.parametrize("behind", [0, 1])
async def test_waiter_cancelled_after_it_was_passed_the_hold(
    url: str, raw: redis.asyncio.Redis, prefix: str, behind: int
) -> None:
    """The holder passes its hold to a local waiter and cancels it before it
    runs: the hold goes to the next local waiter (``behind=1``) or back to
    Redis and to another process; never leaked."""
    name = f"blocks/cancel{behind}"
    async with aiolocks.connect(url) as here, aiolocks.connect(url) as there:
        holder = here.mutex(name)
        await holder.acquire()
        got: list[str] = []

        async def local(tag: str) -> None:
            async with here.mutex(name):
                got.append(tag)

        victim = asyncio.create_task(local("victim"))
        await _waiting(here, 1)
        rest = [asyncio.create_task(local(f"local{i}")) for i in range(behind)]
        await _waiting(here, 1 + behind)

        async def remote() -> bool:
            lock = there.mutex(name)
            if not await lock.acquire(timeout=20):
                return False
            await lock.release()
            return True

        remote_task = asyncio.create_task(remote())
        await eventually(
            lambda: _truthy(bool(there._driver._queued)),
            what="the remote waiter queued",
        )
        await holder.release()  # passed to the victim, which has not run yet
        victim.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await victim
        async with asyncio.timeout(20):
            await asyncio.gather(*rest)
            assert await remote_task
        assert got == [f"local{i}" for i in range(behind)]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_many_tasks_in_several_processes_with_cancellations(
    url: str, raw: redis.asyncio.Redis, prefix: str, seed: int
) -> None:
    """Three backends x five tasks take one mutex again and again with short
    bodies while a chaos task cancels random ones at random await points:
    never two inside, tokens strictly increase in the order holds began,
    and nothing is left in Redis."""
    rng = random.Random(seed)
    name = f"blocks/fuzz{seed}"
    # a short lease: the tombstones of cancelled tries lapse sooner
    short = f"{url}&lease_time=0.5"
    async with (
        aiolocks.connect(short) as a,
        aiolocks.connect(short) as b,
        aiolocks.connect(short) as c,
    ):
        inside = 0
        overlaps = 0
        tokens: list[int] = []
        stop = asyncio.Event()

        async def worker(backend: aiolocks.Backend) -> None:
            nonlocal inside, overlaps
            while not stop.is_set():
                try:
                    async with backend.mutex(name) as lock:
                        inside += 1
                        try:
                            overlaps += inside > 1
                            assert lock.fencing_token is not None
                            tokens.append(lock.fencing_token)
                            # long enough for waiters to gather and the hold to be passed on
                            await asyncio.sleep(0.002)
                        finally:
                            inside -= 1
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    # the chaos only pokes at await points: go on
                    task = asyncio.current_task()
                    assert task is not None
                    task.uncancel()

        tasks = [asyncio.create_task(worker(x)) for x in (a, b, c) for _ in range(5)]
        for _ in range(40):
            await asyncio.sleep(rng.random() * 0.006)
            rng.choice(tasks).cancel()
        stop.set()
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)
        assert overlaps == 0
        assert len(tokens) > 20
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
        # some holds were passed on within a process (consecutive tokens)
        assert any(y == x + 1 for x, y in itertools.pairwise(tokens))


@pytest.mark.parametrize("yields", [0, 2, 6])
async def test_key_deleted_around_the_pass_is_reported_once(
    url: str, raw: redis.asyncio.Redis, prefix: str, yields: int
) -> None:
    """The key is deleted while the holder holds it and a task of the
    process waits: either the deletion's event reaches the holder first
    (lost), or the pass finds the field gone (``pass_on.lua`` writes
    nothing, the release goes to ``release.lua``, which finds nothing: the
    holder gets ``LockLostError``). The waiter takes the lock afresh from
    Redis. Either way the loss is reported exactly once and nothing is left."""
    name = f"blocks/race{yields}"
    async with aiolocks.connect(url) as here:
        holder = here.mutex(name)
        outcomes: list[str] = []
        got = asyncio.Event()
        go = asyncio.Event()

        async def first() -> None:
            try:
                async with holder:
                    got.set()
                    await go.wait()
                outcomes.append("held")
            except aiolocks.LockLostError:
                outcomes.append("lost")

        async def second() -> None:
            try:
                async with here.mutex(name):
                    await asyncio.sleep(0.2)
                outcomes.append("held")
            except aiolocks.LockLostError:
                outcomes.append("lost")

        one = asyncio.create_task(first())
        await got.wait()
        two = asyncio.create_task(second())
        for _ in range(yields):
            await asyncio.sleep(0)
        await raw.delete(_key(prefix, name))
        go.set()
        async with asyncio.timeout(20):
            await asyncio.gather(one, two)
        assert sorted(outcomes) == ["held", "lost"]


async def _pubsub_and_reads(raw: redis.asyncio.Redis) -> tuple[int, int]:
    """How many SUBSCRIBE and HGET calls the server has run so far."""
    stats = await raw.info("commandstats")

    def calls(command: str) -> int:
        entry = stats.get(f"cmdstat_{command}")
        return int(entry["calls"]) if entry else 0

    return calls("subscribe"), calls("hget")


async def test_a_fresh_grant_from_redis_is_passed_on_with_no_watch_and_no_read(
    url: str, raw: redis.asyncio.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's release hands the lock to ours, where two tasks
    wait: the first passes it to the second before the key is watched or
    our field read (``LOSS_WATCH_DELAY``, long here so a slow machine stays
    inside it): ``pass_on.lua`` checks the field itself. No SUBSCRIBE and
    no HGET but the script's own reach the server for that first hold."""
    monkeypatch.setattr("aiolocks.redis._driver.LOSS_WATCH_DELAY", 5.0)
    name = "blocks/fresh"
    async with aiolocks.connect(url) as here, aiolocks.connect(url) as there:
        other = there.mutex(name)
        await other.acquire()
        tokens: list[int] = []

        tasks = [asyncio.create_task(_take_once(here, name, tokens)) for _ in range(2)]
        driver = here._driver

        async def queued() -> bool:
            waiting = list(driver._queued.values())
            return len(waiting) == 2 and sum(a.local for a in waiting) == 1

        await eventually(queued, what="one waiter in the queue and one in the process")
        before = await _pubsub_and_reads(raw)
        await other.release()
        async with asyncio.timeout(10):
            await asyncio.gather(*tasks)
        assert len(tokens) == 2 and tokens[1] == tokens[0] + 1  # passed on
        subscribes, reads = await _pubsub_and_reads(raw)
        # (commandstats counts the commands scripts run: pass_on.lua's HGET)
        assert (subscribes, reads) == (before[0], before[1] + 1)


async def test_a_pass_finding_the_field_gone_releases_the_usual_way(
    url: str, raw: redis.asyncio.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key is deleted before the holder's fresh grant is passed on (no
    watch or read yet: ``LOSS_WATCH_DELAY`` is long here): ``pass_on.lua``
    finds the field gone and writes nothing, so the hold is not passed on.
    The holder's release reports the loss (``LockLostError``) and the
    waiter takes the lock afresh from Redis, with a new block. Nothing is
    left in Redis."""
    monkeypatch.setattr("aiolocks.redis._driver.LOSS_WATCH_DELAY", 5.0)
    name = "blocks/fresh-deleted"
    async with aiolocks.connect(url) as here:
        holder, first = await _take(here, name)
        tokens: list[int] = []

        task = asyncio.create_task(_take_once(here, name, tokens))
        await _waiting(here, 1)
        await raw.delete(_key(prefix, name))
        with pytest.raises(aiolocks.LockLostError):
            await holder.release()
        async with asyncio.timeout(10):
            await task
        assert len(tokens) == 1 and tokens[0] > first + TOKEN_BLOCK - 1
        assert await raw.keys(f"{prefix}*") == []


@pytest.mark.parametrize("yields", [0, 1, 2, 3, 5])
async def test_holder_cancelled_while_its_pass_is_on_the_wire(
    url: str, raw: redis.asyncio.Redis, prefix: str, yields: int
) -> None:
    """The holder is cancelled while its release's ``pass_on.lua`` is on the
    wire (or before or after it ran): the engine sends the release again,
    which finds the field as the pass left it and passes it on or releases
    it the usual way. The waiter gets the lock once, another process reads
    it as the holder with its token, and nothing is left in Redis."""
    name = f"blocks/cancel-pass{yields}"
    async with aiolocks.connect(url) as here, aiolocks.connect(url) as there:
        got, go = asyncio.Event(), asyncio.Event()
        views: list[tuple[str, int, list[aiolocks.Participant]]] = []

        async def holder() -> None:
            async with here.mutex(name):
                got.set()
                await go.wait()

        async def waiter() -> None:
            async with here.mutex(name) as lock:
                task = asyncio.current_task()
                assert task is not None and lock.fencing_token is not None
                me = f"{here.client_id}/{task.get_name()}"
                views.append((me, lock.fencing_token, await there.mutex(name).participants()))

        holding = asyncio.create_task(holder())
        await got.wait()
        waiting = asyncio.create_task(waiter())
        await _waiting(here, 1)
        go.set()
        for _ in range(yields):
            await asyncio.sleep(0)
        holding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holding
        async with asyncio.timeout(10):
            await waiting
        ((me, token, seen),) = views
        assert [(p.id, p.fencing_token) for p in seen if p.is_holder] == [(me, token)]
    assert await raw.keys(f"{prefix}*") == []
