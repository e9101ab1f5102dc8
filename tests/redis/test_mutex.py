"""The Redis mutex path end to end: cost, waiting, watchdog, loss, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest
import redis.asyncio

import aiolocks
from aiolocks.redis import RedisBackend
from aiolocks.testing.servers import RedisServer

from ..polling import eventually
from .conftest import command_calls, listening_for_grants, renewed_past_expiry

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]


# commands only a client (never our scripts) would send
CLIENT_SIDE = {"eval", "script|load", "subscribe", "unsubscribe", "ping", "hello", "wait"}


def holders_key(prefix: str, name: str, family: str = "mutex") -> str:
    return f"{prefix}{{{family}:{name}}}"


async def hold_fields(raw: redis.asyncio.Redis, key: str) -> list[str]:
    """The holds' fields of a lock's hash: not the fence counter ('#') nor tombstones ('!...')."""
    fields = [f.decode() if isinstance(f, bytes) else f for f in await raw.hkeys(key)]
    return [f for f in fields if f != "#" and not f.startswith("!")]


async def test_uncontended_acquire_release_costs_two_commands(
    redis_restartable: RedisServer,
) -> None:
    raw = redis.asyncio.Redis.from_url(redis_restartable.url)
    try:
        async with aiolocks.connect(redis_restartable.url) as backend:
            lock = backend.mutex("cost/one")
            async with lock:  # warm-up: connections made, scripts loaded at open()
                pass
            await raw.config_resetstat()
            for _ in range(5):
                async with lock, lock:  # re-entry touches no network
                    pass
            calls = await command_calls(raw)
        # commandstats also counts the commands the scripts run inside; the
        # client sent exactly one EVALSHA per acquire and per release.
        assert calls["evalsha"] == 10, calls
        assert not CLIENT_SIDE & calls.keys(), calls
        assert await raw.keys("*") == []
    finally:
        await raw.aclose()


async def test_handoff_wakes_waiter_by_pubsub_without_polling(
    redis_restartable: RedisServer,
) -> None:
    raw = redis.asyncio.Redis.from_url(redis_restartable.url)
    try:
        async with (
            aiolocks.connect(redis_restartable.url) as one,
            aiolocks.connect(redis_restartable.url) as two,
        ):
            lock_a, lock_b = one.mutex("handoff/x"), two.mutex("handoff/x")
            await lock_a.acquire()
            got = asyncio.Event()
            acquired_at = 0.0

            async def waiter() -> None:
                nonlocal acquired_at
                async with lock_b:
                    acquired_at = time.monotonic()
                    got.set()

            task = asyncio.create_task(waiter())

            async def subscribed() -> bool:
                # the waiter's process listens for hand-offs on its own channel
                return len(await raw.pubsub_channels("aiolocks:grant:*")) == 1

            await eventually(subscribed, what="the waiter to subscribe")
            await listening_for_grants(raw, two)  # settled: queued, its process listening
            await raw.config_resetstat()
            # the passage of time is the point: a polling waiter would show up in the stats now
            await asyncio.sleep(1.0)
            assert not got.is_set()
            assert "evalsha" not in await command_calls(raw)
            await raw.config_resetstat()
            released_at = time.monotonic()
            await lock_a.release()
            await got.wait()
            await task
            calls = await command_calls(raw)
        # one EVALSHA to release (it hands the lock to the queued waiter and
        # publishes that), none for the waiter (it does not try again), one
        # for the waiter's own release. At most one SUBSCRIBE: the lock's
        # keyspace events, listened to while it holds (a waiting process does
        # not), and only from 50 ms after the grant on, so a short hold
        # subscribes to nothing.
        assert calls.get("evalsha") == 2, calls
        assert calls.get("subscribe", 0) <= 1, calls
        assert not {"unsubscribe", "eval", "ping"} & calls.keys(), calls
        assert acquired_at - released_at < 0.5  # woken by the message, not by a timer
        logging.getLogger(__name__).info("handoff took %.2f ms", (acquired_at - released_at) * 1e3)
    finally:
        await raw.aclose()


async def test_watchdog_keeps_a_short_lease_held(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    async with aiolocks.connect(url, lease_time=1) as backend, aiolocks.connect(url) as other:
        lock = backend.mutex("wd/keep")
        async with lock:
            for _ in range(5):
                # the hold outlives the expiry it had, five times over
                await renewed_past_expiry(raw, holders_key(prefix, "wd/keep"), 1)
                assert await other.mutex("wd/keep").acquire(timeout=0) is False
                ttl = await raw.pttl(holders_key(prefix, "wd/keep"))
                assert 0 < ttl <= 1000
            assert not lock.is_lost


async def test_lease_lapses_when_watchdog_disabled_and_hold_is_lost(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as other:
        lock = backend.mutex("wd/off", lease_time=0.3, watchdog=False)
        with pytest.raises(aiolocks.LockLostError):
            async with lock:
                await asyncio.sleep(5)
        # the lapsed lease is free again for anybody
        assert await other.mutex("wd/off").acquire(timeout=0)
        await other.mutex("wd/off").release()


@pytest.mark.parametrize("tamper", ["delete", "overwrite", "steal"])
async def test_key_tampered_behind_our_back_loses_the_hold(
    url: str, raw: redis.asyncio.Redis, prefix: str, tamper: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = holders_key(prefix, "tamper/x")
    async with aiolocks.connect(url, lease_time=0.6) as backend:
        lock = backend.mutex("tamper/x")
        body_cancelled = False
        with pytest.raises(aiolocks.LockLostError):
            async with lock:
                assert await raw.exists(key) == 1
                try:
                    # the keyspace event may cancel the body before the sleep
                    if tamper == "delete":
                        await raw.delete(key)
                    elif tamper == "overwrite":
                        await raw.set(key, "somebody else", px=2000)
                    else:
                        field = next(iter(await hold_fields(raw, key)))
                        await raw.hdel(key, field)
                        await raw.hset(key, "intruder:1", "9999999999999|1|x|intruder")
                    await asyncio.sleep(5)  # one renewal is 0.2 s away
                except asyncio.CancelledError:
                    body_cancelled = True
                    raise
        assert body_cancelled
        assert any(
            r.levelno >= logging.WARNING and "lost its hold" in r.getMessage()
            for r in caplog.records
        )
        await raw.delete(key)


async def test_backend_on_existing_client_does_not_close_it(
    redis_server: RedisServer, prefix: str, raw: redis.asyncio.Redis
) -> None:
    # decode_responses=True: the driver copes with str replies as well as bytes
    client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        backend = RedisBackend(client, key_prefix=prefix, lease_time=5)
        async with backend, backend.mutex("client/x") as lock:
            assert lock.fencing_token is not None
            assert await raw.exists(holders_key(prefix, "client/x")) == 1
            parts = await lock.participants()
            assert [p.fencing_token for p in parts] == [lock.fencing_token]
        assert await client.ping() is True  # still usable
    finally:
        await client.aclose()


async def test_fencing_tokens_increase_and_no_fence_key_outlives_the_lock(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    async with aiolocks.connect(url) as backend:
        rw = backend.read_write_lock("fence/rw")
        tokens: list[int] = []
        for _ in range(20):
            async with backend.mutex("fence/m") as m:
                assert m.fencing_token is not None
                tokens.append(m.fencing_token)
        async with rw.write:
            tokens_rw = [rw.write.fencing_token]
        async with rw.read:
            tokens_rw.append(rw.read.fencing_token)
        assert tokens == sorted(set(tokens))
        assert tokens_rw[0] is not None and tokens_rw[1] is not None
        assert tokens_rw[0] < tokens_rw[1]
    # raw fixture asserts no key (fence counters included) is left


async def test_cancellation_at_every_point_leaves_nothing(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    key = holders_key(prefix, "cancel/x")
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as other:
        holder = other.mutex("cancel/x")
        lock = backend.mutex("cancel/x")
        for contended in (False, True):
            if contended:
                await holder.acquire()
            for steps in range(0, 40):

                async def attempt() -> None:
                    if await lock.acquire():
                        await lock.release()  # won before the cancel landed

                task = asyncio.create_task(attempt())
                for _ in range(steps):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                fields = await hold_fields(raw, key)
                # no waiter queue entry outlives a cancelled attempt
                assert await raw.llen(f"{key}:queue") == 0, steps
                assert await raw.zcard(f"{key}:queue-timeouts") == 0, steps
                if contended:
                    assert len(fields) == 1, fields  # only the holder's field
                else:
                    assert fields == [], (steps, fields)
                assert not lock.is_owned_by_current_task()
            if contended:
                await holder.release()
        # cancel while waiting on pub/sub, with a real wait in between
        await holder.acquire()
        waiting = asyncio.create_task(lock.acquire())
        await listening_for_grants(raw, backend)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await raw.llen(f"{key}:queue") == 0  # it left the queue
        await holder.release()
        # no hold; the hash lapses with the tombstones cancelled scripts left
        assert await hold_fields(raw, key) == []
        await eventually(lambda: _gone(raw, key), what="the tombstones to lapse")


async def test_cancelled_fair_waiter_leaves_the_queue_and_fifo_order_holds(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    async with aiolocks.connect(url) as backend:
        holder = backend.mutex("fair/q", fair=True)
        await holder.acquire()
        order: list[int] = []

        async def waiter(i: int) -> None:
            async with backend.mutex("fair/q", fair=True):
                order.append(i)

        tasks = []
        for i in range(4):
            tasks.append(asyncio.create_task(waiter(i)))

            async def queued(n: int = i + 2) -> bool:
                return len(await holder.participants()) >= n

            await eventually(queued, what=f"waiter {i} to queue")
        parts = await holder.participants()
        assert [p.is_holder for p in parts] == [True, False, False, False, False]
        tasks[1].cancel()  # leaves the queue
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
        assert len(await holder.participants()) == 4
        await holder.release()
        await asyncio.gather(tasks[0], tasks[2], tasks[3])
        assert order == [0, 2, 3]
        assert await raw.exists(holders_key(prefix, "fair/q") + ":queue") == 0


async def test_dead_fair_waiter_does_not_block_the_queue(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    key = holders_key(prefix, "fair/dead")
    async with aiolocks.connect(url, lease_time=0.6) as backend:
        # A waiter that crashed: its queue entry is there but nobody refreshes it.
        now_ms = int((await raw.time())[0]) * 1000
        await raw.rpush(f"{key}:queue", "dead:1|ghost")
        await raw.zadd(f"{key}:queue-timeouts", {"dead:1|ghost": now_ms + 500})
        lock = backend.mutex("fair/dead", fair=True)
        assert await lock.acquire(timeout=5)
        await lock.release()


async def test_many_tasks_race_mutual_exclusion(url: str) -> None:
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
        inside = 0
        peak = 0
        done = 0

        async def worker(backend: aiolocks.Backend, i: int) -> None:
            nonlocal inside, peak, done
            lock = backend.mutex("race/x", fair=i % 2 == 0)
            for _ in range(5):
                async with lock:
                    inside += 1
                    peak = max(peak, inside)
                    await asyncio.sleep(0)
                    inside -= 1
                    done += 1

        await asyncio.gather(*(worker(one if i % 2 else two, i) for i in range(10)))
        assert peak == 1
        assert done == 50


async def test_owner_task_ending_while_holding_frees_the_lock(
    url: str, raw: redis.asyncio.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = holders_key(prefix, "orphan/x")
    async with aiolocks.connect(url, lease_time=1) as backend:
        lock = backend.mutex("orphan/x")

        async def forgetful() -> None:
            await lock.acquire()  # and never released

        await asyncio.create_task(forgetful())

        async def gone() -> bool:
            return await raw.exists(key) == 0

        await eventually(gone, timeout=3, what="the orphaned hold to end")  # <= one lease
        assert any("ended while holding" in r.getMessage() for r in caplog.records)
        assert await lock.acquire(timeout=0)
        await lock.release()


async def test_acquire_script_resent_returns_the_same_grant(
    raw: redis.asyncio.Redis, prefix: str
) -> None:
    """A resend after a lost reply must not take a second hold."""
    from aiolocks.redis._scripts import source

    key = holders_key(prefix, "resend/x")
    keys = [key, f"{key}:queue", f"{key}:queue-timeouts"]
    args: list[str | int] = ["l", 2, 1000, "me", "0", 1000, "", "", "c:1", "c:2"]
    script = raw.register_script(source("acquire"))
    first = await script(keys=keys, args=args)
    again = await script(keys=keys, args=args)
    assert first == again and first[0] == 1 and len(first) == 3
    # two holds and the fence counter (field '#')
    assert sorted(await raw.hkeys(key)) == ["#", "c:1", "c:2"]
    assert await raw.hget(key, "#") == first[2]
    # the semaphore of 2 is full: a third lease is refused with a wait bound
    other = await script(keys=keys, args=["l", 2, 1000, "you", "0", 1000, "", "", "d:1"])
    assert other[0] == 0 and 0 < other[1] <= 1000
    release = raw.register_script(source("release"))
    assert await release(keys=keys, args=[key, "", 0, "", "c:1", "c:2"]) == 2
    assert await release(keys=keys, args=[key, "", 0, "", "c:1", "c:2"]) == 0  # idempotent


async def test_cleanup_that_overtakes_its_acquire_script_leaves_a_tombstone(
    raw: redis.asyncio.Redis, prefix: str
) -> None:
    """An acquire given up mid-flight is cleaned up from another connection;
    if that cleanup reaches Redis first, the late script must not grant."""
    from aiolocks.redis._scripts import source

    key = holders_key(prefix, "tomb/x")
    keys = [key, f"{key}:queue", f"{key}:queue-timeouts"]
    acquire = raw.register_script(source("acquire"))
    release = raw.register_script(source("release"))
    # the cleanup arrives first: nothing to delete, so it leaves a tombstone
    # (a '!<field>' field of the holders hash, which lapses with it)
    assert await release(keys=keys, args=[key, "", 1500, "", "late:1"]) == 0
    assert await raw.hkeys(key) == ["!late:1"]
    assert 0 < await raw.pttl(key) <= 1500
    # the late script grants nothing and writes nothing, queued or not
    for queue in ("0", "Q"):
        member = "" if queue == "0" else "late:1|5000|me"
        args: list[str | int] = ["x", 1, 5000, "me", queue, 5000, "", member, "late:1"]
        late = await acquire(keys=keys, args=args)
        assert late == [0, -1]
        assert await raw.hkeys(key) == ["!late:1"]
        assert not await raw.exists(f"{key}:queue", f"{key}:queue-timeouts")
    # anybody else's attempt is unaffected, and its lease does not cut the
    # tombstone short
    other = await acquire(keys=keys, args=["x", 1, 100, "you", "0", 5000, "", "", "other:1"])
    assert other[0] == 1
    assert await raw.pttl(key) > 100
    args2: list[str | int] = ["x", 1, 5000, "me", "Q", 5000, "", "late:1|5000|me", "late:1"]
    late = await acquire(keys=keys, args=args2)
    assert late == [0, -1]
    assert not await raw.exists(f"{key}:queue", f"{key}:queue-timeouts")
    assert await release(keys=keys, args=[key, "", 0, "", "other:1"]) == 1
    assert sorted(await raw.hkeys(key)) == ["!late:1", "#"]
    # and the tombstone lapses by itself, with the lock's hash
    await eventually(lambda: _gone(raw, key), what="the tombstone to lapse")


async def test_fence_counter_ahead_of_server_time_survives_the_idle_lock(
    raw: redis.asyncio.Redis, prefix: str
) -> None:
    """Tokens minted faster than one per microsecond run ahead of server time:
    the idle lock's hash keeps the counter until time catches up, so the next
    token is still larger; then the hash goes."""
    from aiolocks.redis._scripts import source

    key = holders_key(prefix, "fence/ahead")
    keys = [key, f"{key}:queue", f"{key}:queue-timeouts"]
    acquire = raw.register_script(source("acquire"))
    release = raw.register_script(source("release"))
    fields = [f"c:{i}" for i in range(3000)]
    first = await acquire(keys=keys, args=["l", 5000, 60000, "me", "0", 5000, "", "", *fields])
    tokens = [int(t) for t in first[1:]]
    assert first[0] == 1 and tokens == list(range(tokens[0], tokens[0] + 3000))
    assert await release(keys=keys, args=[key, "", 0, "", *fields]) == 3000
    again = await acquire(keys=keys, args=["x", 1, 60000, "me", "0", 5000, "", "", "d:1"])
    assert again[0] == 1 and int(again[1]) > tokens[-1]
    assert await release(keys=keys, args=[key, "", 0, "", "d:1"]) == 1
    await eventually(lambda: _gone(raw, key), what="the idle lock's hash to go")


async def _gone(raw: redis.asyncio.Redis, key: str) -> bool:
    return not await raw.exists(key)


async def test_renewal_after_unlock_cannot_resurrect_the_lease(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """Redisson #7272: a renewal that reaches Redis after the unlock is a no-op."""
    from aiolocks.redis._scripts import source

    key = holders_key(prefix, "resurrect/x")
    renew = raw.register_script(source("renew"))
    # The watchdog's renewal script is sent by hand, so that one is in flight as
    # every release goes out (a 60 ms lease raced them by chance, and lapsed
    # whenever a loaded machine stalled the loop); either order must end with
    # no hold, and a renewal that comes after the unlock must not bring it back.
    async with aiolocks.connect(url, lease_time=5) as backend:
        lock = backend.mutex("resurrect/x")
        for _ in range(30):
            async with lock:
                field = next(iter(await hold_fields(raw, key)))
                racing = asyncio.ensure_future(renew(keys=[key], args=[60, field]))
                await asyncio.sleep(0)  # the renewal is sent; the release follows it
            assert await racing in (0, 1)
            assert await renew(keys=[key], args=[60, field]) == 0
            assert await raw.exists(key) == 0


async def test_unlock_wakes_one_local_waiter_not_the_herd(
    redis_restartable: RedisServer,
) -> None:
    url = redis_restartable.url
    raw = redis.asyncio.Redis.from_url(url)
    try:
        async with aiolocks.connect(url) as one, aiolocks.connect(url) as many:
            holder = one.mutex("herd/x")
            await holder.acquire()
            order: list[int] = []

            async def waiter(i: int) -> None:
                async with many.mutex("herd/x"):
                    order.append(i)

            tasks = [asyncio.create_task(waiter(i)) for i in range(10)]

            async def all_waiting() -> bool:
                # one waiter in the lock's queue (its try answered), nine
                # waiting in the process
                queued = many._driver._queued.values()
                return (
                    len(queued) == 10
                    and sum(not a.local and a.args[4] == "q" for a in queued) == 1
                    and sum(a.local for a in queued) == 9
                )

            await eventually(all_waiting, what="every waiter to wait")
            await listening_for_grants(raw, many)
            await raw.config_resetstat()
            await holder.release()
            await asyncio.gather(*tasks)
            calls = await command_calls(raw)
        assert sorted(order) == list(range(10))
        # 1 release handing the lock to the queued waiter, then each release
        # hands it to the next waiter of the process: no try at all (a few
        # allowed for pub/sub confirmations). Waking every local waiter on
        # every unlock would cost ~55 tries more.
        assert calls["evalsha"] <= 1 + 10 + 3, calls
    finally:
        await raw.aclose()


@pytest.mark.parametrize("fair", [False, True])
async def test_release_wakes_only_the_queue_head_across_processes(
    redis_restartable: RedisServer, fair: bool
) -> None:
    """One waiter per backend (its own connection and pub/sub, as a separate
    process has): a release wakes the queue head only, never every process."""
    url = redis_restartable.url
    waiters = 8
    raw = redis.asyncio.Redis.from_url(url)
    try:
        async with contextlib.AsyncExitStack() as stack:
            holder_backend = await stack.enter_async_context(aiolocks.connect(url))
            backends = [
                await stack.enter_async_context(aiolocks.connect(url)) for _ in range(waiters)
            ]
            holder = holder_backend.mutex("herd/procs", fair=fair)
            await holder.acquire()
            inside = 0
            most = 0

            async def waiter(backend: aiolocks.Backend) -> None:
                nonlocal inside, most
                async with backend.mutex("herd/procs", fair=fair):
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0.01)
                    inside -= 1

            tasks = [asyncio.create_task(waiter(b)) for b in backends]

            async def all_queued() -> bool:
                # the holder's acquire, two tries per waiter (the one that
                # queues it, and one when its process's grant channel is
                # first confirmed), and every waiter in the queue
                tries = (await command_calls(raw)).get("evalsha", 0)
                queued = int(await raw.llen("aiolocks:{mutex:herd/procs}:queue"))
                return tries >= 1 + 2 * waiters and queued == waiters

            await eventually(all_queued, what="every waiter to queue up")
            await raw.config_resetstat()
            await holder.release()
            await asyncio.gather(*tasks)
            calls = await command_calls(raw)
        assert most == 1
        # 1 release, then per waiter its release (each release hands the lock
        # to the next waiter: no winning try). Waking every process on every
        # release would cost W*(W-1)/2 = 28 tries more.
        assert calls["evalsha"] <= 1 + 2 * waiters + 3, calls
        assert calls["evalsha"] == 1 + waiters, calls
        assert await raw.exists("aiolocks:{mutex:herd/procs}:queue") == 0
    finally:
        await raw.aclose()


async def test_dead_waiter_at_the_queue_head_does_not_hold_up_the_next(
    url: str, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """The head of the waiter queue died with the wake-up of a release: the next
    waiter still gets the lock once the dead entry times out."""
    key = holders_key(prefix, "queue/dead")
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
        holder, lock = one.mutex("queue/dead"), two.mutex("queue/dead")
        await holder.acquire()
        now_ms = int((await raw.time())[0]) * 1000
        await raw.rpush(f"{key}:queue", "dead:1|ghost")
        await raw.zadd(f"{key}:queue-timeouts", {"dead:1|ghost": now_ms + 1500})

        async def take() -> bool:
            if not await lock.acquire(timeout=20):
                return False
            await lock.release()
            return True

        waiting = asyncio.create_task(take())

        async def queued() -> bool:
            return int(await raw.llen(f"{key}:queue")) == 2

        await eventually(queued, what="the waiter to queue up behind the dead one")
        await raw.config_resetstat()
        await holder.release()  # its wake-up goes to the dead head
        assert await waiting
        calls = await command_calls(raw)
        # release, the try at the dead entry's timeout, the waiter's release:
        # woken by that timeout, not by polling
        assert calls["evalsha"] <= 4, calls


@pytest.mark.parametrize("tamper", ["delete", "overwrite", "hdel", "expire"])
async def test_key_tampered_is_noticed_by_keyspace_event_not_renewal(
    url: str, raw: redis.asyncio.Redis, prefix: str, tamper: str
) -> None:
    """With ``watchdog=False`` and a long lease nothing is renewed or timed out
    before 60 s: only the server's keyspace event can make the hold lost sooner."""
    key = holders_key(prefix, "prompt/x")
    async with aiolocks.connect(url, lease_time=60) as backend:
        lock = backend.mutex("prompt/x", watchdog=False)
        body_cancelled = False
        with pytest.raises(aiolocks.LockLostError):
            async with lock:
                channel = f"__keyspace@0__:{key}"

                async def watching() -> bool:
                    numsub = await raw.pubsub_numsub(channel)
                    return bool(numsub and numsub[0][1] == 1)

                await eventually(watching, what="the keyspace subscription")
                field = next(iter(await hold_fields(raw, key)))
                try:
                    # the event may cancel the body as soon as the tampering is done
                    if tamper == "delete":
                        await raw.delete(key)
                    elif tamper == "overwrite":
                        await raw.set(key, "somebody else", px=2000)
                    elif tamper == "hdel":
                        await raw.hdel(key, field)
                    else:
                        await raw.pexpire(key, 1)
                    await asyncio.sleep(50)  # well inside the 60 s lease
                except asyncio.CancelledError:
                    body_cancelled = True
                    raise
        assert body_cancelled
        assert lock.is_lost
        # what the tampering left (the fence counter, in the hash, outlives a
        # failed release by its lease)
        await raw.delete(key)


async def test_server_refusing_keyspace_events_warns_once_and_renewal_still_notices(
    redis_server: RedisServer,
    raw: redis.asyncio.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A user without CONFIG: one warning, then loss is noticed by the renewal."""
    user = f"nocfg-{prefix.strip(':')}"
    await raw.acl_setuser(
        user,
        enabled=True,
        passwords=["+pw"],
        keys=["~*"],
        channels=["&*"],
        commands=["+@all", "-config"],
    )
    try:
        host_url = redis_server.url.replace("redis://", f"redis://{user}:pw@", 1)
        async with aiolocks.connect(f"{host_url}?key_prefix={prefix}", lease_time=0.6) as backend:
            for name in ("nocfg/a", "nocfg/b"):
                lock = backend.mutex(name)
                with pytest.raises(aiolocks.LockLostError):
                    async with lock:
                        try:
                            await raw.delete(holders_key(prefix, name))
                            await asyncio.sleep(5)  # the renewal is 0.2 s away
                        except asyncio.CancelledError:
                            assert lock.is_lost
                            raise
        warnings = [r for r in caplog.records if "keyspace events" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "NOPERM" in warnings[0].getMessage() or "permission" in warnings[0].getMessage()
    finally:
        await raw.acl_deluser(user)
