"""Redlock under clock jumps and process pauses: the faults of Kleppmann's critique.

Redlock (``redlock://``) takes a lock on a majority of N independent Redis
masters. Its safety rests on timing: bounded clock drift between masters and
bounded pauses of clients. This runner breaks both while the chaos workers
(``_worker.py``: several processes, several tasks each, contending on a few
locks, every critical section fenced by the checker's
:class:`~tests.chaos.checker.Register`) take locks over N masters that the
test starts (3 by default, 5 in the full set):

``jump_minority``
    the clocks of N - quorum masters jump forward: each drops every lock
    key of the run at once (``PEXPIRE key 1`` behind the library's back,
    which is what a jump past the keys' expiry does to them). A hold on
    every master keeps a quorum; one granted by a bare quorum (after a
    split vote) does not.
``jump_majority``
    the same on a quorum of masters: the lock is free there, so a contender
    takes it if it tries before the holder's watchdog renews (or its
    release) finds the field gone: two holders at once.
``jump_and_restart``
    one master fewer than a quorum jumps and another is killed (``kill -9``)
    and started again at once, without persistence, so it comes back empty
    (Kleppmann's example; the Redis docs' remedy is to keep a crashed master
    down longer than the longest lease).
``pause_client``
    ``SIGSTOP`` of one worker process that is in a critical section (the
    register's last write of a lock is its ``begin``) for 1.5-2.5 leases,
    then ``SIGCONT``: a process pause (GC, swap, a stopped VM) past its lease.
``block_holder``
    one worker's event loop stands still for 1.5 leases inside its next
    critical section, between its two writes (``SIGUSR1``, see ``_worker.py``):
    the paused holder that wakes up and writes.

Each clock-jump fault jumps :data:`JUMPS` times, a quarter of a lease apart:
whether a jump lets a second holder in is a race between the holder's next
renewal (or release) and a contender's next try.

The schedule is drawn from the chaos seed before the run (the kinds in a
seeded order, seeded targets, gaps and lengths), as in :mod:`tests.chaos.cluster`,
whose records and loss windows this runner reuses. On top of the checker's
counts it lists every **supersession**: two critical sections of one lock
that overlapped in real time (the older, by fencing token, still in its
body when the newer began), with the fault it followed, whether the older
holder was told (``LockLostError``), how long after the fault, and whether
the fenced store refused one of its writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio

from aiolocks.testing.servers import RedisServer

from .checker import CsRecord, Register, Report, WorkerPool, analyze, rng_for, workers_done
from .cluster import LONG_ROUNDS, ClusterRun, FaultRecord, Step, chaos_long, loss_windows

__all__ = [
    "JUMP_KINDS",
    "KINDS",
    "LEASE",
    "PAUSE_KINDS",
    "RedlockMasters",
    "RedlockRun",
    "Supersession",
    "chaos_all",
    "run_redlock",
    "supersessions",
]

#: the lease of every hold (s); the watchdog renews every third of it
LEASE = 2.0
#: faults that expire the lock on masters (a clock jump forward, an empty restart)
JUMP_KINDS = ("jump_minority", "jump_majority", "jump_and_restart")
#: faults that stop a client past its lease
PAUSE_KINDS = ("pause_client", "block_holder")
KINDS = JUMP_KINDS + PAUSE_KINDS
WORKERS = 3
#: locks the workers contend on: a clock jump expires all of them, each a
#: race between the holder's watchdog and a contender's next try
LOCKS = 3


def chaos_all() -> bool:
    """``AIOLOCKS_CHAOS_ALL=1`` or the long schedule: run the variants too (5 masters)."""
    flag = os.environ.get("AIOLOCKS_CHAOS_ALL", "").strip().lower() in ("1", "yes", "true")
    return flag or chaos_long()


class RedlockMasters:
    """N independent ``redis-server`` processes (no persistence) and the faults on them."""

    def __init__(self, count: int) -> None:
        self.servers = [RedisServer() for _ in range(count)]
        self.quorum = count // 2 + 1
        self.prefix = f"redlock-chaos-{os.getpid()}-{random.randrange(1 << 30):x}:"

    def start(self) -> None:
        """Start every master."""
        for server in self.servers:
            server.start()

    def close(self) -> None:
        """Stop every master (cleanup path: whatever happened)."""
        for server in self.servers:
            server.close()

    def urls(self) -> list[str]:
        """One ``redlock://`` URL per worker, naming every master."""
        hosts = ",".join(f"{server.host}:{server.port}" for server in self.servers)
        options = f"key_prefix={self.prefix}&lease_time={LEASE:g}&connect_timeout=2"
        return [f"redlock://{hosts}?{options}"] * WORKERS

    def pick(self, step: Step, count: int, avoid: Sequence[int] = ()) -> list[int]:
        """``count`` masters chosen by the step's seeded ``pick`` (none of ``avoid``)."""
        choices = [index for index in range(len(self.servers)) if index not in avoid]
        return sorted(random.Random(step.pick).sample(choices, count))

    async def jump(self, indexes: Sequence[int]) -> int:
        """The clocks of these masters jump past every lease: each lock key expires in 1 ms.

        Returns how many keys were expired (0: no lock was held anywhere).
        """
        return await expire_now([self.servers[index] for index in indexes], self.prefix)

    async def restart(self, index: int) -> None:
        """``kill -9`` and start again on the same port, at once: it comes back empty."""
        server = self.servers[index]
        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(server.start)

    async def heal(self) -> None:
        """Every master runs and answers."""
        for server in self.servers:
            if not server.running:
                await asyncio.to_thread(server.start)
            await asyncio.to_thread(server.command, "PING")

    async def leftovers(self, within: float) -> list[str]:
        """Keys of the run left on any master after ``within`` s (lapsing leases)."""
        deadline = time.monotonic() + within
        while True:
            found: list[str] = []
            for server in self.servers:
                client = redis.asyncio.Redis(host=server.host, port=server.port)
                try:
                    keys = await client.keys(f"{self.prefix}*")
                finally:
                    await client.aclose()
                found += [f"{server.port}:{key!r}" for key in keys]
            if not found or time.monotonic() > deadline:
                return sorted(found)
            await asyncio.sleep(0.1)


# -- the faults ----------------------------------------------------------------------------


#: a clock-jump fault jumps this many times, a quarter of a lease apart: each
#: jump is a race between the holder's next renewal (or release) and a
#: contender's next try, which the contender wins about half the time
JUMPS = 2


async def expire_now(servers: Sequence[RedisServer], prefix: str) -> int:
    """A clock jump past every lease on ``servers``: each key of ``prefix`` expires in 1 ms.

    Redis cannot move its clock; ``PEXPIRE key 1`` behind the library's back
    acts on a lock the way a jump forward does. Returns how many keys there were.
    """
    expired = 0
    for server in servers:
        client = redis.asyncio.Redis(host=server.host, port=server.port)
        try:
            for key in await client.keys(f"{prefix}*"):
                expired += int(await client.pexpire(key, 1))
        finally:
            await client.aclose()
    return expired


@dataclass
class Faults:
    """The faults of one run: the masters, the worker processes, who is stopped now."""

    masters: RedlockMasters
    pool: WorkerPool
    register: Register
    block: float
    """How long ``block_holder`` stands a worker's event loop still (s)."""
    stopped: set[int] = field(default_factory=set)

    def holder(self, step: Step) -> int:
        """A worker in a critical section now (the register's last write of a lock is
        its ``begin``), chosen by ``step.pick``; any worker when none is."""
        last: dict[str, str] = {}
        for entry in self.register.log:
            if entry.accepted:
                last[entry.lock] = entry.cs if entry.phase == "begin" else ""
        holders = sorted({int(cs[1:].partition("t")[0]) for cs in last.values() if cs})
        if not holders:
            return int(step.pick * self.pool.count)
        return holders[int(step.pick * len(holders))]

    async def apply(self, step: Step) -> str:
        """Apply one step; return what was done."""
        if step.kind in JUMP_KINDS:
            texts = []
            for jump in range(JUMPS):
                if jump:
                    await asyncio.sleep(LEASE / 4)
                texts.append(await self.jump(step))
            text = "; ".join(texts)
        elif step.kind == "pause_client":
            index = self.holder(step)
            self.pool.signal(index, signal.SIGSTOP)
            self.stopped.add(index)
            await asyncio.sleep(step.hold)
            self.resume()
            return f"SIGSTOP of worker {index} (a holder) for {step.hold:.2f}s, SIGCONT"
        else:
            index = int(step.pick * self.pool.count)
            text = await self.block_next_section(index)
        # Let the fault play out (contenders retry within a third of the lease,
        # the holders' watchdogs renew as often) before the next one.
        await asyncio.sleep(LEASE / 2)
        return text

    async def jump(self, step: Step) -> str:
        """One clock jump of ``step``'s kind."""
        masters = self.masters
        if step.kind == "jump_and_restart":
            which = masters.pick(step, masters.quorum - 1)
            restarted = masters.pick(step, 1, avoid=which)[0]
            expired = await masters.jump(which)
            await masters.restart(restarted)
            return (
                f"clock jump on masters {which} ({expired} lock keys expired early), "
                f"master {restarted} restarted empty"
            )
        minority = len(masters.servers) - masters.quorum
        which = masters.pick(step, minority if step.kind == "jump_minority" else masters.quorum)
        expired = await masters.jump(which)
        return f"clock jump on masters {which}: {expired} lock keys expired early"

    async def block_next_section(self, index: int) -> str:
        """Worker ``index``'s loop stands still in its next section; wait until it did."""
        seen = len(self.register.log)
        self.pool.signal(index, signal.SIGUSR1)

        def began() -> bool:
            # its next ``begin`` is where it blocks (right after the reply)
            fresh = self.register.log[seen:]
            return any(e.phase == "begin" and e.cs.startswith(f"w{index}t") for e in fresh)

        with contextlib.suppress(TimeoutError):
            await self.register.wait_for(began, timeout=LEASE * 4 + 5, what="a blocked section")
        await asyncio.sleep(self.block)
        return f"worker {index}: event loop blocked {self.block:.2f}s in its next section"

    def resume(self) -> None:
        """SIGCONT every worker this run stopped."""
        for index in sorted(self.stopped):
            self.pool.signal(index, signal.SIGCONT)
        self.stopped.clear()

    async def heal(self) -> None:
        """Every worker runs, every master runs and answers."""
        self.resume()
        await self.masters.heal()


# -- what came out ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Supersession:
    """Two holders of one lock at once: ``newer`` began while ``older`` was still in its body."""

    lock: str
    older: str
    newer: str
    older_token: int
    newer_token: int
    fault: str
    """The kind of the fault it is put down to (``""``: before any fault)."""
    fault_started: float
    """When that fault began (``time.monotonic()``; 0: none)."""
    told: bool
    """Whether the older holder's section ended with ``LockLostError``."""
    rejected: bool
    """Whether the fenced store refused one of the older holder's writes."""
    told_after: float | None
    """Seconds from the fault to the older holder being told (``None``: not told)."""
    how: str
    """What told the older holder: ``renewal`` (the watchdog found its field gone
    on a majority), ``release`` (its release did), ``lease`` (its lease ran out
    before a renewal, seen when it woke up), ``other``; ``""``: not told."""
    believed: float | None
    """Seconds from the newer holder's start to the older one being told: how long
    the superseded holder went on believing it held the lock (``None``: not told)."""
    overlap: float
    """Seconds both were in their bodies."""


def supersessions(register: Register, faults: Sequence[FaultRecord]) -> list[Supersession]:
    """Every pair of critical sections of one lock that overlapped in real time.

    A pair is put down to the last fault before the *first* holder that
    overlapped its older side: a holder paused by one fault may still be
    overlapped by newer holders after the next fault began.
    """
    entered = [r for r in register.records if r.start is not None and r.token is not None]
    pairs: list[tuple[str, CsRecord, CsRecord]] = []
    for lock in sorted({r.lock for r in entered}):
        active: list[CsRecord] = []
        for rec in sorted((r for r in entered if r.lock == lock), key=lambda r: r.start or 0):
            start = rec.start or 0
            active = [a for a in active if (a.end or sys.maxsize) > start]
            pairs.extend(
                (lock, *((other, rec) if (other.token or 0) < (rec.token or 0) else (rec, other)))
                for other in active
            )
            active.append(rec)
    first: dict[str, float] = {}
    for _, older, newer in pairs:
        began = max(older.start or 0, newer.start or 0) / 1e9
        first[older.cs] = min(first.get(older.cs, began), began)
    return [_pair(lock, older, newer, faults, first[older.cs]) for lock, older, newer in pairs]


def _pair(
    lock: str,
    older: CsRecord,
    newer: CsRecord,
    faults: Sequence[FaultRecord],
    first: float,
) -> Supersession:
    began = max(older.start or 0, newer.start or 0) / 1e9
    before = [fault for fault in faults if fault.started <= first]
    fault = before[-1] if before else None
    told = older.outcome == "lost"
    after = believed = None
    if told and older.reported is not None:
        believed = older.reported / 1e9 - began
        if fault is not None:
            after = older.reported / 1e9 - fault.started
    ends = [r.end or r.reported or 0 for r in (older, newer)]
    return Supersession(
        lock=lock,
        older=older.cs,
        newer=newer.cs,
        older_token=older.token or 0,
        newer_token=newer.token or 0,
        fault=fault.kind if fault is not None else "",
        fault_started=fault.started if fault is not None else 0.0,
        told=told,
        rejected=older.rejected,
        told_after=after,
        how=_how(older) if told else "",
        believed=believed,
        overlap=max(0.0, min(ends) / 1e9 - began),
    )


def _how(record: CsRecord) -> str:
    """What told a holder its lock was lost, from its ``LockLostError`` message."""
    for marker, how in (
        ("already gone on the server when it was released", "release"),
        ("Redlock masters", "renewal"),
        ("ran out", "lease"),
        ("no successful renewal", "lease"),
    ):
        if marker in record.detail:
            return how
    return "other"


@dataclass
class RedlockRun:
    """A cluster-runner record of the run plus its supersessions."""

    run: ClusterRun
    masters: int
    found: list[Supersession] = field(default_factory=list)
    told_at_release: int = 0
    """Sections told of their loss by their release (their field gone on a majority of
    masters, their watchdog not due yet), overlapped or not."""

    def by_kind(self, kinds: Sequence[str]) -> list[Supersession]:
        """The supersessions that followed a fault of one of ``kinds``."""
        return [s for s in self.found if s.fault in kinds]

    def text(self) -> str:
        """``kind n after k of m faults (told t, refused r, windows)`` per fault kind."""
        parts = []
        counts = Counter(fault.kind for fault in self.run.faults)
        for kind in sorted(counts):
            found = self.by_kind([kind])
            bit = len({s.fault_started for s in found})
            part = (
                f"{kind} {len(found)} after {bit} of {counts[kind]} faults "
                f"(told {sum(s.told for s in found)}, "
                f"stale write refused {sum(s.rejected for s in found)}"
            )
            hows = Counter(s.how for s in found if s.how)
            if hows:
                part += ", told by " + " ".join(f"{k} {v}" for k, v in sorted(hows.items()))
            told = [s.told_after for s in found if s.told_after is not None]
            believed = [s.believed for s in found if s.believed is not None]
            if told:
                part += f", fault->told {_spread(told)}"
            if believed:
                part += f", second holder in->told {_spread(believed)}"
            parts.append(part + ")")
        early = self.by_kind([""])
        if early:
            parts.append(f"before any fault {len(early)}")
        return "; ".join(parts) or "none"

    def summary(self) -> str:
        """The cluster runner's summary plus the supersessions."""
        return (
            f"{self.run.summary()}; SUPERSESSIONS {len(self.found)}: {self.text()}; "
            f"losses told at release {self.told_at_release}"
        )

    def as_json(self) -> dict[str, Any]:
        """Every figure, the supersessions included."""
        data = self.run.as_json()
        data["masters"] = self.masters
        data["supersessions"] = [s.__dict__ for s in self.found]
        data["told_at_release"] = self.told_at_release
        return data


def _spread(values: Sequence[float]) -> str:
    return f"median {statistics.median(values):.2f}s max {max(values):.2f}s"


# -- one run -------------------------------------------------------------------------------


def schedule(rng: random.Random, rounds: int) -> list[Step]:
    """``rounds`` rounds of every kind in a seeded order (gaps 0.3-0.8 s, pauses 1.5-2.5 leases)."""
    steps: list[Step] = []
    for _ in range(rounds):
        order = list(KINDS)
        rng.shuffle(order)
        steps.extend(
            Step(kind, rng.uniform(0.3, 0.8), rng.uniform(1.5, 2.5) * LEASE, rng.random(), 0.0)
            for kind in order
        )
    return steps


async def _drive(faults: Faults, steps: Sequence[Step], records: list[FaultRecord]) -> None:
    for step in steps:
        await asyncio.sleep(step.gap)
        started = time.monotonic()
        try:
            what = await faults.apply(step)
        finally:
            await faults.heal()
        records.append(FaultRecord(step.kind, started, what, time.monotonic()))


async def run_redlock(
    masters: RedlockMasters, log_dir: Path, *, rounds: int | None = None
) -> RedlockRun:
    """The workers over ``masters`` under the seeded schedule; analyze; check leaks."""
    label = f"redlock-{len(masters.servers)}"
    rng, seed = rng_for(label)
    steps = schedule(rng, rounds or (LONG_ROUNDS if chaos_long() else 1))
    register = Register()
    await register.start()
    grace, acquire_timeout = LEASE * 3 + 4, LEASE * 4 + 5
    config: dict[str, Any] = {
        "name": f"chaos/{label}/{seed}",
        "locks": LOCKS,
        "tasks": 3,
        "duration": 3600.0,  # stopped by SIGTERM once the schedule is done
        # long sections (up to a lease): a fault finds holders in their
        # bodies, and contenders retry (every third of a lease) meanwhile
        "work": LEASE,
        "grace": grace,
        "acquire_timeout": acquire_timeout,
        "block": LEASE * 1.5,
        "seed": seed,
    }
    pool = WorkerPool(register, config, masters.urls())
    faults = Faults(masters, pool, register, block=LEASE * 1.5)
    run = ClusterRun(Report(label, seed), steps, pool=pool)
    started = time.monotonic()
    try:
        await pool.start(log_dir)
        await _drive(faults, steps, run.faults)
        await asyncio.sleep(1.0)
        codes = await workers_done(pool, register, acquire_timeout + grace + 30, stop=True)
    except BaseException:
        faults.resume()
        await pool.kill_all()
        raise
    finally:
        await register.stop()
    return await _finish(run, register, masters, codes, started)


async def _finish(
    run: ClusterRun,
    register: Register,
    masters: RedlockMasters,
    codes: list[int],
    started: float,
) -> RedlockRun:
    report = analyze(run.report.label, run.report.seed, register)
    report.duration = time.monotonic() - started
    report.faults = Counter(fault.kind for fault in run.faults)
    for index, code in enumerate(codes):
        if code or register.worker(index).done is None:
            report.problems.append(f"worker {index} did not finish cleanly (exit code {code})")
    run.report = report
    loss_windows(run.faults, register)
    run.errors = [
        f"{rec.cs} {rec.outcome}: {rec.detail}"
        for rec in register.records
        if rec.outcome.startswith("error:")
    ]
    leftovers = await masters.leftovers(within=LEASE + 5)
    report.leaked = len(leftovers)
    report.problems.extend(f"left on a master: {item}" for item in leftovers[:20])
    result = RedlockRun(run, len(masters.servers))
    result.found = supersessions(register, run.faults)
    result.told_at_release = sum(
        rec.outcome == "lost" and _how(rec) == "release" for rec in register.records
    )
    return result
