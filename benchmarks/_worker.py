"""A benchmark worker process: ``python -m benchmarks._worker '<json config>'``.

Protocol on stdin/stdout (one line each): the worker connects, prints
``ready``, waits for ``go <end monotonic_ns>``, runs, writes its results to
the JSON file named in the config and prints ``done``.

Modes
-----
``contended``
    ``tasks`` asyncio tasks (or threads, for thread-based libraries) loop on
    one lock until ``end``: request, acquire, critical section, release,
    think. The critical section is a deliberately racy read-modify-write of
    a 64-bit counter in a file shared by every worker process (read, sleep
    ``hold_s``, write back + 1): any two overlapping sections lose an update,
    so ``holds - counter`` counts mutual-exclusion failures independently of
    the timestamps. With ``polite``, a worker that let go asks again only
    once another worker has *entered* (a second shared slot counts entries):
    every release is then a handoff to a worker that was already queued, and
    a releaser never races its own waiters (the "handoff" scenario).
``manylocks``
    holds ``locks`` aiolocks mutexes (one task each) with a short lease, so
    the watchdog keeps renewing them; reports CPU time, event-loop lag and
    lost holds over ``window_s`` (the parent counts the renewals on Redis).
    ``pool``: ``"default"`` connects by URL as users do; ``"blocking"``
    passes a client with redis-py's ``BlockingConnectionPool``.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import random
import struct
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks._peers import by_key, open_async, open_sync

_COUNTER = struct.Struct("<q")


class SharedCounter:
    """Two 64-bit integers in a shared file (counter, entries): deliberately *not* atomic."""

    def __init__(self, path: str) -> None:
        self._file = Path(path).open("r+b")  # noqa: SIM115 - closed in close()
        self._map = mmap.mmap(self._file.fileno(), 2 * _COUNTER.size)

    def read(self, slot: int = 0) -> int:
        """Current value of a slot (0: the racy counter, 1: entries)."""
        value: int = _COUNTER.unpack_from(self._map, slot * _COUNTER.size)[0]
        return value

    def write(self, value: int, slot: int = 0) -> None:
        """Overwrite a slot."""
        _COUNTER.pack_into(self._map, slot * _COUNTER.size, value)

    def enter(self) -> int:
        """Count an entry (called inside the critical section); the new entry count."""
        entries = self.read(1) + 1
        self.write(entries, 1)
        return entries

    def close(self) -> None:
        """Unmap and close."""
        self._map.close()
        self._file.close()


def _wait_for_go() -> int:
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if not line or line[0] != "go":
        raise SystemExit(f"expected 'go <end_ns>', got {line!r}")
    return int(line[1])


async def _contended_async(cfg: dict[str, Any], counter: SharedCounter) -> list[list[Any]]:
    contender = by_key(cfg["contender"])
    session = await open_async(contender, cfg["url"])
    holds: list[list[Any]] = []
    hold_s: float = cfg["hold_s"]
    think_s: float = cfg["think_s"]
    polite: bool = cfg["polite"]
    rng = random.Random(cfg["seed"])
    try:
        handles = [session.lock(cfg["name"]) for _ in range(cfg["tasks"])]
        end = await asyncio.to_thread(_wait_for_go)

        async def worker(index: int) -> None:
            handle = handles[index]
            me = f"{cfg['proc']}:{index}"
            while time.monotonic_ns() < end:
                requested = time.monotonic_ns()
                await handle.acquire()
                entered = time.monotonic_ns()
                mine = counter.enter()
                value = counter.read()
                await asyncio.sleep(hold_s)
                counter.write(value + 1)
                exited = time.monotonic_ns()
                await handle.release()
                holds.append([me, requested, entered, exited])
                if polite:
                    while counter.read(1) == mine and time.monotonic_ns() < end:
                        await asyncio.sleep(0.0002)
                if think_s:
                    await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))

        await asyncio.gather(*(worker(i) for i in range(cfg["tasks"])))
    finally:
        await session.close()
    return holds


def _contended_threads(cfg: dict[str, Any], counter: SharedCounter) -> list[list[Any]]:
    contender = by_key(cfg["contender"])
    session = open_sync(contender, cfg["url"])
    holds: list[list[Any]] = []
    hold_s: float = cfg["hold_s"]
    think_s: float = cfg["think_s"]
    polite: bool = cfg["polite"]
    errors: list[BaseException] = []
    try:
        handles = [session.lock(cfg["name"]) for _ in range(cfg["tasks"])]
        end = _wait_for_go()

        def worker(index: int) -> None:
            rng = random.Random(cfg["seed"] * 1000 + index)
            handle = handles[index]
            me = f"{cfg['proc']}:{index}"
            try:
                while time.monotonic_ns() < end:
                    requested = time.monotonic_ns()
                    handle.acquire()
                    entered = time.monotonic_ns()
                    mine = counter.enter()
                    value = counter.read()
                    time.sleep(hold_s)
                    counter.write(value + 1)
                    exited = time.monotonic_ns()
                    handle.release()
                    holds.append([me, requested, entered, exited])  # list.append is atomic
                    if polite:
                        while counter.read(1) == mine and time.monotonic_ns() < end:
                            time.sleep(0.0002)
                    if think_s:
                        time.sleep(think_s * rng.uniform(0.5, 1.5))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(cfg["tasks"])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        session.close()
    if errors:
        raise errors[0]
    return holds


async def _manylocks(cfg: dict[str, Any]) -> dict[str, Any]:
    import aiolocks

    if cfg["pool"] == "blocking":
        # What a user can do today: their own client whose pool waits for a
        # free connection instead of raising MaxConnectionsError.
        import redis.asyncio

        from aiolocks.redis import RedisBackend

        pool = redis.asyncio.BlockingConnectionPool.from_url(
            cfg["url"], max_connections=100, timeout=10
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        backend: Any = RedisBackend(client, lease_time=cfg["lease_s"])
        await backend.open()
    else:
        client = None
        backend = await aiolocks.connect(cfg["url"], lease_time=cfg["lease_s"])
    stop = asyncio.Event()
    gate = asyncio.Semaphore(cfg["concurrency"])
    locks = [backend.mutex(f"bench/many/{cfg['tag']}/{i}") for i in range(cfg["locks"])]
    held = 0
    all_held = asyncio.Event()
    lags: list[float] = []

    check = asyncio.Event()
    lost_at_check: list[bool] = []
    interrupted = 0

    async def keep(lock: Any) -> None:
        nonlocal held, interrupted
        async with gate:
            await lock.acquire()
        held += 1
        if held == len(locks):
            all_held.set()
        try:
            await check.wait()
            # is_lost is about the current task's hold: ask from the owner.
            lost_at_check.append(lock.is_lost)
            await stop.wait()
        except asyncio.CancelledError:
            # the core cancels the owner of a lost hold; count it and let go
            interrupted += 1
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            await lock.release()

    async def sample_lag() -> None:
        while not stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)

    try:
        started = time.monotonic()
        tasks = [asyncio.create_task(keep(lock)) for lock in locks]
        await asyncio.wait_for(all_held.wait(), cfg["acquire_timeout_s"])
        acquire_s = time.monotonic() - started
        print(f"held {acquire_s:.3f}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # "measure"
        sampler = asyncio.create_task(sample_lag())
        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.sleep(cfg["window_s"])
        cpu1, wall1 = time.process_time(), time.monotonic()
        check.set()
        while len(lost_at_check) + interrupted < len(locks):
            await asyncio.sleep(0.01)
        lost = sum(lost_at_check) + interrupted
        print("measured", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # "release"
        stop.set()
        await sampler
        release_started = time.monotonic()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        release_s = time.monotonic() - release_started
        release_errors = Counter(
            f"{type(o).__name__}: {o}"[:160] for o in outcomes if isinstance(o, BaseException)
        )
    finally:
        stop.set()
        await backend.close()
        if client is not None:
            await client.aclose()
    lags.sort()
    return {
        "locks": len(locks),
        "acquire_s": acquire_s,
        "release_s": release_s,
        "window_s": wall1 - wall0,
        "cpu_s": cpu1 - cpu0,
        "cpu_share": (cpu1 - cpu0) / (wall1 - wall0),
        "lost": lost,
        "still_held": len(locks) - lost,
        "release_errors": sum(release_errors.values()),
        "release_error_kinds": dict(release_errors.most_common(3)),
        "loop_lag_p50_ms": 1000 * lags[len(lags) // 2] if lags else None,
        "loop_lag_p99_ms": 1000 * lags[int(len(lags) * 0.99)] if lags else None,
        "loop_lag_max_ms": 1000 * lags[-1] if lags else None,
    }


def main(argv: list[str]) -> int:
    """Run one worker as configured by the JSON in ``argv[1]``."""
    import warnings

    # Peers (aioredis 1.x, pottery) emit deprecation warnings on 3.11+.
    warnings.simplefilter("ignore")
    cfg: dict[str, Any] = json.loads(argv[1])
    if cfg["mode"] == "contended":
        counter = SharedCounter(cfg["counter"])
        try:
            if by_key(cfg["contender"]).style == "thread":
                holds = _contended_threads(cfg, counter)
            else:
                holds = asyncio.run(_contended_async(cfg, counter))
        finally:
            counter.close()
        Path(cfg["out"]).write_text(json.dumps({"holds": holds}))
    elif cfg["mode"] == "manylocks":
        result = asyncio.run(_manylocks(cfg))
        Path(cfg["out"]).write_text(json.dumps(result))
    else:
        raise SystemExit(f"unknown mode {cfg['mode']!r}")
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
