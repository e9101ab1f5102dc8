"""Plain queue joins: a process whose release just handed the lock to another
process's waiter queues its next waiter with ``RPUSHX`` (no script).

Each test uses separate backends as separate processes (each has its own
client uuid and grant channel) on the real server, and checks what the
server executed, what is left in the queue, and who holds the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
import redis.asyncio

import aiolocks
from aiolocks._core.driver import Family
from aiolocks.redis._driver import RedisDriver, lock_keys

from ..polling import eventually
from .conftest import command_calls

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


def _key(prefix: str, name: str) -> str:
    return f"{prefix}{{mutex:{name}}}"


def _driver(backend: aiolocks.Backend) -> RedisDriver:
    driver = backend._driver
    assert isinstance(driver, RedisDriver)
    return driver


def _scripts_sent(backend: aiolocks.Backend) -> list[str]:
    """Record the scripts ``backend`` sends from now on (our own node, wrapped)."""
    node = _driver(backend).node
    real = node.evalsha
    sent: list[str] = []

    async def evalsha(script: str, keys: Any, args: Any) -> Any:
        sent.append(script)
        return await real(script, keys, args)

    node.evalsha = evalsha  # type: ignore[method-assign]
    return sent


async def _queue(raw: redis.asyncio.Redis, prefix: str, name: str, n: int) -> list[str]:
    """Wait for ``n`` entries in the lock's queue; return them."""
    key = f"{_key(prefix, name)}:queue"

    async def check() -> bool:
        return int(await raw.llen(key)) == n

    await eventually(check, what=f"{n} waiter(s) in the queue")
    return [str(e) for e in await raw.lrange(key, 0, -1)]


async def _hold(lock: aiolocks.Mutex, done: list[int]) -> None:
    async with lock:
        assert lock.fencing_token is not None
        done.append(lock.fencing_token)


async def test_a_waiter_after_a_handoff_joins_without_a_script(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """A hands the lock to B (C queued behind): A's next acquire queues with
    RPUSHX and no script, carries its own deadline, shows in participants(),
    and is served after C, with tokens in order."""
    name = "plain/join"
    async with (
        aiolocks.connect(url) as a,
        aiolocks.connect(url) as b,
        aiolocks.connect(url) as c,
    ):
        done: list[int] = []
        # A waits once first, so that its process listens on its grant channel
        warm = asyncio.create_task(_hold_until(b.mutex(name), done, ready := asyncio.Event()))
        await eventually(lambda: done, what="B's first hold", interval=0.001)
        first = a.mutex(name)

        async def let_go() -> None:
            await _queue(raw, prefix, name, 1)
            ready.set()

        letting = asyncio.create_task(let_go())
        await first.acquire()
        await asyncio.gather(warm, letting)
        b_task = asyncio.create_task(_hold_until(b.mutex(name), done, leave := asyncio.Event()))
        await _queue(raw, prefix, name, 1)
        c_task = asyncio.create_task(_hold(c.mutex(name), done))
        await _queue(raw, prefix, name, 2)
        await first.release()  # to B; the queue is [C]
        await _queue(raw, prefix, name, 1)
        before = await command_calls(raw)
        scripts = _scripts_sent(a)
        again = a.mutex(name)
        a_task = asyncio.create_task(_hold(again, done))
        entries = await _queue(raw, prefix, name, 2)
        after = await command_calls(raw)
        assert scripts == []  # (C may look again meanwhile: its first subscription)
        assert after.get("rpushx", 0) - before.get("rpushx", 0) == 1
        now_ms = int((await raw.time())[0]) * 1000
        mine = entries[-1]
        assert mine.startswith(_driver(a).client_uuid)
        deadline = int(mine.rpartition("|")[2])
        assert now_ms < deadline <= now_ms + 6000
        waiting = [p for p in await again.participants() if not p.is_holder]
        assert [p.id.rpartition("/")[2] for p in waiting] == [c_task.get_name(), a_task.get_name()]
        leave.set()
        await asyncio.wait_for(asyncio.gather(b_task, c_task, a_task), 10)
        assert done == sorted(done) and len(done) == 4
        assert await raw.exists(f"{_key(prefix, name)}:queue") == 0


async def _hold_until(
    lock: aiolocks.Mutex,
    done: list[int],
    leave: asyncio.Event,
    entered: asyncio.Event | None = None,
) -> None:
    """Hold ``lock`` (its token into ``done``, ``entered`` set) until ``leave`` is set."""
    async with lock:
        assert lock.fencing_token is not None
        done.append(lock.fencing_token)
        if entered is not None:
            entered.set()
        await leave.wait()


async def test_a_plain_join_that_finds_no_queue_tries_with_the_script(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """A hands the lock to B, its last waiter (the queue is gone): A's next
    acquire finds no queue with RPUSHX, then queues with acquire.lua and gets
    the lock from B. Joins that keep missing stop, but for a look now and then."""
    name = "plain/miss"
    async with aiolocks.connect(url) as a, aiolocks.connect(url) as b:
        done: list[int] = []
        first = a.mutex(name)
        await first.acquire()
        b_task = asyncio.create_task(_hold(b.mutex(name), done))
        await _queue(raw, prefix, name, 1)
        holding = asyncio.Event()
        leave = asyncio.Event()
        # B takes the lock from A, then B again (a second hold): A's next
        # acquire comes while B holds and nobody else waits
        await first.release()
        await b_task
        second = asyncio.create_task(_hold_until(b.mutex(name), done, leave, holding))
        await holding.wait()
        _driver(a).node.handed_at[_key(prefix, name)] = (
            int((await raw.time())[0]) * 1000,
            time.monotonic(),
        )
        before = await command_calls(raw)
        scripts = _scripts_sent(a)
        a_task = asyncio.create_task(_hold(a.mutex(name), done))
        await _queue(raw, prefix, name, 1)
        after = await command_calls(raw)
        assert after.get("rpushx", 0) - before.get("rpushx", 0) == 1
        # (and maybe once more: the first subscription of A's grant channel)
        assert scripts[:1] == ["acquire"]
        leave.set()
        await asyncio.wait_for(asyncio.gather(second, a_task), 10)
        assert done == sorted(done) and len(done) == 3
        odds = _driver(a)._join_odds[_key(prefix, name)]
        assert odds.hits < 1.0
        for _ in range(3):
            odds.note(False)
        assert [odds.worth_it() for _ in range(17)].count(True) == 1


@pytest.mark.parametrize("tombstone", ["live", "lapsed"])
async def test_a_plain_join_cancelled_on_the_wire_is_never_kept(
    url: str,
    raw: redis.asyncio.Redis,
    prefix: str,
    tombstone: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A's RPUSHX reaches Redis only after A gave up and its cleanup ran (it
    left a tombstone). While the tombstone lives, the next release skips
    that entry; once it has lapsed (the entry waited longer), the entry is
    handed the lock and A's process gives that grant straight back. Either
    way C is served, the lock ends free and nothing of A's is left."""
    name = f"plain/late/{tombstone}"
    key = _key(prefix, name)
    if tombstone == "lapsed":
        monkeypatch.setattr("aiolocks.redis._driver.TOMBSTONE_MS", 200)
    async with (
        aiolocks.connect(url) as a,
        aiolocks.connect(url) as b,
        aiolocks.connect(url) as c,
    ):
        done: list[int] = []
        holding = asyncio.Event()
        leave = asyncio.Event()
        b_task = asyncio.create_task(_hold_until(b.mutex(name), done, leave, holding))
        await holding.wait()
        c_task = asyncio.create_task(_hold(c.mutex(name), done))
        await _queue(raw, prefix, name, 1)
        node = _driver(a).node
        node.handed_at[key] = (int((await raw.time())[0]) * 1000, time.monotonic())
        real_join = node.join
        sent: list[str] = []
        late: list[asyncio.Task[int]] = []
        on_the_wire = asyncio.Event()

        async def slow_join(keys: Any, member: str) -> int:
            sent.append(member)
            on_the_wire.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                # the send arrives after the cleanup (another connection)
                late.append(asyncio.create_task(_after(0.2, real_join(keys, member))))
                raise
            raise AssertionError("not cancelled")

        node.join = slow_join  # type: ignore[method-assign]
        a_task = asyncio.create_task(a.mutex(name).acquire())
        await on_the_wire.wait()
        a_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await a_task
        assert await late[0] == 2  # the entry landed behind C's
        field = sent[0].partition("|")[0]
        until = int(await raw.hget(key, f"!{field}") or 0)  # the tombstone's end, server ms
        if tombstone == "lapsed":

            async def lapsed() -> bool:
                return until < await _server_ms(raw)

            await eventually(lapsed, what="the tombstone to lapse")
        assert (until > await _server_ms(raw)) is (tombstone == "live")
        leave.set()
        await asyncio.wait_for(asyncio.gather(b_task, c_task), 10)
        assert len(done) == 2 and done == sorted(done)
        # the lock ends free: well before A's entry's lease (30 s) could lapse
        probe = b.mutex(name)
        assert await probe.acquire(timeout=5)
        await probe.release()
        assert await raw.hget(key, field) is None
        assert await raw.exists(f"{key}:queue") == 0


async def test_a_plain_join_lost_on_the_wire_and_landing_late_is_given_back(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """A's RPUSHX fails on the connection (it may still arrive): A queues with
    acquire.lua, is served and is done. Then the lost RPUSHX lands in the
    queue of a later round, and another process's release hands the lock to
    that stray entry: A's process gives it straight back, the lock ends free."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    name = "plain/lost"
    key = _key(prefix, name)

    async def b_round(b: aiolocks.Backend, b2: aiolocks.Backend) -> tuple[asyncio.Event, Any]:
        """B holds (until the event is set), B2 queued behind it."""
        holding, leave = asyncio.Event(), asyncio.Event()
        b_task = asyncio.create_task(_hold_until(b.mutex(name), done, leave, holding))
        await holding.wait()
        b2_task = asyncio.create_task(_hold(b2.mutex(name), done))
        await _queue(raw, prefix, name, 1)
        return leave, asyncio.gather(b_task, b2_task)

    done: list[int] = []
    async with (
        aiolocks.connect(url) as a,
        aiolocks.connect(url) as b,
        aiolocks.connect(url) as b2,
    ):
        leave, both = await b_round(b, b2)
        node = _driver(a).node
        node.handed_at[key] = (await _server_ms(raw), time.monotonic())
        real_join = node.join
        land = asyncio.Event()
        late: list[asyncio.Task[int]] = []

        async def landing(keys: Any, member: str) -> int:
            await land.wait()
            return await real_join(keys, member)

        async def lost_join(keys: Any, member: str) -> int:
            late.append(asyncio.create_task(landing(keys, member)))
            raise RedisConnectionError("connection lost while sending")

        node.join = lost_join  # type: ignore[method-assign]
        a_task = asyncio.create_task(_hold(a.mutex(name), done))
        await _queue(raw, prefix, name, 2)  # B2's entry, A's from acquire.lua
        leave.set()
        await asyncio.wait_for(asyncio.gather(both, a_task), 10)
        # a later round: the lost RPUSHX lands behind B2
        leave, both = await b_round(b, b2)
        land.set()
        assert await late[0] == 2
        leave.set()
        await asyncio.wait_for(both, 10)
        assert len(done) == 5 and done == sorted(done)
        probe = b.mutex(name)
        assert await probe.acquire(timeout=5)  # (the stray grant: a 30 s lease)
        await probe.release()
        assert await raw.exists(f"{key}:queue") == 0


async def _server_ms(raw: redis.asyncio.Redis) -> int:
    seconds, micros = await raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def _after(delay: float, coro: Any) -> Any:
    await asyncio.sleep(delay)
    return await coro


@pytest.mark.parametrize("deadline", ["past", "absurd"])
async def test_an_entry_whose_own_deadline_cannot_be_trusted_is_skipped(
    url: str, raw: redis.asyncio.Redis, prefix: str, deadline: str
) -> None:
    """A plain-joined entry past its deadline (its process died), or with one
    no client could have reckoned (a clock that jumped), and no score: the
    release drops it and serves the waiter behind it."""
    name = f"plain/dead/{deadline}"
    key = _key(prefix, name)
    async with aiolocks.connect(url) as a, aiolocks.connect(url) as b:
        done: list[int] = []
        holder = a.mutex(name)
        await holder.acquire()
        now_ms = int((await raw.time())[0]) * 1000
        own = now_ms - 1 if deadline == "past" else now_ms + 60_000
        await raw.rpush(f"{key}:queue", f"0ddba11:1|30000|ghost|{own}")
        await raw.pexpire(f"{key}:queue", 5000)
        b_task = asyncio.create_task(_hold(b.mutex(name), done))
        await _queue(raw, prefix, name, 2)
        await holder.release()
        await asyncio.wait_for(b_task, 10)
        assert len(done) == 1
        assert await raw.hget(key, "0ddba11:1") is None
        assert await raw.exists(f"{key}:queue") == 0


async def test_a_handoff_marks_the_releasers_field_and_a_retried_release_frees_nothing(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """The hand-off writes '0' over the releaser's field instead of deleting
    it: a retried release of that field removes nothing and hands nothing
    on; marks never pile up past a handful; the lock ends with no key."""
    name = "plain/marks"
    key = _key(prefix, name)
    async with aiolocks.connect(url) as a, aiolocks.connect(url) as b:
        first = a.mutex(name)
        await first.acquire()
        (field,) = [str(f) for f in await raw.hkeys(key) if f != "#"]
        taken = asyncio.Event()
        leave = asyncio.Event()
        b_task = asyncio.create_task(_hold_until(b.mutex(name), [], leave, taken))
        await _queue(raw, prefix, name, 1)
        await first.release()
        await taken.wait()
        assert await raw.hget(key, field) == "0"
        b_before = {k: v for k, v in (await raw.hgetall(key)).items() if k not in ("#", field)}
        keys = lock_keys(prefix, Family.MUTEX, name)
        assert await _driver(a).node.release(keys, "", [field], 0) == 0
        b_after = {k: v for k, v in (await raw.hgetall(key)).items() if k not in ("#", field)}
        assert b_after == b_before
        leave.set()
        await b_task
        # many hand-offs in a row between two processes: few marks at any time
        marks: list[int] = []

        async def turns(backend: aiolocks.Backend) -> None:
            for _ in range(30):
                async with backend.mutex(name):
                    fields = await raw.hgetall(key)
                    marks.append(sum(1 for v in fields.values() if v == "0"))
                    await asyncio.sleep(0.001)

        await asyncio.wait_for(asyncio.gather(turns(a), turns(b)), 30)
        assert max(marks) <= 8
    assert await raw.exists(key) == 0
