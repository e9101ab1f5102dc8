"""The four scenarios, each as "one round of one contender"; the runner interleaves the rounds."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiolocks.testing import RedisServer, ZooKeeperServer

from ._counters import RedisMonitor, commandstats_calls, parse_mntr, parse_wchs
from ._peers import (
    AsyncSession,
    Contender,
    SyncSession,
    lock_name,
    open_async,
    open_sync,
)
from ._stats import (
    Hold,
    count_overlaps,
    handoff_gaps_ns,
    jain_index,
    per_worker_counts,
    percentile,
)

__all__ = [
    "Session",
    "idle_redis_cpu",
    "close_session",
    "contended_round",
    "many_locks_run",
    "many_waiters_round",
    "open_session",
    "uncontended_costs",
    "uncontended_round",
]

REPO = Path(__file__).resolve().parent.parent
NS = 1_000_000_000


@dataclass
class Session:
    """An open session of one contender (asyncio or thread-based)."""

    contender: Contender
    async_session: AsyncSession | None = None
    sync_session: SyncSession | None = None


async def open_session(contender: Contender, url: str) -> Session:
    """Connect ``contender`` to ``url``."""
    if contender.style == "thread":
        return Session(contender, sync_session=await asyncio.to_thread(open_sync, contender, url))
    return Session(contender, async_session=await open_async(contender, url))


async def close_session(session: Session) -> None:
    """Disconnect."""
    if session.async_session is not None:
        await session.async_session.close()
    if session.sync_session is not None:
        await asyncio.to_thread(session.sync_session.close)


# --------------------------------------------------------------------------- uncontended


async def _cycles(session: Session, name: str, warmup: int, cycles: int) -> float:
    """Seconds for ``cycles`` acquire+release cycles on one handle (after ``warmup``)."""
    if session.async_session is not None:
        handle = session.async_session.lock(name)
        for _ in range(warmup):
            await handle.acquire()
            await handle.release()
        started = time.perf_counter()
        for _ in range(cycles):
            await handle.acquire()
            await handle.release()
        return time.perf_counter() - started
    assert session.sync_session is not None
    sync_handle = session.sync_session.lock(name)

    def run() -> float:
        for _ in range(warmup):
            sync_handle.acquire()
            sync_handle.release()
        started = time.perf_counter()
        for _ in range(cycles):
            sync_handle.acquire()
            sync_handle.release()
        return time.perf_counter() - started

    return await asyncio.to_thread(run)


async def uncontended_round(session: Session, *, warmup: int, cycles: int) -> float:
    """Milliseconds per uncontended acquire+release cycle (one fresh lock name per round)."""
    name = lock_name(session.contender, "uncontended")
    elapsed = await _cycles(session, name, warmup, cycles)
    return 1000 * elapsed / cycles


async def uncontended_costs(
    session: Session,
    *,
    cycles: int,
    redis: RedisServer | None,
    zookeeper: ZooKeeperServer | None,
) -> dict[str, Any]:
    """Server requests per uncontended cycle, counted on the server (separate, untimed pass)."""
    name = lock_name(session.contender, "costs")
    await _cycles(session, name, 3, 0)  # connections, scripts and parents in place first
    if session.contender.service == "redis":
        assert redis is not None
        monitor = RedisMonitor(redis.host, redis.port)
        with monitor as counts:
            await _cycles(session, name, 0, cycles)
        return {
            "requests_per_cycle": counts.client_total / cycles,
            "script_commands_per_cycle": counts.script_total / cycles,
            "requests_by_command": {k: v / cycles for k, v in sorted(counts.client.items())},
        }
    assert zookeeper is not None
    before = parse_mntr(zookeeper.four_letter("mntr"))
    await _cycles(session, name, 0, cycles)
    after = parse_mntr(zookeeper.four_letter("mntr"))
    received = int(after["zk_packets_received"]) - int(before["zk_packets_received"])
    return {"requests_per_cycle": received / cycles}


# --------------------------------------------------------------------------- contended


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return " | ".join(tail)


def _read_line(
    proc: subprocess.Popen[str], deadline: float, what: str, log: Path | None = None
) -> str:
    """One stdout line of a worker, or an error naming what we waited for (and its log)."""
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    if not result or not result[0]:
        raise RuntimeError(
            f"worker {proc.pid} did not report {what!r} in time (exit {proc.poll()})"
        )
    return result[0].strip()


def _spawn(cfg: dict[str, Any], log: Path) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with log.open("a") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks._worker", json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=REPO,
            env=env,
        )


def _stop_all(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def contended_round(
    contender: Contender,
    url: str,
    *,
    processes: int,
    tasks: int,
    duration_s: float,
    hold_s: float,
    think_s: float,
    workdir: Path,
    seed: int,
    polite: bool = False,
    redis_server: RedisServer | None = None,
    zk_server: ZooKeeperServer | None = None,
    idle_cpu_us_per_s: float = 0.0,
) -> dict[str, Any]:
    """One contended run: ``processes`` x ``tasks`` workers on one lock for ``duration_s``.

    ``polite``: a worker asks again only after another one entered (every
    release is a handoff to a queued worker; see ``_worker``).
    """
    run_id = uuid.uuid4().hex[:8]
    counter_path = workdir / f"counter-{contender.key}-{run_id}"
    counter_path.write_bytes(b"\0" * 16)
    name = lock_name(contender, "handoff" if polite else "contended")
    log = workdir / f"worker-{contender.key}.log"
    procs: list[subprocess.Popen[str]] = []
    outs = [workdir / f"holds-{contender.key}-{run_id}-{p}.json" for p in range(processes)]
    try:
        for p in range(processes):
            cfg = {
                "mode": "contended",
                "contender": contender.key,
                "url": url,
                "name": name,
                "tasks": tasks,
                "hold_s": hold_s,
                "think_s": think_s,
                "polite": polite,
                "counter": str(counter_path),
                "proc": p,
                "seed": seed * 100 + p,
                "out": str(outs[p]),
            }
            procs.append(_spawn(cfg, log))
        deadline = time.monotonic() + 120
        for proc in procs:
            if _read_line(proc, deadline, "ready", log) != "ready":
                raise RuntimeError(f"worker {proc.pid} did not get ready; see {log}")
        server_before = _server_load(redis_server, zk_server)
        load_started = time.monotonic()
        start = time.monotonic_ns()
        end = start + int(duration_s * NS)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"go {end}\n")
            proc.stdin.flush()
        # Waiters still queued at the end finish their hold (polling peers
        # can take a while: generous bound).
        deadline = time.monotonic() + duration_s + 180
        for proc in procs:
            if _read_line(proc, deadline, "done", log) != "done":
                raise RuntimeError(f"worker {proc.pid} failed; see {log}")
            proc.wait(30)
        server_after = _server_load(redis_server, zk_server)
        if "server_cpu_us" in server_after:
            # what an idle server burns anyway (serverCron) is not the lock's doing
            idle = idle_cpu_us_per_s * (time.monotonic() - load_started)
            server_after["server_cpu_us"] = max(
                server_before["server_cpu_us"], server_after["server_cpu_us"] - idle
            )
    finally:
        _stop_all(procs)
    holds = [
        Hold(str(w), int(r), int(e), int(x))
        for out in outs
        for w, r, e, x in json.loads(out.read_text())["holds"]
    ]
    final_counter = int.from_bytes(counter_path.read_bytes()[:8], "little", signed=True)
    counter_path.unlink()
    for out in outs:
        out.unlink()
    workers = [f"{p}:{t}" for p in range(processes) for t in range(tasks)]
    window = [h for h in holds if start <= h.entered < end]
    gaps = handoff_gaps_ns(window)
    waits = [(h.entered - h.requested) / 1e6 for h in window]
    counts = per_worker_counts(window, workers)
    return {
        "holds": len(window),
        "holds_total": len(holds),
        "holds_per_s": len(window) / duration_s,
        "handoffs": len(gaps),
        "handoff_p50_ms": percentile([g / 1e6 for g in gaps], 50),
        "handoff_p99_ms": percentile([g / 1e6 for g in gaps], 99),
        "wait_p50_ms": percentile(waits, 50),
        "wait_p99_ms": percentile(waits, 99),
        "jain": jain_index(counts),
        "min_holds_per_worker": min(counts),
        "max_holds_per_worker": max(counts),
        "overlaps": count_overlaps(holds),
        "lost_updates": len(holds) - final_counter,
        **{
            f"{key}_per_hold": (server_after[key] - server_before[key]) / max(1, len(holds))
            for key in server_before
        },
    }


def idle_redis_cpu(redis_server: RedisServer, seconds: float = 2.0) -> float:
    """Microseconds of CPU per second an idle Redis spends (its cron), to subtract later."""
    before = _server_load(redis_server, None)["server_cpu_us"]
    time.sleep(seconds)
    return (_server_load(redis_server, None)["server_cpu_us"] - before) / seconds


def _server_load(
    redis_server: RedisServer | None, zk_server: ZooKeeperServer | None
) -> dict[str, float]:
    """Counters of the work a server did: Redis CPU and commands, ZooKeeper requests."""
    if redis_server is not None:
        cpu = redis_server.info("cpu")
        stats = redis_server.info("stats")
        calls = commandstats_calls(redis_server.info("commandstats"))
        return {
            "server_cpu_us": 1e6 * (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])),
            "server_commands": float(stats["total_commands_processed"]),
            "server_evalsha": float(calls.get("evalsha", 0)),
        }
    if zk_server is not None:
        mntr = parse_mntr(zk_server.four_letter("mntr"))
        return {"server_requests": float(mntr["zk_packets_received"])}
    return {}


# --------------------------------------------------------------------------- many waiters


def _zk_nodes(zookeeper: ZooKeeperServer) -> int:
    return int(parse_mntr(zookeeper.four_letter("mntr"))["zk_znode_count"])


async def _wait_queued(zookeeper: ZooKeeperServer, baseline: int, waiters: int) -> int:
    """Wait until ``waiters`` more znodes exist (every waiter queued), or the count settles."""
    last, stable_since = -1, time.monotonic()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        nodes = await asyncio.to_thread(_zk_nodes, zookeeper)
        if nodes - baseline >= waiters:
            return nodes - baseline
        if nodes != last:
            last, stable_since = nodes, time.monotonic()
        elif time.monotonic() - stable_since > 3.0:
            return nodes - baseline
        await asyncio.sleep(0.05)
    raise RuntimeError("waiters did not queue within 120 s")


async def many_waiters_round(
    contender: Contender, zookeeper: ZooKeeperServer, *, waiters: int
) -> dict[str, Any]:
    """One holder, ``waiters`` blocked waiters on one ZooKeeper lock; release; time the drain."""
    session = await open_session(contender, zookeeper.url)
    name = lock_name(contender, "waiters")
    records: list[Hold] = []
    try:
        if session.async_session is not None:
            aio = session.async_session
            holder = aio.lock(name)
            await holder.acquire()
            baseline = await asyncio.to_thread(_zk_nodes, zookeeper)

            async def wait_once(index: int) -> None:
                handle = aio.lock(name)
                requested = time.monotonic_ns()
                await handle.acquire()
                entered = time.monotonic_ns()
                exited = time.monotonic_ns()
                await handle.release()
                records.append(Hold(str(index), requested, entered, exited))

            tasks = [asyncio.create_task(wait_once(i)) for i in range(waiters)]
            queued = await _wait_queued(zookeeper, baseline, waiters)
            stats = await _sample_watches(zookeeper)
            released = time.monotonic_ns()
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 180)
        else:
            assert session.sync_session is not None
            sync = session.sync_session
            sync_holder = sync.lock(name)
            await asyncio.to_thread(sync_holder.acquire)
            baseline = await asyncio.to_thread(_zk_nodes, zookeeper)
            done = threading.Barrier(waiters + 1, timeout=300)

            def wait_thread(index: int) -> None:
                handle = sync.lock(name)
                requested = time.monotonic_ns()
                handle.acquire()
                entered = time.monotonic_ns()
                exited = time.monotonic_ns()
                handle.release()
                records.append(Hold(str(index), requested, entered, exited))
                done.wait()

            threads = [threading.Thread(target=wait_thread, args=(i,)) for i in range(waiters)]
            for thread in threads:
                thread.start()
            queued = await _wait_queued(zookeeper, baseline, waiters)
            stats = await _sample_watches(zookeeper)
            released = time.monotonic_ns()
            await asyncio.to_thread(sync_holder.release)
            await asyncio.to_thread(done.wait)
            for thread in threads:
                await asyncio.to_thread(thread.join)
        finished = max(h.exited for h in records)
        after = parse_mntr(await asyncio.to_thread(zookeeper.four_letter, "mntr"))
    finally:
        await close_session(session)
    return {
        "waiters": waiters,
        "queued_znodes": queued,
        "watches": stats["watches"],
        "watched_paths": stats["paths"],
        "drain_ms": (finished - released) / 1e6,
        "requests_per_waiter": (int(after["zk_packets_received"]) - stats["packets"]) / waiters,
        "overlaps": count_overlaps(records),
        "completed": len(records),
    }


async def _sample_watches(zookeeper: ZooKeeperServer) -> dict[str, int]:
    # Let the last watches land: the queue is complete once the count is stable.
    await asyncio.sleep(0.5)
    _conns, paths, watches = parse_wchs(await asyncio.to_thread(zookeeper.four_letter, "wchs"))
    mntr = parse_mntr(await asyncio.to_thread(zookeeper.four_letter, "mntr"))
    return {"watches": watches, "paths": paths, "packets": int(mntr["zk_packets_received"])}


# --------------------------------------------------------------------------- many locks


def _min_key_ttl_ms(redis_server: RedisServer, pattern: str) -> tuple[int, int]:
    import redis

    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    try:
        keys = [k for k in client.scan_iter(match=pattern, count=2000) if not k.endswith(b":fence")]
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(key)
        ttls = [int(t) for t in pipe.execute()]
    finally:
        client.close()
    return len(keys), min(ttls) if ttls else -1


def many_locks_run(
    redis_server: RedisServer,
    *,
    locks: int,
    lease_s: float,
    window_s: float,
    workdir: Path,
    pool: str = "default",
) -> dict[str, Any]:
    """Hold ``locks`` aiolocks mutexes with lease ``lease_s``; count renewals for ``window_s``.

    ``pool="blocking"`` runs aiolocks on a user-supplied client with
    redis-py's ``BlockingConnectionPool`` instead of ``aiolocks.connect(url)``.
    """
    tag = uuid.uuid4().hex[:8]
    out = workdir / f"manylocks-{tag}.json"
    cfg = {
        "mode": "manylocks",
        "url": redis_server.url,
        "locks": locks,
        "lease_s": lease_s,
        "window_s": window_s,
        "concurrency": 100,
        "pool": pool,
        "tag": tag,
        "acquire_timeout_s": 300,
        "out": str(out),
    }
    log = workdir / "worker-manylocks.log"
    proc = _spawn(cfg, log)
    try:
        held = _read_line(proc, time.monotonic() + 330, "held", log)
        if not held.startswith("held"):
            raise RuntimeError(f"many-locks worker failed: {held!r}")
        # Let the watchdogs of the last acquisitions settle into their rhythm.
        time.sleep(lease_s / 3)
        assert proc.stdin is not None
        before = commandstats_calls(redis_server.info("commandstats")).get("evalsha", 0)
        t0 = time.monotonic()
        proc.stdin.write("measure\n")
        proc.stdin.flush()
        if _read_line(proc, time.monotonic() + window_s + 60, "measured", log) != "measured":
            raise RuntimeError("many-locks worker failed while measuring")
        t1 = time.monotonic()
        after = commandstats_calls(redis_server.info("commandstats")).get("evalsha", 0)
        keys, min_ttl = _min_key_ttl_ms(redis_server, f"aiolocks:{{mutex:bench/many/{tag}/*")
        clients = int(redis_server.info("clients")["connected_clients"])
        proc.stdin.write("release\n")
        proc.stdin.flush()
        if _read_line(proc, time.monotonic() + 300, "done", log) != "done":
            raise RuntimeError("many-locks worker failed while releasing")
        proc.wait(30)
    finally:
        _stop_all([proc])
    result: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    result["pool"] = pool
    renewals_per_s = (after - before) / (t1 - t0)
    expected = locks / (lease_s / 3)
    result.update(
        {
            "lease_s": lease_s,
            "renewals_per_s": renewals_per_s,
            "expected_renewals_per_s": expected,
            "renewal_ratio": renewals_per_s / expected,
            "keys_at_end": keys,
            "min_key_ttl_ms": min_ttl,
            "redis_connections": clients,
        }
    )
    return result
