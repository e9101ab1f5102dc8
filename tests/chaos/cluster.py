"""The cluster fault runner: a seeded, bounded fault schedule against a replicated topology.

:func:`tests.chaos.checker.run_chaos` throws random faults at one server for
a fixed time. This module runs the same workers (``_worker.py``, several
processes, several tasks each, contending on a few locks, every critical
section fenced by the checker's :class:`~tests.chaos.checker.Register`)
against a *cluster* and drives a fixed schedule of cluster faults instead:

``isolate_leader``
    every worker's proxy to the leader (primary) is stalled for 1.5-2.5
    sessions: no client reaches it; clients connected to it must move on.
    Where members talk through proxies (:meth:`ClusterTopology.peer_links`)
    its links to its peers stall too: the majority elects another leader
``isolate_client``
    one worker can reach only one member that is not the leader (its proxies
    to every other member are stalled); with peer links that member is cut
    from its peers and the other workers too: a client on a minority side
``kill_member``
    SIGKILL (kill -9) of the leader or of another member, down 0.3-1
    session, started again on the same port
``pause_member``
    SIGSTOP of the leader or of another member for 1.5-2.5 sessions (past the
    session timeout / lease), then SIGCONT: a frozen member wakes up
    believing nothing happened
``failover``
    the topology's own failover (an election after the leader's SIGKILL;
    a Sentinel promotion; ``pg_ctl promote`` of a standby)

Each fault heals itself (proxies flow again, paused members continue,
killed members restart); the schedule has a quiet gap before each fault.
The schedule is drawn from the chaos seed before the run (the kinds in a
seeded order, with seeded targets, gaps and durations), so one seed replays
the same schedule. The short schedule (the default, for CI) runs every kind
once; ``AIOLOCKS_CHAOS_LONG=1`` runs :data:`LONG_ROUNDS` rounds, each with
one more fault where the topology allows it:

``restart_all``
    kill -9 of every member at once, then all started again (the data
    survives: ZooKeeper, etcd and PostgreSQL keep it on disk)

What comes out, besides the checker's counts (:func:`~tests.chaos.checker.analyze`):
the **loss window** of every fault, the time from the fault's start to the
first ``LockLostError`` a worker reported after it (and before the next
fault): how long a fault leaves a superseded holder running before the
library tells it. Faults after which no holder lost its lock have no window.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import statistics
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aiolocks.testing import TcpProxy

from .checker import Register, Report, WorkerPool, analyze, rng_for, workers_done

__all__ = [
    "FAULT_KINDS",
    "LONG_ROUNDS",
    "ClusterRun",
    "ClusterTopology",
    "FaultRecord",
    "MemberProcess",
    "Step",
    "chaos_long",
    "make_schedule",
    "run_cluster",
]

#: every kind of cluster fault, in the order the docs list them
FAULT_KINDS = ("isolate_leader", "isolate_client", "kill_member", "pause_member", "failover")
#: rounds of the long schedule (``AIOLOCKS_CHAOS_LONG=1``); the short one has 1
LONG_ROUNDS = 6


def chaos_long() -> bool:
    """Whether ``AIOLOCKS_CHAOS_LONG`` asks for the long schedule (``1``, ``yes``, ``true``)."""
    return os.environ.get("AIOLOCKS_CHAOS_LONG", "").strip().lower() in ("1", "yes", "true")


class MemberProcess(Protocol):
    """What the runner needs of a member's server process (the ``aiolocks.testing`` launchers)."""

    @property
    def pid(self) -> int | None:
        """The process id while it runs."""

    @property
    def running(self) -> bool:
        """Whether the process runs."""

    def kill(self) -> None:
        """SIGKILL and reap."""

    def start(self, *, wait: bool = True) -> Any:
        """Start on the same port (and folder)."""

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until it serves."""


@dataclass(frozen=True)
class Step:
    """One fault of the schedule, fixed by the seed before the run."""

    kind: str
    gap: float
    """Quiet seconds before the fault."""
    hold: float
    """How long the fault lasts before it heals (s)."""
    pick: float
    """A number in [0, 1) that chooses the target (member or worker)."""
    pick2: float
    """A second one (the minority member, the leader-or-not coin)."""


def make_schedule(
    rng: random.Random, kinds: Sequence[str], session: float, rounds: int
) -> list[Step]:
    """``rounds`` rounds of every kind in ``kinds``, each round in a seeded order."""
    steps: list[Step] = []
    for _ in range(rounds):
        order = list(kinds)
        rng.shuffle(order)
        steps.extend(
            Step(
                kind=kind,
                gap=rng.uniform(0.5, 1.5),
                hold=rng.uniform(1.5, 2.5) * session,
                pick=rng.random(),
                pick2=rng.random(),
            )
            for kind in order
        )
    return steps


@dataclass
class FaultRecord:
    """One fault as it was applied."""

    kind: str
    started: float
    """``time.monotonic()`` when the fault began (comparable with the workers' clocks)."""
    what: str
    healed: float = 0.0
    window: float | None = None
    """Seconds from ``started`` to the first loss reported after it (``None``: no loss)."""


class ClusterTopology(ABC):
    """A running cluster the runner can break: members, per-worker proxies, a leader.

    ``groups[w][m]`` is worker ``w``'s proxy to member ``m`` (a worker's URL
    names its own proxies), so a partition is a proxy rule. Subclasses say who
    leads, how to fail over, the workers' URLs and what counts as a leftover.
    """

    label: str
    session: float
    """The session timeout / lease (s): how long a fault must last to cost a lock."""
    can_restart_all = True
    """Whether the long schedule adds ``restart_all`` (every member killed and restarted)."""

    def __init__(self, members: Sequence[MemberProcess], groups: list[list[TcpProxy]]) -> None:
        self.members = list(members)
        self.groups = groups
        self.paused: set[int] = set()

    @abstractmethod
    def urls(self) -> list[str]:
        """One backend URL per worker."""

    @abstractmethod
    async def leader(self) -> int | None:
        """The index of the member that leads now (``None``: no leader known)."""

    @abstractmethod
    async def failover(self, step: Step) -> str:
        """Fail over (the topology's own way); return what happened."""

    @abstractmethod
    async def wait_healthy(self) -> None:
        """Wait until every member serves and a leader is elected again."""

    @abstractmethod
    async def leftovers(self) -> list[str]:
        """Lock keys / nodes / rows the run left on the cluster (after lapses)."""

    def kinds(self) -> tuple[str, ...]:
        """The fault kinds this topology supports (default: all)."""
        return FAULT_KINDS

    def peer_links(self, side: set[int]) -> list[TcpProxy]:
        """The proxies between members in ``side`` and the others (none: members talk directly)."""
        return []

    # -- the faults shared by every topology

    def pause(self, index: int) -> None:
        """SIGSTOP a member (its process leads its own group)."""
        pid = self.members[index].pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGSTOP)
            self.paused.add(index)

    def resume(self, index: int) -> None:
        """SIGCONT a member paused by :meth:`pause`."""
        pid = self.members[index].pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)
        self.paused.discard(index)

    async def target(self, step: Step) -> tuple[int, str]:
        """The leader (half of the time, by ``pick2``) or another member (by ``pick``)."""
        lead = await self.leader()
        if lead is not None and step.pick2 < 0.5:
            return lead, "leader"
        others = [i for i in range(len(self.members)) if i != lead]
        return others[int(step.pick * len(others))], "member"

    async def heal(self) -> None:
        """Every proxy flows, every paused member continues, every member runs; then settle."""
        for group in self.groups:
            for proxy in group:
                proxy.heal()
        for index in sorted(self.paused):
            self.resume(index)
        for member in self.members:
            if not member.running:
                await asyncio.to_thread(member.start)
        await self.wait_healthy()


async def _stalled(proxies: Sequence[TcpProxy], seconds: float) -> None:
    for proxy in proxies:
        proxy.stall()
    try:
        await asyncio.sleep(seconds)
    finally:
        for proxy in proxies:
            proxy.stall(False)


async def isolate_leader(topology: ClusterTopology, step: Step) -> str:
    """The leader alone on its side for ``step.hold`` seconds: cut from every client and peer."""
    lead = await topology.leader()
    if lead is None:
        return "no leader to isolate"
    peers = topology.peer_links({lead})
    await _stalled([group[lead] for group in topology.groups] + peers, step.hold)
    cut = f" and from its peers ({len(peers)} links)" if peers else ""
    return f"member {lead} (leader) cut off from every client{cut} for {step.hold:.2f}s"


async def isolate_client(topology: ClusterTopology, step: Step) -> str:
    """One worker and one non-leader member on the minority side for ``step.hold`` seconds.

    The worker reaches only that member; where members talk through proxies
    (:meth:`ClusterTopology.peer_links`) the member is cut from its peers and
    from the other workers too, so the worker's side has no quorum.
    """
    worker = int(step.pick * len(topology.groups))
    lead = await topology.leader()
    others = [i for i in range(len(topology.members)) if i != lead]
    keep = others[int(step.pick2 * len(others))]
    peers = topology.peer_links({keep})
    stalled = [proxy for i, proxy in enumerate(topology.groups[worker]) if i != keep]
    if peers:
        stalled += [group[keep] for w, group in enumerate(topology.groups) if w != worker]
    await _stalled(stalled + peers, step.hold)
    minority = " (a minority: member cut from its peers)" if peers else ""
    return f"worker {worker} reaches only member {keep}{minority} for {step.hold:.2f}s"


async def kill_member(topology: ClusterTopology, step: Step) -> str:
    """SIGKILL the leader or another member; start it again after a short while."""
    index, role = await topology.target(step)
    member = topology.members[index]
    await asyncio.to_thread(member.kill)
    down = step.hold / 2
    await asyncio.sleep(down)
    await asyncio.to_thread(member.start)
    return f"kill -9 of member {index} ({role}), down {down:.2f}s, restarted"


async def pause_member(topology: ClusterTopology, step: Step) -> str:
    """SIGSTOP the leader or another member past the session timeout, then SIGCONT."""
    index, role = await topology.target(step)
    topology.pause(index)
    try:
        await asyncio.sleep(step.hold)
    finally:
        topology.resume(index)
    return f"SIGSTOP of member {index} ({role}) for {step.hold:.2f}s, SIGCONT"


async def restart_all(topology: ClusterTopology, step: Step) -> str:
    """kill -9 of every member at once, down half the hold, then every member started again."""
    members = topology.members
    for member in members:
        await asyncio.to_thread(member.kill)
    topology.paused.clear()
    down = step.hold / 2
    await asyncio.sleep(down)
    # all at once: a member of an ensemble serves only once a quorum runs
    for member in members:
        await asyncio.to_thread(member.start, wait=False)
    for member in members:
        await asyncio.to_thread(member.wait_ready)
    return f"kill -9 of all {len(members)} members, down {down:.2f}s, all restarted"


FaultFn = Callable[[ClusterTopology, Step], Awaitable[str]]

FAULTS: dict[str, FaultFn] = {
    "isolate_leader": isolate_leader,
    "isolate_client": isolate_client,
    "kill_member": kill_member,
    "pause_member": pause_member,
    "restart_all": restart_all,
}


async def apply(topology: ClusterTopology, step: Step) -> str:
    """Apply one step (``failover`` is the topology's own)."""
    if step.kind == "failover":
        return await topology.failover(step)
    return await FAULTS[step.kind](topology, step)


# -- one run -------------------------------------------------------------------------------


@dataclass
class ClusterRun:
    """The outcome of one cluster run: the checker's report and every fault with its window."""

    report: Report
    schedule: list[Step]
    faults: list[FaultRecord] = field(default_factory=list)
    pool: WorkerPool | None = None
    errors: list[str] = field(default_factory=list)
    """Critical sections that ended with an error other than loss, timeout, unavailable."""

    def windows(self) -> dict[str, list[float]]:
        """The loss windows (s) of each fault kind, of the faults that cost a lock."""
        found: dict[str, list[float]] = {}
        for fault in self.faults:
            if fault.window is not None:
                found.setdefault(fault.kind, []).append(fault.window)
        return found

    def window_text(self) -> str:
        """``kind n/m max Xs median Ys`` per kind: faults that cost a lock, and how fast."""
        counts = Counter(fault.kind for fault in self.faults)
        windows = self.windows()
        parts = []
        for kind in sorted(counts):
            found = windows.get(kind, [])
            text = f"{kind} {len(found)}/{counts[kind]}"
            if found:
                text += f" median {statistics.median(found):.2f}s max {max(found):.2f}s"
            parts.append(text)
        return "; ".join(parts)

    def summary(self) -> str:
        """The checker's summary line plus the loss windows."""
        return f"{self.report.summary()}; LOSS WINDOWS (faults that cost a lock) " + (
            self.window_text() or "none"
        )

    def events(self) -> list[str]:
        """One line per fault, for failure messages."""
        if not self.faults:
            return []
        zero = self.faults[0].started
        lines = []
        for fault in self.faults:
            window = "no loss" if fault.window is None else f"loss after {fault.window:.2f}s"
            lines.append(f"{fault.started - zero:7.2f}s {fault.kind}: {fault.what} ({window})")
        return lines

    def as_json(self) -> dict[str, Any]:
        """The report's figures plus the faults and their windows."""
        data = self.report.as_json()
        data["cluster_faults"] = [fault.__dict__ for fault in self.faults]
        data["loss_windows"] = self.windows()
        data["errors"] = self.errors
        return data


def loss_windows(faults: list[FaultRecord], register: Register) -> None:
    """Set each fault's window: its start to the first loss reported before the next fault."""
    losses = sorted(
        rec.reported / 1e9
        for rec in register.records
        if rec.outcome == "lost" and rec.reported is not None
    )
    for index, fault in enumerate(faults):
        until = faults[index + 1].started if index + 1 < len(faults) else float("inf")
        after = [t for t in losses if fault.started <= t < until]
        fault.window = after[0] - fault.started if after else None


async def _drive(topology: ClusterTopology, steps: list[Step], run: ClusterRun) -> None:
    """Apply the schedule, healing after every fault so the next one starts from health."""
    for step in steps:
        await asyncio.sleep(step.gap)
        started = time.monotonic()
        try:
            what = await apply(topology, step)
        finally:
            await topology.heal()
        run.faults.append(FaultRecord(step.kind, started, what, time.monotonic()))


async def run_cluster(
    topology: ClusterTopology,
    log_dir: Path,
    *,
    locks: int = 3,
    tasks: int = 3,
    work: float = 0.15,
    settle: float = 2.0,
    rounds: int | None = None,
) -> ClusterRun:
    """Run the workers against ``topology`` under its seeded schedule; analyze; check leaks.

    The workers run until the schedule is done (then ``settle`` seconds on a
    healed cluster) and are stopped with SIGTERM; each finishes its critical
    section, closes its backend and reports.
    """
    rng, seed = rng_for(topology.label)
    if rounds is None:
        rounds = LONG_ROUNDS if chaos_long() else 1
    kinds = topology.kinds()
    if rounds > 1 and topology.can_restart_all:
        kinds += ("restart_all",)
    steps = make_schedule(rng, kinds, topology.session, rounds)
    register = Register()
    await register.start()
    grace = topology.session * 3 + 4
    acquire_timeout = topology.session * 4 + 5
    config: dict[str, Any] = {
        "name": f"chaos/{topology.label}/{seed}",
        "locks": locks,
        "tasks": tasks,
        "duration": 3600.0,  # stopped by SIGTERM once the schedule is done
        "work": work,
        "grace": grace,
        "acquire_timeout": acquire_timeout,
        "block": topology.session * 1.5,
        "seed": seed,
    }
    pool = WorkerPool(register, config, topology.urls())
    run = ClusterRun(Report(topology.label, seed), steps, pool=pool)
    started = time.monotonic()
    try:
        await pool.start(log_dir)
        await _drive(topology, steps, run)
        await asyncio.sleep(settle)
        codes = await workers_done(pool, register, acquire_timeout + grace + 30, stop=True)
    except BaseException:
        await pool.kill_all()
        raise
    finally:
        await register.stop()
    run.report = _finish(topology.label, seed, register, codes, started)
    loss_windows(run.faults, register)
    run.errors = [
        f"{rec.cs} {rec.outcome}: {rec.detail}"
        for rec in register.records
        if rec.outcome.startswith("error:")
    ]
    run.report.faults = Counter(fault.kind for fault in run.faults)
    leftovers = await topology.leftovers()
    run.report.leaked = len(leftovers)
    run.report.problems.extend(f"left on the cluster: {item}" for item in leftovers[:20])
    return run


def _finish(label: str, seed: int, register: Register, codes: list[int], started: float) -> Report:
    report = analyze(label, seed, register)
    report.duration = time.monotonic() - started
    for index, code in enumerate(codes):
        if code or register.worker(index).done is None:
            report.problems.append(f"worker {index} did not finish cleanly (exit code {code})")
    return report


class Vip:
    """A virtual address that follows the primary: a forwarder whose target can move.

    What keepalived or a load balancer's health check does in front of a
    PostgreSQL pair: clients connect to one address; on failover it is moved
    to the new primary and the connections to the old one are dropped.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> Vip:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.close()
        self._drop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def move(self, host: str, port: int) -> None:
        """Point at another server; every open connection is dropped (the old path is gone)."""
        self.target = (host, port)
        self._drop()

    def _drop(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            up_reader, upstream = await asyncio.open_connection(*self.target)
            self._writers.add(upstream)
            async with asyncio.TaskGroup() as group:
                group.create_task(_pump(reader, upstream))
                group.create_task(_pump(up_reader, writer))
        except (OSError, asyncio.CancelledError, ExceptionGroup):
            return
        finally:
            # Cleanup path: no socket outlives its handler.
            for side in (writer, upstream):
                if side is not None:
                    side.transport.abort()
                    self._writers.discard(side)
            self._tasks.discard(task)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.transport.abort()
