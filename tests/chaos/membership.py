"""The membership checker: group members run a Partitioner under faults, and are judged.

Each *worker* slot runs one member at a time (an *incarnation*: a fresh
backend, a fresh member id) that joins one group and iterates
``Partitioner(member).changes()`` over a fixed key set, recording with a
``time.monotonic()`` stamp every view it acted on (membership version, the
member ids, the keys it owns) and, when it happens, the ``LockLostError``
that told it its membership was lost. Faults end memberships on purpose
(a graceful leave, the backend closed as a dying process would, the record
deleted by an operator, the connection partitioned away, a server-side
session kill); :meth:`MembershipRun.report` then checks:

(a) no key is owned by two members under the same membership version (and
    every member that read one version read the same member list);
(b) every departure is seen by every member alive from the departure until
    the end: a view of its without the departed id, stamped after the
    departure (the window is measured and reported, not asserted);
(c) once every member left, ``group.members()`` is empty;
(d) no loss is silent: every member a fault ended was told (LockLostError
    or ``is_lost``), and every member that was never told is still listed
    by the group at the end, before it leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiolocks
from aiolocks import LockLostError, Partitioner
from aiolocks._core.group import member_child
from aiolocks._core.partitioner import rendezvous_owner
from aiolocks.testing import TcpProxy

from ..polling import eventually

__all__ = ["Incarnation", "MembershipReport", "MembershipRun", "View"]

#: the departure of the members still there at the end (not a fault; not judged by (b))
FINAL = "final leave"

#: a fault: it picks a live incarnation (or none) and ends or disturbs it
Fault = Callable[["MembershipRun", random.Random], Awaitable[str]]


@dataclass(frozen=True)
class View:
    """One membership view a member acted on."""

    at: float
    version: str
    members: tuple[str, ...]
    owned: frozenset[str]


@dataclass
class Incarnation:
    """One member: its id, its backend, what it saw and how it ended."""

    member_id: str
    worker: int
    backend: aiolocks.Backend
    views: list[View] = field(default_factory=list)
    joined_at: float | None = None
    #: when a fault or a leave ended (or tried to end) it, and which
    departed_at: float | None = None
    departure: str = ""
    lost_at: float | None = None
    lost_reason: str = ""
    task: asyncio.Task[None] | None = None
    member: aiolocks.Member | None = None

    @property
    def told(self) -> bool:
        """It was told its membership was lost (LockLostError or ``is_lost``)."""
        return self.lost_at is not None or (self.member is not None and self.member.is_lost)


@dataclass
class MembershipReport:
    """The outcome of a run: counts that must be 0, and the measured windows."""

    label: str
    views: int = 0
    versions: int = 0
    departures: dict[str, int] = field(default_factory=dict)
    windows: dict[str, list[float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: the figures of the run."""
        parts = [f"membership {self.label}: {self.views} views, {self.versions} versions"]
        for kind, seen in sorted(self.windows.items()):
            if seen:
                parts.append(
                    f"{kind} x{self.departures.get(kind, 0)} seen in "
                    f"max {max(seen):.2f} s (median {sorted(seen)[len(seen) // 2]:.2f} s)"
                )
        parts.append(f"problems {len(self.problems)}")
        return "; ".join(parts)


class MembershipRun:
    """Workers joining one group over ``urls`` (one per worker slot), with faults."""

    def __init__(
        self,
        label: str,
        urls: list[str],
        admin_url: str,
        *,
        keys: int = 200,
        proxies: list[TcpProxy] | None = None,
        bound: float = 30.0,
    ) -> None:
        self.label = label
        self.urls = urls
        self.admin_url = admin_url
        self.proxies = proxies
        self.bound = bound
        self.keys = [f"key-{index}" for index in range(keys)]
        self.group_name = f"chaos/members-{uuid.uuid4().hex[:10]}"
        self.incarnations: list[Incarnation] = []
        self.live: dict[int, Incarnation] = {}
        self._generation = 0
        #: what each fault did, stamped (for the failure message)
        self.events: list[str] = []

    # -- members -------------------------------------------------------------

    async def start(self, worker: int) -> Incarnation:
        """A new member on worker slot ``worker``; returns once it acted on a view with itself."""
        self._generation += 1
        backend = aiolocks.connect(self.urls[worker])._backend
        await backend.open()
        inc = Incarnation(f"w{worker}-g{self._generation}", worker, backend)
        self.incarnations.append(inc)
        self.live[worker] = inc
        task = inc.task = asyncio.ensure_future(self._run(inc))
        await eventually(
            lambda: bool(inc.views and inc.member_id in inc.views[-1].members) or task.done(),
            self.bound,
            what=f"{inc.member_id} to see itself in the group",
        )
        inc.joined_at = inc.views[0].at if inc.views else time.monotonic()
        return inc

    async def _run(self, inc: Incarnation) -> None:
        group = inc.backend.group(self.group_name)
        try:
            async with group.join(inc.member_id) as member:
                inc.member = member
                async for partition in Partitioner(member).changes():
                    owned = frozenset(partition.select(self.keys))
                    inc.views.append(
                        View(time.monotonic(), partition.version, partition.members, owned)
                    )
        except LockLostError as exc:
            inc.lost_at = time.monotonic()
            inc.lost_reason = str(exc)

    async def leave(self, inc: Incarnation, how: str = "leave") -> None:
        """End ``inc`` gracefully: its ``async with`` block is left, then its backend closed."""
        self.depart(inc, how)
        assert inc.task is not None
        inc.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await inc.task
        await inc.backend.close()

    def depart(self, inc: Incarnation, how: str, at: float | None = None) -> None:
        """Mark ``inc`` as departed by ``how`` (now, or at ``at``), before the fault acts."""
        if inc.departed_at is None:
            inc.departed_at, inc.departure = at or time.monotonic(), how
        if self.live.get(inc.worker) is inc:
            del self.live[inc.worker]

    def pick(self, rng: random.Random) -> Incarnation | None:
        """A random live member, or None when there is none."""
        if not self.live:
            return None
        return self.live[rng.choice(sorted(self.live))]

    async def wait_told(self, inc: Incarnation) -> None:
        """Wait until ``inc`` was told its membership is lost; then let its task end."""
        await eventually(lambda: inc.told, self.bound, what=f"{inc.member_id} to be told")
        assert inc.task is not None
        await asyncio.wait_for(asyncio.shield(inc.task), self.bound)
        await inc.backend.close()

    async def wait_seen(self) -> None:
        """Wait until every live member has seen every departure so far (check (b))."""
        await eventually(
            lambda: not self._unseen(), self.bound, what=f"departures seen: {self._unseen()}"
        )

    def _unseen(self) -> list[str]:
        return [
            f"{watcher.member_id} has not seen {gone.member_id} go"
            for gone in self.incarnations
            if gone.departed_at is not None
            for watcher in self.live.values()
            if _alive_through(watcher, gone.departed_at) and _seen_at(watcher, gone) is None
        ]

    async def _reap(self, how: str = "lost unasked", at: float | None = None) -> None:
        """Members told they were lost depart as ``how`` (at ``at``, else when told)."""
        for inc in list(self.live.values()):
            if inc.told:
                self.depart(inc, how, at or inc.lost_at)
                assert inc.task is not None
                await asyncio.wait_for(asyncio.shield(inc.task), self.bound)
                await inc.backend.close()

    async def sweep(self, how: str, action: Callable[[], Awaitable[str]]) -> str:
        """Run a fault that may end any membership (a restart, every session killed).

        Then wait until every member is either told it was lost or still
        listed by the group (no silent loss, check (d)); the told ones
        depart as ``how``, from the moment the fault began.
        """
        began = time.monotonic()
        done = await action()
        async with aiolocks.connect(self.admin_url) as admin:
            group = admin.group(self.group_name)

            async def settled() -> bool:
                listed = {member.id for member in await group.members()}
                return all(inc.told or inc.member_id in listed for inc in self.live.values())

            await eventually(settled, self.bound, what=f"every member told or listed after {how}")
        await self._reap(how, began)
        return done

    # -- the run -------------------------------------------------------------

    async def run(self, faults: dict[str, Fault], rounds: int, seed: int, workers: int) -> None:
        """Start ``workers`` members, then inject every fault once per round in a seeded
        order, each followed by the wait for everyone to have seen its effect."""
        rng = random.Random(f"{seed}-{self.label}")
        for worker in range(workers):
            await self.start(worker)
        for _ in range(rounds):
            names = sorted(faults)
            rng.shuffle(names)
            for name in names:
                self.events.append(f"{time.monotonic():.2f} {await faults[name](self, rng)}")
                await self._reap()
                for worker in range(workers):  # refill the slots a fault emptied
                    if worker not in self.live:
                        await self.start(worker)
                await self.wait_seen()

    async def finish(self) -> MembershipReport:
        """Heal, check (d) for the untold, leave everybody, check (c), build the report."""
        for proxy in self.proxies or []:
            proxy.heal()
        report = MembershipReport(self.label)
        async with aiolocks.connect(self.admin_url) as admin:
            group = admin.group(self.group_name)
            listed = {member.id for member in await group.members()}
            for inc in list(self.live.values()):
                if not inc.told and inc.member_id not in listed:
                    report.problems.append(f"(d) {inc.member_id} is gone but was never told")
            for inc in list(self.live.values()):
                await self.leave(inc, FINAL)

            async def empty() -> bool:
                return not await group.members()

            try:
                await eventually(empty, self.bound, what="the group to be empty")
            except AssertionError:
                left = [member.id for member in await group.members()]
                report.problems.append(f"(c) members left behind after all left: {left}")
        self._judge(report)
        return report

    def _judge(self, report: MembershipReport) -> None:
        """Checks (a), (b) and the (d) of the faulted, over everything recorded."""
        by_version: dict[str, tuple[str, ...]] = {}
        owners: dict[tuple[str, str], str] = {}
        for inc in self.incarnations:
            for view in inc.views:
                report.views += 1
                members = by_version.setdefault(view.version, view.members)
                if members != view.members:
                    report.problems.append(
                        f"(a) version {view.version}: {inc.member_id} read {view.members}, "
                        f"another member {members}"
                    )
                expected = {
                    key for key in self.keys if rendezvous_owner(view.members, key) == inc.member_id
                }
                if view.owned != expected:
                    report.problems.append(
                        f"(a) {inc.member_id} acted on {len(view.owned)} keys under "
                        f"{view.version}, rendezvous hashing over {view.members} gives "
                        f"{len(expected)}"
                    )
                for key in view.owned:
                    other = owners.setdefault((view.version, key), inc.member_id)
                    if other != inc.member_id:
                        report.problems.append(
                            f"(a) {key} owned by {other} and {inc.member_id} under {view.version}"
                        )
        report.versions = len(by_version)
        for gone in self.incarnations:
            if gone.departed_at is None or gone.departure == FINAL:
                continue
            kind = gone.departure
            report.departures[kind] = report.departures.get(kind, 0) + 1
            if kind != "leave" and not gone.told:
                report.problems.append(f"(d) {gone.member_id} ended by {kind} was never told")
            for watcher in self.incarnations:
                joined, left = watcher.joined_at, watcher.departed_at
                if watcher is gone or joined is None or joined > gone.departed_at:
                    continue
                if left is not None and left < gone.departed_at:
                    continue  # it was gone first
                seen = _seen_at(watcher, gone)
                if seen is not None:
                    window = max(0.0, seen - gone.departed_at)
                    report.windows.setdefault(kind, []).append(window)
                elif _alive_through(watcher, gone.departed_at):
                    report.problems.append(
                        f"(b) {watcher.member_id} never saw {gone.member_id} ({kind}) go"
                    )


def _alive_through(watcher: Incarnation, since: float) -> bool:
    """``watcher`` was a member at ``since`` and stayed one until the final leave."""
    joined = watcher.joined_at
    return (
        joined is not None
        and joined <= since
        and (watcher.departed_at is None or watcher.departure == FINAL)
    )


def _seen_at(watcher: Incarnation, gone: Incarnation) -> float | None:
    """When ``watcher`` first acted on a view without ``gone`` after its last view with it.

    ``None`` while its latest view still lists ``gone`` (or it has none).
    """
    last_with = -1
    for index, view in enumerate(watcher.views):
        if gone.member_id in view.members:
            last_with = index
    if last_with + 1 < len(watcher.views):
        return watcher.views[last_with + 1].at
    return None


def record_key(run: MembershipRun, inc: Incarnation) -> str:
    """The record key of a member (where ``group`` stores it)."""
    return f"group/{run.group_name}/{member_child(inc.member_id)}"


# -- faults ------------------------------------------------------------------


async def churn(run: MembershipRun, rng: random.Random) -> str:
    """A graceful leave; the slot's next member joins (a new id)."""
    inc = run.pick(rng)
    if inc is None:
        return "churn: nobody to leave"
    await run.leave(inc)
    return f"churn: {inc.member_id} left"


async def close(run: MembershipRun, rng: random.Random) -> str:
    """The member's backend is closed under it, as when its process ends."""
    inc = run.pick(rng)
    if inc is None:
        return "close: nobody"
    run.depart(inc, "close")
    await inc.backend.close()
    await run.wait_told(inc)
    return f"close: {inc.member_id}"


async def delete(run: MembershipRun, rng: random.Random) -> str:
    """An operator deletes the member's record (Redis key deleted, znode removed, row gone)."""
    inc = run.pick(rng)
    if inc is None:
        return "delete: nobody"
    async with aiolocks.connect(run.admin_url) as admin:
        run.depart(inc, "delete")
        deleted = await admin._driver.records().delete(record_key(run, inc))
    await run.wait_told(inc)
    return f"delete: {inc.member_id} ({deleted})"


async def partition(run: MembershipRun, rng: random.Random) -> str:
    """The member's connections are cut and refused until it is told; its session ends."""
    inc = run.pick(rng)
    if inc is None or run.proxies is None:
        return "partition: nobody"
    proxy = run.proxies[inc.worker]
    run.depart(inc, "partition")
    proxy.refuse(True)
    proxy.cut()
    try:
        await run.wait_told(inc)
    finally:
        proxy.heal()
    return f"partition: {inc.member_id}"
