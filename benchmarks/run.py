"""Run the aiolocks benchmarks side by side with the peers: ``python -m benchmarks [--quick]``.

Method
------
* One command starts its own ``redis-server`` and ZooKeeper
  (:mod:`aiolocks.testing`), runs every contender against the same servers
  in one run, and stops them.
* Rounds are interleaved: round 1 runs A, B, C, ...; round 2 runs ..., C,
  B, A; and so on. Machine drift (other jobs, CPU frequency, the server
  warming up) lands on every contender alike. Every figure is the median
  over rounds; ratios are ratios of medians.
* Costs are counted on the server: Redis ``MONITOR`` (client requests vs
  commands run inside Lua scripts) and ZooKeeper ``mntr``/``wchs``, in a
  pass that is not timed.
* Contended runs use separate worker processes and a shared, deliberately
  racy counter as the overlap checker (see ``benchmarks/_worker.py``).

Outputs: a table on stdout, ``benchmarks/results/latest.json``,
``benchmarks/results/latest.png``, and (full runs) ``docs/benchmarks.md``
and ``docs/benchmarks.png``; the sections of ``docs/benchmarks.md`` marked
hand-written (``_report.HAND_WRITTEN``) are kept as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import platform
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiolocks.testing import RedisServer, ServerError, ZooKeeperServer

from . import _report
from ._memory import memory_per_waiter
from ._peers import CONTENDERS, Contender
from ._scenarios import (
    Session,
    close_session,
    contended_round,
    idle_redis_cpu,
    many_locks_run,
    many_waiters_round,
    open_session,
    uncontended_costs,
    uncontended_round,
)
from ._stats import median
from ._zk_loss import zookeeper_loss_latency
from .redis_extra import loss_latency as redis_loss_latency
from .redis_extra import many_waiters

__all__ = ["PLANS", "Plan", "main", "run"]

RESULTS = Path(__file__).resolve().parent / "results"
DOCS = Path(__file__).resolve().parent.parent / "docs"


@dataclass(frozen=True)
class Plan:
    """Sizes of one benchmark run."""

    uncontended_rounds: int
    cycles: int
    warmup: int
    cost_cycles: int
    contended_rounds: int
    processes: int
    tasks: int
    duration_s: float
    hold_s: float
    think_s: float
    handoff_processes: int
    handoff_tasks: int
    handoff_duration_s: float
    waiter_rounds: int
    waiters: int
    many_locks: int
    lease_s: float
    window_s: float
    #: waiters for the memory-per-waiting-task measurement: memory://, then each server
    memory_waiters: tuple[int, int] = (2000, 500)
    #: many waiters on one Redis lock: (processes, tasks each) per run, aiolocks and
    #: python-redis-lock side by side; and how long each run lasts (s)
    redis_waiters: tuple[tuple[int, int], ...] = ((4, 1), (8, 1), (16, 1), (4, 50))
    redis_waiters_duration_s: float = 3.0


PLANS: dict[str, Plan] = {
    # For the test suite: checks the plumbing, not the numbers.
    "smoke": Plan(
        2, 20, 3, 10, 1, 2, 2, 1.0, 0.001, 0.005, 2, 1, 1.0, 1, 20, 200, 3.0, 3.0, (50, 20),
        ((2, 1),), 0.5,
    ),
    "quick": Plan(
        3, 100, 10, 50, 2, 3, 3, 2.0, 0.001, 0.005, 4, 1, 2.0, 1, 200, 2000, 3.0, 3.0,
        (2000, 500), ((4, 1), (16, 1), (4, 50)), 2.0,
    ),
    # Contended rounds vary by +-10 % with the machine; 5 of them keep the
    # median steady enough to compare libraries a few percent apart.
    "full": Plan(
        9, 1000, 20, 100, 5, 4, 4, 4.0, 0.001, 0.005, 4, 1, 4.0, 3, 250, 10_000, 10.0, 10.0,
        (10_000, 2000),
    ),
}


#: the Redis many-waiters rows: aiolocks and the peer that waits without polling
REDIS_WAITER_LIBRARIES = ("aiolocks-redis", "python-redis-lock")


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _interleaved(items: list[Contender], round_index: int) -> list[Contender]:
    return items if round_index % 2 == 0 else list(reversed(items))


def _zookeeper_unavailable() -> str | None:
    try:
        import aiolocks.zookeeper  # noqa: F401
    except Exception as exc:
        return f"aiolocks.zookeeper does not import yet: {type(exc).__name__}: {exc}"
    return None


async def _zk_connect_works(url: str) -> str | None:
    import aiolocks

    try:
        async with asyncio.timeout(30):
            async with aiolocks.connect(url) as backend, backend.mutex("bench/probe"):
                pass
    except Exception as exc:
        return f"aiolocks.connect({url!r}) does not work yet: {type(exc).__name__}: {exc}"
    return None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None:
        return None
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return None
    return numerator / denominator


def _median_of(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rounds if r.get(key) is not None]
    value = median(values)
    return None if math.isnan(value) else value


async def run(
    plan: Plan, *, services: set[str], only: set[str] | None, workdir: Path
) -> dict[str, Any]:
    """Run the whole benchmark and return the results document (see ``_report``)."""
    started = time.monotonic()
    doc: dict[str, Any] = {
        "meta": {
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "plan": asdict(plan),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": _cpu_count(),
        },
        "contenders": {},
        "uncontended": {},
        "contended": {},
        "handoff": {},
        "many_waiters": {},
        "many_locks": {},
        "memory_per_waiter": {},
    }
    contenders: list[Contender] = []
    zk_reason = _zookeeper_unavailable() if "zookeeper" in services else "not requested"
    for contender in CONTENDERS:
        entry: dict[str, Any] = {
            "label": contender.label,
            "service": contender.service,
            "style": contender.style,
            "note": contender.note,
            "version": contender.version(),
        }
        reason = contender.unavailable_reason()
        if contender.service not in services:
            reason = "service not requested"
        elif contender.service == "zookeeper" and zk_reason is not None:
            reason = f"ZooKeeper half skipped: {zk_reason}"
        elif only is not None and contender.key not in only and not contender.is_aiolocks:
            reason = "not selected (--only)"
        entry["available"] = reason is None
        entry["reason"] = reason
        doc["contenders"][contender.key] = entry
        if reason is None:
            contenders.append(contender)

    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        redis_server: RedisServer | None = None
        zk_server: ZooKeeperServer | None = None
        if any(c.service == "redis" for c in contenders):
            _log("starting redis-server")
            try:
                redis_server = stack.enter_context(RedisServer().start())
            except ServerError as exc:
                contenders = _drop(doc, contenders, "redis", f"no Redis server: {exc}")
            else:
                urls["redis"] = redis_server.url
                doc["meta"]["redis_server"] = redis_server.info("server").get("redis_version")
        if any(c.service == "zookeeper" for c in contenders):
            _log("starting ZooKeeper")
            try:
                zk_server = stack.enter_context(ZooKeeperServer().start())
            except ServerError as exc:
                contenders = _drop(doc, contenders, "zookeeper", f"no ZooKeeper server: {exc}")
            else:
                urls["zookeeper"] = zk_server.url
                reason = await _zk_connect_works(zk_server.url)
                if reason is not None:
                    contenders = _drop(
                        doc, contenders, "zookeeper", f"ZooKeeper half skipped: {reason}"
                    )
                    zk_server = None
                else:
                    srvr = zk_server.four_letter("srvr").splitlines()[0]
                    version = srvr.partition(":")[2].strip()
                    doc["meta"]["zookeeper_server"] = version.split("-")[0].split(",")[0]

        # ---------------------------------------------------------------- uncontended
        sessions: dict[str, Session] = {}
        unc_rounds: dict[str, list[float]] = {c.key: [] for c in contenders}
        errors: dict[str, str] = {}
        for c in contenders:
            try:
                sessions[c.key] = await open_session(c, urls[c.service])
            except Exception as exc:
                errors[c.key] = f"connect failed: {type(exc).__name__}: {exc}"
        # One unmeasured round first, three times as long: the servers' JIT
        # (ZooKeeper runs on the JVM) and every client's caches warm up
        # before anything is timed, instead of slowing whoever comes first.
        _log("uncontended warm-up round (not measured)")
        for c in contenders:
            if c.key in errors:
                continue
            try:
                await uncontended_round(
                    sessions[c.key], warmup=plan.warmup, cycles=plan.cycles * 3
                )
            except Exception as exc:
                errors[c.key] = f"{type(exc).__name__}: {exc}"
        for r in range(plan.uncontended_rounds):
            _log(f"uncontended round {r + 1}/{plan.uncontended_rounds}")
            for c in _interleaved(contenders, r):
                if c.key in errors:
                    continue
                try:
                    ms = await uncontended_round(
                        sessions[c.key], warmup=plan.warmup, cycles=plan.cycles
                    )
                    unc_rounds[c.key].append(ms)
                except Exception as exc:
                    errors[c.key] = f"{type(exc).__name__}: {exc}"
        costs: dict[str, dict[str, Any]] = {}
        for c in contenders:
            if c.key in errors:
                continue
            try:
                costs[c.key] = await uncontended_costs(
                    sessions[c.key],
                    cycles=plan.cost_cycles,
                    redis=redis_server,
                    zookeeper=zk_server,
                )
            except Exception as exc:
                costs[c.key] = {"error": f"{type(exc).__name__}: {exc}"}
        for session in sessions.values():
            with contextlib.suppress(Exception):
                await close_session(session)
        for c in contenders:
            cycle = median(unc_rounds[c.key]) if unc_rounds[c.key] else math.nan
            doc["uncontended"][c.key] = {
                "service": c.service,
                "cycle_ms": None if math.isnan(cycle) else cycle,
                "rounds_ms": unc_rounds[c.key],
                **costs.get(c.key, {}),
                **({"error": errors[c.key]} if c.key in errors else {}),
            }

        # ---------------------------------------------------------------- contended
        servers: dict[str, Any] = {"redis": redis_server, "zookeeper": zk_server}
        if redis_server is not None:
            servers["redis_idle_cpu_us_per_s"] = idle_redis_cpu(redis_server)
            doc["meta"]["redis_idle_cpu_us_per_s"] = servers["redis_idle_cpu_us_per_s"]
        doc["contended"] = _contended_section(
            contenders,
            urls,
            servers,
            plan,
            workdir,
            polite=False,
            rounds=plan.contended_rounds,
            processes=plan.processes,
            tasks=plan.tasks,
            duration_s=plan.duration_s,
            think_s=plan.think_s,
        )
        doc["handoff"] = _contended_section(
            contenders,
            urls,
            servers,
            plan,
            workdir,
            polite=True,
            rounds=plan.contended_rounds,
            processes=plan.handoff_processes,
            tasks=plan.handoff_tasks,
            duration_s=plan.handoff_duration_s,
            think_s=0.0,
        )

        # ---------------------------------------------------------------- many waiters
        zk_contenders = [c for c in contenders if c.service == "zookeeper"]
        if zk_server is not None and zk_contenders:
            wait_rounds: dict[str, list[dict[str, Any]]] = {c.key: [] for c in zk_contenders}
            wait_errors: dict[str, str] = {}
            for r in range(plan.waiter_rounds):
                _log(f"many-waiters round {r + 1}/{plan.waiter_rounds} ({plan.waiters} waiters)")
                for c in _interleaved(zk_contenders, r):
                    if c.key in wait_errors:
                        continue
                    try:
                        wait_rounds[c.key].append(
                            await many_waiters_round(c, zk_server, waiters=plan.waiters)
                        )
                    except Exception as exc:
                        wait_errors[c.key] = f"{type(exc).__name__}: {exc}"
                        _log(f"  {c.key}: {wait_errors[c.key]}")
            for c in zk_contenders:
                rounds = wait_rounds[c.key]
                waiting: dict[str, Any] = {"waiters": plan.waiters, "rounds": rounds}
                for key in ("drain_ms", "watches", "watched_paths", "requests_per_waiter"):
                    waiting[key] = _median_of(rounds, key)
                waiting["overlaps"] = sum(int(r["overlaps"]) for r in rounds)
                if c.key in wait_errors:
                    waiting["error"] = wait_errors[c.key]
                doc["many_waiters"][c.key] = waiting

        # ---------------------------------------------------------------- many locks
        if redis_server is not None and any(c.key == "aiolocks-redis" for c in contenders):
            for key, pool in (
                ("aiolocks-redis", "default"),
                ("aiolocks-redis-blocking-pool", "blocking"),
            ):
                _log(
                    f"many-locks ({pool} pool): {plan.many_locks} held locks, "
                    f"lease {plan.lease_s:g} s"
                )
                try:
                    doc["many_locks"][key] = many_locks_run(
                        redis_server,
                        locks=plan.many_locks,
                        lease_s=plan.lease_s,
                        window_s=plan.window_s,
                        workdir=workdir,
                        pool=pool,
                    )
                except Exception as exc:
                    doc["many_locks"][key] = {"error": f"{type(exc).__name__}: {exc}"}
        # the Redis peers have no watchdog (or, python-redis-lock, one thread per lock)
        doc["many_locks_note"] = (
            "not compared: redis-py, pottery and aioredlock have no lease renewal; "
            "python-redis-lock's auto_renewal runs one thread per lock"
        )

        # ---------------------------------------------------------------- many waiters (Redis)
        redis_keys = [c.key for c in contenders if c.key in REDIS_WAITER_LIBRARIES]
        if redis_server is not None and "aiolocks-redis" in redis_keys:
            _log(f"many waiters on one Redis lock: {plan.redis_waiters} (processes, tasks)")
            try:
                doc["redis_many_waiters"] = {
                    "rows": many_waiters(
                        redis_server,
                        redis_keys,
                        list(plan.redis_waiters),
                        plan.redis_waiters_duration_s,
                        servers.get("redis_idle_cpu_us_per_s"),
                    )
                }
            except Exception as exc:
                doc["redis_many_waiters"] = {"error": f"{type(exc).__name__}: {exc}"}

        # ---------------------------------------------------------------- memory per waiter
        local_n, server_n = plan.memory_waiters
        targets = [("memory", "memory://", local_n)]
        targets += [(svc, urls[svc], server_n) for svc in ("redis", "zookeeper") if svc in urls]
        for service, url, n in targets:
            _log(f"memory per waiting task: {service}, {n} waiters")
            try:
                doc["memory_per_waiter"][service] = await memory_per_waiter(url, n)
            except Exception as exc:
                doc["memory_per_waiter"][service] = {"error": f"{type(exc).__name__}: {exc}"}

        # ---------------------------------------------------------------- loss latency
        if "redis" in urls and any(c.key == "aiolocks-redis" for c in contenders):
            samples = max(10, plan.cost_cycles)
            _log(f"loss latency: redis, {samples} deletions of a held lock's key")
            section = doc.setdefault("loss_latency", {})
            try:
                section["redis"] = await redis_loss_latency(urls["redis"], samples)
            except Exception as exc:
                section["redis"] = {"error": f"{type(exc).__name__}: {exc}"}
        if "zookeeper" in urls:
            await _zookeeper_loss_row(doc, urls["zookeeper"], plan)

    # ---------------------------------------------------------------- PostgreSQL
    if "postgres" in services:
        doc["postgres"] = await _postgres_section(plan)

    _add_ratios(doc)
    doc["targets"] = _targets(doc, plan)
    doc["meta"]["duration_s"] = round(time.monotonic() - started, 1)
    return doc


#: benchmarks.postgres.run() sizes per plan (rounds, cycles, tasks, seconds, waiters,
#: settle seconds of the many-waiters statistics)
_POSTGRES_SIZES: dict[int, tuple[int, int, int, float, int, float]] = {
    2: (1, 10, 4, 0.2, 10, 0.1),  # smoke: plumbing only, the figures mean nothing
    3: (5, 150, 8, 1.0, 100, 1.5),  # quick
    9: (15, 300, 8, 3.0, 200, 1.5),  # full
}


async def _postgres_section(plan: Plan) -> dict[str, Any]:
    """``doc["postgres"]``: :mod:`benchmarks.postgres` on a throwaway server."""
    from aiolocks.testing import PostgresServer

    from . import postgres

    rounds, cycles, tasks, seconds, waiters, settle = _POSTGRES_SIZES.get(
        plan.uncontended_rounds, _POSTGRES_SIZES[9]
    )
    _log("starting PostgreSQL")
    try:
        server = PostgresServer()
        await asyncio.to_thread(server.start)
    except (ServerError, OSError) as exc:
        return {"error": f"no PostgreSQL server: {exc}"}
    try:
        _log("PostgreSQL: uncontended, contended, many waiters")
        return await postgres.run(
            server.url,
            rounds=rounds,
            cycles=cycles,
            tasks=tasks,
            seconds=seconds,
            waiters=waiters,
            settle=settle,
            with_peer=plan.uncontended_rounds != 2,  # asyncpg-lock: a connection per hold
        )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        await asyncio.to_thread(server.stop)


async def _zookeeper_loss_row(doc: dict[str, Any], url: str, plan: Plan) -> None:
    """``doc["loss_latency"]["zookeeper"]``: held node deleted -> body cancelled, p50/p99."""
    samples = max(10, plan.cost_cycles)
    _log(f"loss latency: zookeeper, {samples} deletions of a held node")
    section = doc.setdefault("loss_latency", {})
    try:
        section["zookeeper"] = await zookeeper_loss_latency(url, samples)
    except Exception as exc:
        section["zookeeper"] = {"error": f"{type(exc).__name__}: {exc}"}


def _contended_section(
    contenders: list[Contender],
    urls: dict[str, str],
    servers: dict[str, Any],
    plan: Plan,
    workdir: Path,
    *,
    polite: bool,
    rounds: int,
    processes: int,
    tasks: int,
    duration_s: float,
    think_s: float,
) -> dict[str, Any]:
    """Interleaved rounds of contended runs; medians over rounds per contender."""
    what = "handoff" if polite else "contended"
    per_round: dict[str, list[dict[str, Any]]] = {c.key: [] for c in contenders}
    failed: dict[str, str] = {}
    for r in range(rounds):
        _log(f"{what} round {r + 1}/{rounds} ({processes} processes x {tasks})")
        for c in _interleaved(contenders, r):
            if c.key in failed:
                continue
            try:
                per_round[c.key].append(
                    contended_round(
                        c,
                        urls[c.service],
                        processes=processes,
                        tasks=tasks,
                        duration_s=duration_s,
                        hold_s=plan.hold_s,
                        think_s=think_s,
                        workdir=workdir,
                        seed=r,
                        polite=polite,
                        redis_server=servers.get("redis") if c.service == "redis" else None,
                        zk_server=servers.get("zookeeper") if c.service == "zookeeper" else None,
                        idle_cpu_us_per_s=servers.get("redis_idle_cpu_us_per_s", 0.0),
                    )
                )
            except Exception as exc:
                failed[c.key] = f"{type(exc).__name__}: {exc}"
                _log(f"  {c.key}: {failed[c.key]}")
    section: dict[str, Any] = {}
    for c in contenders:
        results = per_round[c.key]
        summary: dict[str, Any] = {
            "service": c.service,
            "processes": processes,
            "tasks": tasks,
            "rounds": results,
        }
        for key in (
            "holds_per_s",
            "handoff_p50_ms",
            "handoff_p99_ms",
            "wait_p50_ms",
            "wait_p99_ms",
            "jain",
            "min_holds_per_worker",
            "max_holds_per_worker",
            "handoffs",
            "server_cpu_us_per_hold",
            "server_commands_per_hold",
            "server_requests_per_hold",
        ):
            summary[key] = _median_of(results, key)
        summary["overlaps"] = sum(int(r["overlaps"]) for r in results)
        summary["lost_updates"] = sum(int(r["lost_updates"]) for r in results)
        if c.key in failed:
            summary["error"] = failed[c.key]
        section[c.key] = summary
    return section


def _drop(
    doc: dict[str, Any], contenders: list[Contender], service: str, reason: str
) -> list[Contender]:
    """Mark every contender of ``service`` as not run, with ``reason``."""
    for c in contenders:
        if c.service == service:
            doc["contenders"][c.key].update(available=False, reason=reason)
    return [c for c in contenders if c.service != service]


def _cpu_count() -> int | None:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _add_ratios(doc: dict[str, Any]) -> None:
    """``aiolocks_advantage``: how many times better aiolocks is (>1 = aiolocks ahead)."""
    subject = {"redis": "aiolocks-redis", "zookeeper": "aiolocks-zk"}
    for key, row in doc["uncontended"].items():
        base = doc["uncontended"].get(subject[row["service"]], {})
        row["aiolocks_advantage"] = _ratio(row.get("cycle_ms"), base.get("cycle_ms"))
        del key
    for section in ("contended", "handoff"):
        for row in doc[section].values():
            base = doc[section].get(subject[row["service"]], {})
            row["aiolocks_advantage"] = {
                "holds_per_s": _ratio(base.get("holds_per_s"), row.get("holds_per_s")),
                "handoff_p50": _ratio(row.get("handoff_p50_ms"), base.get("handoff_p50_ms")),
                "handoff_p99": _ratio(row.get("handoff_p99_ms"), base.get("handoff_p99_ms")),
                "wait_p50": _ratio(row.get("wait_p50_ms"), base.get("wait_p50_ms")),
                "wait_p99": _ratio(row.get("wait_p99_ms"), base.get("wait_p99_ms")),
            }
    base_wait = doc["many_waiters"].get("aiolocks-zk", {})
    for row in doc["many_waiters"].values():
        row["aiolocks_advantage"] = _ratio(row.get("drain_ms"), base_wait.get("drain_ms"))


def _keeps_up(many: dict[str, Any]) -> bool:
    """No hold lost, every key kept >= a third of its lease, >= 90 % of the expected renewals."""
    return bool(
        many["lost"] == 0
        and many["keys_at_end"] == many["locks"]
        and many["min_key_ttl_ms"] >= 1000 * many["lease_s"] / 3
        and many["renewal_ratio"] >= 0.9
    )


def _target(name: str, goal: str, measured: str, met: bool | None, why: str = "") -> dict[str, Any]:
    return {"name": name, "goal": goal, "measured": measured, "met": met, "note": why}


def _targets(doc: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    con, unc = doc["contended"], doc["uncontended"]

    def fmt(value: float | None, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:.3g}{unit}"

    # 1. contended Redis handoff p50 >= 20x faster than redis-py default
    hand = doc["handoff"]
    a, p = hand.get("aiolocks-redis", {}), hand.get("redis-py", {})
    ratio = _ratio(p.get("handoff_p50_ms"), a.get("handoff_p50_ms"))
    a_c, p_c = con.get("aiolocks-redis", {}), con.get("redis-py", {})
    closed = _ratio(p_c.get("handoff_p50_ms"), a_c.get("handoff_p50_ms"))
    out.append(
        _target(
            "redis_contended_handoff",
            "contended Redis handoff p50 >= 20x faster than redis-py Lock (sleep=0.1)",
            f"handoff scenario ({a.get('processes', '?')}x{a.get('tasks', '?')} workers): "
            f"{fmt(a.get('handoff_p50_ms'), ' ms')} vs {fmt(p.get('handoff_p50_ms'), ' ms')}"
            f" = {fmt(ratio, 'x')}; closed loop with think time: {fmt(closed, 'x')}",
            None if ratio is None else ratio >= 20,
            "judged on the handoff scenario, where every release goes to a queued waiter; "
            "in the closed loop a polling lock's releaser re-takes the lock after its think "
            "time, which caps the handoffs that can be observed (see wait p99 instead)",
        )
    )
    # 2. uncontended Redis cycle within 1.2x of redis-py Lock
    a_u, p_u = unc.get("aiolocks-redis", {}), unc.get("redis-py", {})
    ratio = _ratio(a_u.get("cycle_ms"), p_u.get("cycle_ms"))
    out.append(
        _target(
            "redis_uncontended_cycle",
            "uncontended Redis cycle <= 1.2x redis-py Lock",
            f"{fmt(a_u.get('cycle_ms'), ' ms')} vs {fmt(p_u.get('cycle_ms'), ' ms')}"
            f" = {fmt(ratio, 'x')} of redis-py",
            None if ratio is None else ratio <= 1.2,
        )
    )
    # 3./4. ZooKeeper ahead of kazoo and aiozk
    z_u = unc.get("aiolocks-zk", {}).get("cycle_ms")
    peers_u = {k: unc.get(k, {}).get("cycle_ms") for k in ("kazoo", "aiozk")}
    known = {k: v for k, v in peers_u.items() if v is not None}
    out.append(
        _target(
            "zk_uncontended_cycle",
            "ZooKeeper uncontended cycle faster than kazoo and aiozk",
            f"aiolocks {fmt(z_u, ' ms')}; "
            + ", ".join(f"{k} {fmt(v, ' ms')}" for k, v in peers_u.items()),
            None if z_u is None or len(known) < 2 else all(z_u < v for v in known.values()),
        )
    )
    z_c = con.get("aiolocks-zk", {}).get("holds_per_s")
    peers_c = {k: con.get(k, {}).get("holds_per_s") for k in ("kazoo", "aiozk")}
    known = {k: v for k, v in peers_c.items() if v is not None}
    out.append(
        _target(
            "zk_contended_throughput",
            "ZooKeeper contended holds/s ahead of kazoo and aiozk",
            f"aiolocks {fmt(z_c, '/s')}; "
            + ", ".join(f"{k} {fmt(v, '/s')}" for k, v in peers_c.items()),
            None if z_c is None or len(known) < 2 else all(z_c > v for v in known.values()),
        )
    )
    # 5. many locks
    many = doc["many_locks"].get("aiolocks-redis", {})
    blocking = doc["many_locks"].get("aiolocks-redis-blocking-pool", {})
    if "renewal_ratio" in many:
        full_size = many["locks"] >= 10_000
        extra = ""
        if "renewal_ratio" in blocking:
            extra = (
                f"; on a client with BlockingConnectionPool: {blocking['renewals_per_s']:.0f}/s "
                f"({100 * blocking['renewal_ratio']:.0f}%), lost {blocking['lost']}, "
                f"min key TTL {blocking['min_key_ttl_ms'] / 1000:.1f} s, "
                f"CPU {100 * blocking['cpu_share']:.0f}%"
                f" -> {'would meet' if _keeps_up(blocking) else 'would not meet'} the target"
            )
        out.append(
            _target(
                "redis_many_locks",
                "10,000 held Redis locks renewed without falling behind (none lost, every "
                "key keeps >= 1/3 lease of TTL, >= 90% of the expected renewal rate)",
                f"aiolocks.connect(url), {many['locks']} locks, lease {many['lease_s']:g} s: "
                f"{many['renewals_per_s']:.0f}/s of {many['expected_renewals_per_s']:.0f}/s "
                f"expected ({100 * many['renewal_ratio']:.0f}%), lost {many['lost']}, "
                f"CPU {100 * many['cpu_share']:.0f}% of a core{extra}",
                _keeps_up(many) if full_size else None,
                "" if full_size else "only meaningful at 10,000 locks (full run)",
            )
        )
    else:
        out.append(
            _target(
                "redis_many_locks",
                "10,000 held Redis locks renewed without falling behind",
                many.get("error", "not run"),
                None,
            )
        )
    # 6. safety
    overlaps = (
        sum(int(r.get("overlaps", 0)) for r in con.values())
        + sum(int(r.get("overlaps", 0)) for r in doc["handoff"].values())
        + sum(int(r.get("overlaps", 0)) for r in doc["many_waiters"].values())
        + sum(int(r.get("overlaps", 0)) for r in doc.get("redis_many_waiters", {}).get("rows", []))
    )
    lost_updates = sum(int(r.get("lost_updates", 0)) for r in con.values()) + sum(
        int(r.get("lost_updates", 0)) for r in doc["handoff"].values()
    )
    out.append(
        _target(
            "no_overlaps",
            "0 overlapping critical sections, 0 lost counter updates (every contender)",
            f"overlaps {overlaps}, lost updates {lost_updates}",
            overlaps == 0 and lost_updates == 0,
        )
    )
    mem = doc.get("memory_per_waiter", {})
    measured = [
        f"{svc} {m['kib_per_waiter']:.2f} KiB ({m['waiters']} waiters)"
        for svc, m in mem.items()
        if "kib_per_waiter" in m
    ]
    out.append(
        _target(
            "memory_per_waiter",
            "memory per waiting task <= 5 KiB on every backend, the task included",
            "; ".join(measured) or "n/a",
            None
            if not measured
            else all(m.get("kib_per_waiter", 1e9) <= 5 for m in mem.values()),
        )
    )
    out += _redis_waiter_targets(doc)
    del plan
    return out


def _redis_waiter_targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Many waiters on one Redis lock, side by side with python-redis-lock; loss latency."""
    out: list[dict[str, Any]] = []
    rows = doc.get("redis_many_waiters", {}).get("rows", [])
    ours = [r for r in rows if r["library"] == "aiolocks-redis"]
    peer = {(r["processes"], r["tasks"]): r for r in rows if r["library"] == "python-redis-lock"}

    def per(field: str) -> str:
        return ", ".join(
            f"{r['processes']}x{r['tasks']}: {float(r[field]):.3g}"
            + (
                f" vs {float(peer[(r['processes'], r['tasks'])][field]):.3g}"
                if (r["processes"], r["tasks"]) in peer
                and peer[(r["processes"], r["tasks"])].get(field) is not None
                else ""
            )
            for r in ours
            if r.get(field) is not None
        )

    def le_peer(field: str) -> bool | None:
        pairs = [
            (float(r[field]), float(peer[(r["processes"], r["tasks"])][field]))
            for r in ours
            if (r["processes"], r["tasks"]) in peer
            and r.get(field) is not None
            and peer[(r["processes"], r["tasks"])].get(field) is not None
        ]
        return None if not pairs else all(a <= p for a, p in pairs)

    evalsha = [
        float(r["server_evalsha_per_hold"]) for r in ours if r.get("server_evalsha_per_hold")
    ]
    out.append(
        _target(
            "redis_many_waiters_evalsha",
            "many waiters on one Redis lock: EVALSHA per acquisition <= 1.5, flat in W",
            per("server_evalsha_per_hold") or "not run",
            None if not evalsha else max(evalsha) <= 1.5,
        )
    )
    for field, goal in (
        ("server_commands_per_hold", "commands executed per acquisition <= python-redis-lock's"),
        ("server_cpu_us_per_hold", "server CPU per acquisition <= python-redis-lock's"),
    ):
        out.append(
            _target(
                f"redis_many_waiters_{field.split('_')[1]}",
                f"many waiters on one Redis lock: {goal}",
                per(field) or "not run",
                le_peer(field),
            )
        )
    loss = doc.get("loss_latency", {}).get("redis", {})
    p99 = loss.get("p99_ms")
    out.append(
        _target(
            "redis_loss_latency",
            "Redis key deleted behind the holder -> body cancelled: p99 <= 1 s",
            "n/a"
            if p99 is None
            else f"p50 {loss['p50_ms']:.3g} ms, p99 {p99:.3g} ms, missed {loss['missed']}",
            None if p99 is None or math.isnan(p99) else p99 <= 1000 and loss["missed"] == 0,
        )
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="aiolocks side by side with redis-py, python-redis-lock, pottery, "
        "aioredlock, kazoo and aiozk, on servers it starts itself.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes (about 2 minutes)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument(
        "--only-service",
        choices=["redis", "zookeeper", "postgres"],
        help="run only one part",
    )
    parser.add_argument(
        "--contenders",
        help="comma-separated peer keys to include (aiolocks always runs), e.g. redis-py,kazoo",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="folder for latest.json / latest.png"
    )
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also write docs/benchmarks.md and docs/benchmarks.png (default: full runs only)",
    )
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--from-json",
        type=Path,
        help="do not run: render the table, chart and docs again from a results file",
    )
    args = parser.parse_args(argv)
    if args.from_json is not None:
        import json

        doc = json.loads(args.from_json.read_text())
        print(_report.table(doc))
        if not args.no_chart:
            _report.chart(doc, args.out / "latest.png")
        if args.docs is not False:
            shutil.copyfile(args.out / "latest.png", DOCS / "benchmarks.png")
            _report.write_markdown(doc, DOCS / "benchmarks.md")
        return 0
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    plan = PLANS[mode]
    services = {args.only_service} if args.only_service else {"redis", "zookeeper", "postgres"}
    only = set(args.contenders.split(",")) if args.contenders else None
    warnings.simplefilter("ignore")  # peers' deprecation noise must not reach the table
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="aiolocks-bench-") as tmp:
        doc = asyncio.run(run(plan, services=services, only=only, workdir=Path(tmp)))
    doc["meta"]["mode"] = mode
    json_path = args.out / "latest.json"
    _report.write_json(doc, json_path)
    print(_report.table(doc))
    png_path = args.out / "latest.png"
    if not args.no_chart:
        _report.chart(doc, png_path)
    write_docs = args.docs if args.docs is not None else mode == "full"
    if write_docs:
        DOCS.mkdir(exist_ok=True)
        if png_path.exists():
            shutil.copyfile(png_path, DOCS / "benchmarks.png")
        _report.write_markdown(doc, DOCS / "benchmarks.md")
    _log(f"wrote {json_path}" + ("" if args.no_chart else f" and {png_path}"))
    return 0
