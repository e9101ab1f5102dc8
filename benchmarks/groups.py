"""Groups and partitions, side by side with tooz: ``python -m benchmarks groups``.

On one local ZooKeeper and one local Redis server, ``--members`` members
(default 50, each with its own backend, so its own connection and session,
as separate processes would have) join a group, each running a partitioner.
A separate watcher watches the group, and in every round one more member
(the *probe*) joins and then leaves. Per round and per side:

* **join call / leave call** (ms): the probe's join (or leave) call itself;
* **watch join / watch leave** (ms): from that call being issued to the
  watcher observing the new member list (timed from the call, not from its
  return: a watcher may see the change before the caller has the reply);
* **rebalance join / rebalance leave** (ms): from the call being issued to
  every member (the probe included, on a join) having a partition view
  with the new membership;
* **idle CPU** (% of one core, whole process): what the members cost while
  nothing changes, over ``--idle`` seconds.

The sides:

* **aiolocks**: ``backend.group(name).join(id)``, ``group.watch()`` and
  ``aiolocks.Partitioner(member).changes()``: one asyncio event loop, one
  backend per member (the server's change events wake the readers);
* **tooz** (threads, as it is built): ``tooz.coordination.get_coordinator``
  per member, ``join_partitioned_group`` (tooz's consistent hash ring) and
  ``watch_join_group`` / ``watch_leave_group`` callbacks. tooz's watchers
  run only when ``run_watchers()`` is called (each call lists the group), so
  every coordinator has a thread that calls it every ``--poll-ms`` ms
  (default 10); the latency floor is about half of that, and the polling is
  the idle CPU.

Rounds are interleaved (the side that goes first flips every round) and
only one side is active at a time: tooz's polling threads pause while
aiolocks runs its round (aiolocks' members are idle then anyway). It prints
one JSON line per backend and measurement: the median and p90 of each side
and the median (and range) of the per-round ratios aiolocks / tooz (ratios,
because this machine may be busy: both sides of a round see the same load).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

import aiolocks
from aiolocks.testing.servers import RedisServer, ServerNotInstalledError, ZooKeeperServer

if TYPE_CHECKING:
    from tooz.coordination import CoordinationDriver, MemberJoinedGroup, MemberLeftGroup
    from tooz.partitioner import Partitioner

__all__ = [
    "BACKENDS",
    "MEASUREMENTS",
    "AiolocksSide",
    "Awaited",
    "ToozSide",
    "Urls",
    "main",
    "measure",
]

logger = logging.getLogger(__name__)

BACKENDS = ("zookeeper", "redis")

#: every measurement of a round, in the order printed
MEASUREMENTS = (
    "join_call_ms",
    "leave_call_ms",
    "watch_join_ms",
    "watch_leave_ms",
    "rebalance_join_ms",
    "rebalance_leave_ms",
    "idle_cpu_pct",
)


@dataclass(frozen=True, slots=True)
class Urls:
    """One server's URL for aiolocks and for tooz."""

    aiolocks: str
    tooz: str


@contextlib.contextmanager
def _serve(backend: str) -> Iterator[Urls]:
    if backend == "zookeeper":
        with ZooKeeperServer() as zk:
            yield Urls(f"zk://127.0.0.1:{zk.port}", f"zookeeper://127.0.0.1:{zk.port}")
    else:
        with RedisServer() as server:
            # the keyspace events aiolocks' groups listen to, set once here (with
            # keyspace_events=auto every backend would set them, and say so)
            client = redis.Redis(host="127.0.0.1", port=server.port)
            try:
                client.config_set("notify-keyspace-events", "Kghxe")
            finally:
                client.close()
            yield Urls(
                f"redis://127.0.0.1:{server.port}/0?keyspace_events=listen",
                f"redis://127.0.0.1:{server.port}",
            )


class Awaited:
    """The moment the last of ``expected`` has seen a membership that ``wanted`` accepts.

    Thread safe: tooz calls :meth:`saw` from its coordinators' threads.
    ``on_done`` runs once, in the thread of the last :meth:`saw`.
    """

    def __init__(
        self,
        expected: Iterable[str],
        wanted: Callable[[frozenset[str]], bool],
        on_done: Callable[[], None],
    ) -> None:
        self._pending = set(expected)
        self._wanted = wanted
        self._on_done = on_done
        self._lock = threading.Lock()
        self.last = math.nan

    def saw(self, who: str, members: frozenset[str]) -> None:
        """``who`` now sees ``members``."""
        now = time.perf_counter()
        with self._lock:
            if who not in self._pending or not self._wanted(members):
                return
            self._pending.discard(who)
            if self._pending:
                return
            self.last = now
        self._on_done()


@dataclass(slots=True)
class _Board:
    """Where members and the watcher report the views they see (the round arms it)."""

    watch: Awaited | None = None
    rebalance: Awaited | None = None

    def saw(self, who: str, members: frozenset[str]) -> None:
        for awaited in (self.watch, self.rebalance):
            if awaited is not None:
                awaited.saw(who, members)


#: seconds a round waits for a change to be seen before it gives up
_TIMEOUT = 60.0


def _ms(start: float, end: float) -> float:
    return (end - start) * 1e3


class AiolocksSide:
    """``--members`` aiolocks members, a watcher and a probe over one server."""

    def __init__(self, url: str, members: int) -> None:
        self._url = url
        self._ids = [f"m-{i:03d}" for i in range(members)]
        self._group = f"bench-groups/{uuid.uuid4().hex[:8]}"
        self._board = _Board()
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._probe: aiolocks.Backend | None = None

    async def start(self) -> None:
        """Open a backend per member, the watcher's and the probe's; join; wait for views."""
        backends = [
            await self._stack.enter_async_context(aiolocks.connect(self._url)) for _ in self._ids
        ]
        watcher = await self._stack.enter_async_context(aiolocks.connect(self._url))
        self._probe = await self._stack.enter_async_context(aiolocks.connect(self._url))
        everyone = frozenset(self._ids)
        done = asyncio.Event()
        self._board.rebalance = Awaited([*self._ids, "watcher"], everyone.__eq__, done.set)
        self._tasks.append(asyncio.create_task(self._watch(watcher)))
        for member_id, backend in zip(self._ids, backends, strict=True):
            self._tasks.append(asyncio.create_task(self._member(backend, member_id)))
        await done.wait()
        self._board.rebalance = None

    async def _watch(self, backend: aiolocks.Backend) -> None:
        async for members in backend.group(self._group).watch():
            self._board.saw("watcher", frozenset(m.id for m in members))

    async def _member(
        self, backend: aiolocks.Backend, member_id: str, joined: asyncio.Future[float] | None = None
    ) -> None:
        async with backend.group(self._group).join(member_id) as member:
            if joined is not None:
                joined.set_result(time.perf_counter())
            async for view in aiolocks.Partitioner(member).changes():
                self._board.saw(member_id, frozenset(view.members))

    def _change(
        self, expected: list[str], wanted: Callable[[frozenset[str]], bool]
    ) -> tuple[Awaited, Awaited, asyncio.Event]:
        """Arm the board for one change: the watcher's and the members' awaited views."""
        watched, rebalanced, both = asyncio.Event(), asyncio.Event(), asyncio.Event()

        def seen(event: asyncio.Event) -> Callable[[], None]:
            def done() -> None:
                event.set()
                if watched.is_set() and rebalanced.is_set():
                    both.set()

            return done

        board = self._board
        board.watch = Awaited(["watcher"], wanted, seen(watched))
        board.rebalance = Awaited(expected, wanted, seen(rebalanced))
        return board.watch, board.rebalance, both

    async def round(self, number: int, idle: float) -> dict[str, float]:
        """The probe joins and leaves once; then the idle CPU."""
        assert self._probe is not None
        probe = f"probe-{number}"
        watch, rebalance, seen = self._change([*self._ids, probe], lambda ids: probe in ids)
        issued = time.perf_counter()
        joined: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._member(self._probe, probe, joined))
        self._tasks.append(task)  # stop() cancels it if this round fails
        either: list[asyncio.Future[Any]] = [joined, task]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not joined.done():
            await task  # the join failed: raise its error
        await asyncio.wait_for(seen.wait(), _TIMEOUT)
        figures = {
            "join_call_ms": _ms(issued, joined.result()),
            "watch_join_ms": _ms(issued, watch.last),
            "rebalance_join_ms": _ms(issued, rebalance.last),
        }
        watch, rebalance, seen = self._change(list(self._ids), lambda ids: probe not in ids)
        issued = time.perf_counter()
        task.cancel()  # leaves: the block's exit deletes the member record
        await asyncio.wait([task])  # (a cancellation of this round itself propagates)
        left = time.perf_counter()
        self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            await task  # the leave failed: raise its error
        await asyncio.wait_for(seen.wait(), _TIMEOUT)
        figures["leave_call_ms"] = _ms(issued, left)
        figures["watch_leave_ms"] = _ms(issued, watch.last)
        figures["rebalance_leave_ms"] = _ms(issued, rebalance.last)
        self._board.watch = self._board.rebalance = None
        cpu = time.process_time()
        await asyncio.sleep(idle)
        figures["idle_cpu_pct"] = (time.process_time() - cpu) / idle * 100
        return figures

    async def stop(self) -> None:
        """Leave (cancelling each member's block) and close every backend."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stack.aclose()


class ToozSide:
    """The same with tooz: a coordinator and a polling thread per member, watcher and probe.

    Its methods block: call them from threads (``asyncio.to_thread``).
    """

    def __init__(self, url: str, members: int, poll: float) -> None:
        self._url = url
        self._ids = [f"m-{i:03d}" for i in range(members)]
        self._group = f"bench-groups-{uuid.uuid4().hex[:8]}".encode()
        self._poll = poll
        self._board = _Board()
        self._active = threading.Event()  # the pollers call run_watchers() only while set
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._coordinators: list[CoordinationDriver] = []
        self._watched: set[str] = set()  # the watcher's member list, kept by its callbacks
        self._probe: CoordinationDriver | None = None

    def _coordinator(self, member_id: str) -> CoordinationDriver:
        from tooz import coordination  # the bench extra, imported where used

        coordinator = coordination.get_coordinator(self._url, member_id.encode())
        coordinator.start(start_heart=True)
        self._coordinators.append(coordinator)
        return coordinator

    def _poller(self, coordinator: CoordinationDriver) -> None:
        """tooz runs watch callbacks only inside ``run_watchers()``: call it every poll."""
        while not self._stopping.is_set():
            self._active.wait()
            if not self._stopping.is_set():
                try:
                    coordinator.run_watchers()
                except Exception as exc:  # a slow server: the next poll tries again
                    logger.warning("tooz run_watchers() failed: %s", exc)
            self._stopping.wait(self._poll)

    def _start_poller(self, coordinator: CoordinationDriver) -> None:
        thread = threading.Thread(target=self._poller, args=(coordinator,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _join(self, member_id: str) -> tuple[CoordinationDriver, Partitioner]:
        """Join with tooz's partitioner; report the ring's members after every change.

        Our callbacks are registered after the partitioner's, so they run
        once its ring has the change.
        """
        coordinator = self._coordinator(member_id)
        partitioner = coordinator.join_partitioned_group(self._group)

        def seen(event: MemberJoinedGroup | MemberLeftGroup) -> None:
            self._board.saw(member_id, frozenset(bytes(m).decode() for m in partitioner.ring.nodes))

        coordinator.watch_join_group(self._group, seen)
        coordinator.watch_leave_group(self._group, seen)
        return coordinator, partitioner

    def start(self) -> None:
        """Create the group, start the watcher and every member with its poller."""
        from tooz import coordination

        watcher = self._coordinator("watcher")
        with contextlib.suppress(coordination.GroupAlreadyExist):
            watcher.create_group(self._group).get()

        def joined(event: MemberJoinedGroup) -> None:
            self._watched.add(event.member_id.decode())
            self._board.saw("watcher", frozenset(self._watched))

        def left(event: MemberLeftGroup) -> None:
            self._watched.discard(event.member_id.decode())
            self._board.saw("watcher", frozenset(self._watched))

        watcher.watch_join_group(self._group, joined)
        watcher.watch_leave_group(self._group, left)
        self._start_poller(watcher)
        rings = []
        for member_id in self._ids:
            coordinator, partitioner = self._join(member_id)
            rings.append(partitioner.ring)
            self._start_poller(coordinator)
        self._probe = probe = self._coordinator("probe")
        self._start_poller(probe)
        everyone = frozenset(self._ids)
        self._active.set()
        deadline = time.monotonic() + _TIMEOUT
        while frozenset(self._watched) != everyone or any(
            frozenset(bytes(m).decode() for m in ring.nodes) != everyone for ring in rings
        ):
            if time.monotonic() > deadline:
                raise TimeoutError("tooz: the members did not all see each other")
            time.sleep(0.05)
        self._active.clear()

    def _change(
        self, expected: list[str], wanted: Callable[[frozenset[str]], bool]
    ) -> tuple[Awaited, Awaited, threading.Event]:
        watched, rebalanced, both = threading.Event(), threading.Event(), threading.Event()

        def seen(event: threading.Event) -> Callable[[], None]:
            def done() -> None:
                event.set()
                if watched.is_set() and rebalanced.is_set():
                    both.set()

            return done

        board = self._board
        board.watch = Awaited(["watcher"], wanted, seen(watched))
        board.rebalance = Awaited(expected, wanted, seen(rebalanced))
        return board.watch, board.rebalance, both

    def round(self, idle: float) -> dict[str, float]:
        """The probe joins and leaves once; then the idle CPU (the pollers run meanwhile)."""
        self._active.set()
        try:
            return self._round(idle)
        finally:
            self._active.clear()

    def _round(self, idle: float) -> dict[str, float]:
        from tooz.partitioner import Partitioner

        watch, rebalance, seen = self._change([*self._ids, "probe"], lambda ids: "probe" in ids)
        issued = time.perf_counter()
        # join_partitioned_group() in two steps, to time the join alone
        probe = self._probe
        assert probe is not None, "start() first"
        probe.join_group(self._group, capabilities={"weight": 1}).get()
        joined = time.perf_counter()
        partitioner = Partitioner(probe, self._group)
        self._board.saw("probe", frozenset(bytes(m).decode() for m in partitioner.ring.nodes))
        if not seen.wait(_TIMEOUT):
            raise TimeoutError("tooz: the probe's join was not seen")
        figures = {
            "join_call_ms": _ms(issued, joined),
            "watch_join_ms": _ms(issued, watch.last),
            "rebalance_join_ms": _ms(issued, rebalance.last),
        }
        watch, rebalance, seen = self._change(list(self._ids), lambda ids: "probe" not in ids)
        issued = time.perf_counter()
        probe.leave_partitioned_group(partitioner)
        left = time.perf_counter()
        if not seen.wait(_TIMEOUT):
            raise TimeoutError("tooz: the probe's leave was not seen")
        figures["leave_call_ms"] = _ms(issued, left)
        figures["watch_leave_ms"] = _ms(issued, watch.last)
        figures["rebalance_leave_ms"] = _ms(issued, rebalance.last)
        self._board.watch = self._board.rebalance = None
        cpu = time.process_time()
        time.sleep(idle)
        figures["idle_cpu_pct"] = (time.process_time() - cpu) / idle * 100
        return figures

    def stop(self) -> None:
        """Stop the pollers, then every coordinator (its members leave with its session)."""
        self._stopping.set()
        self._active.set()
        for thread in self._threads:
            thread.join()
        for coordinator in self._coordinators:
            with contextlib.suppress(Exception):
                coordinator.stop()


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def _rows(
    backend: str, ours: list[dict[str, float]], theirs: list[dict[str, float]]
) -> list[dict[str, object]]:
    """One row per measurement: each side's median and p90, the per-round ratios."""
    rows: list[dict[str, object]] = []
    for name in MEASUREMENTS:
        a = [r[name] for r in ours]
        t = [r[name] for r in theirs]
        ratios = [x / y for x, y in zip(a, t, strict=True) if y > 0]
        row: dict[str, object] = {
            "backend": backend,
            "measurement": name,
            "rounds": len(a),
            "aiolocks_median": round(statistics.median(a), 2),
            "aiolocks_p90": round(_p90(a), 2),
            "tooz_median": round(statistics.median(t), 2),
            "tooz_p90": round(_p90(t), 2),
        }
        if ratios:
            row["ratio"] = round(statistics.median(ratios), 3)
            row["ratio_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        rows.append(row)
    return rows


async def measure(
    urls: Urls, members: int, rounds: int, poll: float, idle: float
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Interleaved rounds, aiolocks against tooz: each side's figures per round."""
    if members < 1 or rounds < 1 or poll <= 0 or idle <= 0:
        raise ValueError(
            f"members and rounds must be >= 1 and poll and idle > 0, not {members}, "
            f"{rounds}, {poll} and {idle}"
        )
    ours = AiolocksSide(urls.aiolocks, members)
    theirs = ToozSide(urls.tooz, members, poll)
    ours_figures: list[dict[str, float]] = []
    theirs_figures: list[dict[str, float]] = []
    try:
        await ours.start()
        await asyncio.to_thread(theirs.start)
        for number in range(rounds):
            for side in ("aiolocks", "tooz") if number % 2 == 0 else ("tooz", "aiolocks"):
                if side == "aiolocks":
                    ours_figures.append(await ours.round(number, idle))
                else:
                    theirs_figures.append(await asyncio.to_thread(theirs.round, idle))
    finally:
        await asyncio.to_thread(theirs.stop)
        await ours.stop()
    return ours_figures, theirs_figures


def main(argv: list[str] | None = None) -> int:
    """Start each backend's server, measure, print one JSON line per backend and measurement."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks groups")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--members", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--poll-ms", type=float, default=10.0, help="tooz run_watchers() period")
    parser.add_argument("--idle", type=float, default=1.0, help="seconds of idle CPU per round")
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    for name in backends:
        head: dict[str, object] = {
            "backend": name,
            "members": args.members,
            "poll_ms": args.poll_ms,
        }
        try:
            with _serve(name) as urls:
                ours, theirs = asyncio.run(
                    measure(urls, args.members, args.rounds, args.poll_ms / 1e3, args.idle)
                )
        except ServerNotInstalledError as exc:
            print(json.dumps({**head, "skipped": str(exc)}), flush=True)
            continue
        for row in _rows(name, ours, theirs):
            print(json.dumps({**head, **row}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
